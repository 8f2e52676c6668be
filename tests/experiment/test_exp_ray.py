"""The Ray executor on a local Ray cluster (head + worker nodes): same coordinates as the local executor, replay grader actor."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import polars as pl
import pytest

from mkb.agent._pace import PacingUnavailable, limiter_for
from mkb.events import read
from mkb.experiment import build_plan
from mkb.experiment._fake import FakeRunner, demo_config
from mkb.experiment._ray_pace import RayLimiter, ray_limiters, start_pacers
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


@pytest.fixture(autouse=True)
def _own_limiters(monkeypatch):
    """A Ray executor installs cluster limiters in this process too; they must not outlive the test (or the cluster)."""
    monkeypatch.setattr("mkb.agent._pace._LIMITERS", {})


def test_ray_executor_with_replay_grader(cluster, tmp_path):
    from mkb.experiment._ray import RayExecutor

    store = str(tmp_path / "s")
    cfg = demo_config("ray", arms=("solo", "transfer"))
    plan = build_plan(replace(cfg, models=(replace(cfg.models[0], rpm=600),)))
    ex = RayExecutor(plan, store=store, grader_spec="replay:events/replay-demo", runner=FakeRunner(baseline=True),
                     versions={"v": 1}, poll_s=0.2, ttl_s=10.0)
    assert len(ex.actors) == 1  # one grader actor per GPU of the cluster
    m = plan.config.models[0].config
    assert list(ex.pacers) == [(m.name, m.api_base)]  # one pacing actor for the cluster, handed to every attempt task
    assert isinstance(limiter_for(m.name, m.api_base), RayLimiter)
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


def test_two_worker_processes_share_one_rate_limit(cluster):
    """Helpers are local so that Ray ships them by value (the test module is not importable in a worker)."""

    class Gate:  # holds both workers until each has arrived, so that their requests contend at the same time
        def __init__(self, n: int) -> None:
            self.n, self.arrived = n, 0

        def arrive(self) -> None:
            self.arrived += 1

        def open(self) -> bool:
            return self.arrived >= self.n

    def paced_requests(limiter: RayLimiter, gate, n: int) -> tuple[int, list[tuple[float, float]]]:
        """One worker process's attempt, reduced to its requests: (pid, [(slot on the actor's clock, when it was sent)])."""
        ray.get(gate.arrive.remote())
        deadline = time.monotonic() + 60
        while not ray.get(gate.open.remote()):
            assert time.monotonic() < deadline, "the other worker never arrived"
            time.sleep(0.01)
        out = []
        for _ in range(n):
            r, _ = limiter.acquire(1)
            out.append((r.t, time.monotonic()))  # one host: the actor's and the workers' monotonic clocks are one clock
        return os.getpid(), out

    m = replace(demo_config("pace-shared").models[0], rpm=3)
    window = 0.5
    exp = f"pace-shared-{os.getpid()}"
    pacers = start_pacers(exp, [m], window_s=window)
    (key, lim), = ray_limiters(pacers, exp).items()
    gate = ray.remote(num_cpus=0)(Gate).remote(2)
    task = ray.remote(num_cpus=1, max_retries=0)(paced_requests)
    results = ray.get([task.remote(lim, gate, 6) for _ in range(2)], timeout=120)
    assert results[0][0] != results[1][0]  # two processes, one book
    reqs = sorted(r for _, rs in results for r in rs)
    slots = [s for s, _ in reqs]
    assert len(slots) == 12
    for s in slots:  # a book per process would admit 3 per window in each of them: 6
        assert sum(1 for t in slots if t <= s < t + window) <= 3, slots
    assert slots[-1] - slots[0] >= 3 * window - 1e-9  # 12 requests at 3 per window span at least four windows
    assert all(sent >= slot for slot, sent in reqs)  # nobody sends before its slot
    ray.kill(gate)
    ray.kill(pacers[key])


def _wait_dead(handle, limit_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=2)
        except Exception:  # noqa: BLE001 - the actor is gone
            return
        time.sleep(0.05)
    raise AssertionError(f"the killed actor still answered after {limit_s:.0f} s")


def test_a_dead_pacing_actor_fails_the_request_in_one_line_and_stops_the_run(cluster, tmp_path):
    from mkb.experiment._ray import RayExecutor

    def pacing_gone(spec, n):  # the attempt's first request, as the agent makes it: the limiter's failure is an infra_error
        try:
            limiter_for(spec.model.name, spec.model.api_base).acquire(10)
        except PacingUnavailable:
            return True
        return False

    cfg = demo_config("pace-dead", arms=("solo",))
    plan = build_plan(replace(cfg, models=(replace(cfg.models[0], tpm=100_000),)))
    store = str(tmp_path / "s")
    ex = RayExecutor(plan, store=store, grader_spec="replay:events/replay-demo", n_graders=1, gpus_per_grader=0.0,
                     runner=FakeRunner(infra=pacing_gone), versions={"v": 1}, poll_s=0.2, ttl_s=10.0)
    try:
        (key, h), = ex.pacers.items()
        lim = limiter_for(*key)
        lim.acquire(10)
        ray.kill(h, no_restart=True)
        _wait_dead(h)  # ray.kill is asynchronous: a call sent at once may still be answered
        with pytest.raises(PacingUnavailable) as e:
            lim.acquire(10)
        first, hint = str(e.value).split("\n")
        assert first.startswith(f"model {key[0]}: the cluster's rate limiter") and hint.startswith("hint: ")
        with pytest.raises(PacingUnavailable, match="is gone"):
            ex.run()  # the first attempt's infra_error stops the run: no arm is retried into exclusion
    finally:
        ex.close()
    claims = read("claim", store)
    assert "excluded" not in set(claims["action"])
    assert set(read("attempt_finished", store)["status"]) == {"infra_error"}
