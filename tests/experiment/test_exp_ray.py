"""The Ray executor on a local Ray cluster (head + worker nodes): same coordinates as the local executor, replay grader actor."""

from __future__ import annotations

import json

import polars as pl
import pytest

from mkb.events import read
from mkb.experiment import build_plan
from mkb.experiment._fake import FakeRunner, demo_config
from mkb.experiment._state import read_state

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=2)
    c.add_node(num_cpus=1, num_gpus=1)  # a logical GPU: the replay grader actor needs none
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def test_ray_executor_with_replay_grader(cluster, tmp_path):
    from mkb.experiment._ray import RayExecutor

    store = str(tmp_path / "s")
    plan = build_plan(demo_config("ray", arms=("solo", "transfer")))
    ex = RayExecutor(plan, store=store, grader_spec="replay:events/replay-demo", runner=FakeRunner(baseline=True),
                     versions={"v": 1}, poll_s=0.2, ttl_s=10.0)
    assert len(ex.actors) == 1  # one grader actor per GPU of the cluster
    try:
        rep = ex.run()
    finally:
        ex.close()
    assert rep.complete and rep.done == 16 and rep.pair_batches == 4, rep.lines()
    st = read_state(store, plan.config.name)
    assert all(st.coord(c.key).scored is not None for c in plan.coordinates)
    claims = read("claim", store).filter(pl.col("action") == "claimed")
    assert set(claims["coordinate"]) == {c.key for c in plan.coordinates} and claims.height == 16
    assert claims["holder"].n_unique() >= 2  # attempts ran in more than one worker process
    v = read("verdict", store)
    assert v.height == 32 and set(v["scope"]) == {"submission", "pair"}
    assert all(json.loads(d)["grader"] == "replay" for d in v["details"])
    assert set(read("attempt_started", store)["grader_version"]) == {ex.grader.version}
