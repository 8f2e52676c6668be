"""The session cache of eager timings, upstream reference timings and launch floors: reused within a pool, never across keys."""

from __future__ import annotations

import pytest

from fake_dsl import TORCH_BASELINE_28, torch_baseline_25
from mkb.grader import GraderConfig, WorkerPool, grade
from mkb.grader._session import TrustedCache, trusted_key


def _key(what="eager", problem=28, sha="a" * 64, gpu="NVIDIA H200", torch_v="2.11.0", **cfg):
    c = GraderConfig(**cfg)
    return trusted_key(what, problem=problem, problem_hash=sha, ready={"gpu": gpu, "torch": torch_v}, cfg=c, grader_version="1.0")


def test_keys_differ_by_problem_source_gpu_version_and_policy():
    base = _key()
    assert base == _key()
    for other in (_key(problem=29), _key(sha="b" * 64), _key(gpu="NVIDIA H100"), _key(torch_v="2.12.0"),
                  _key(n_timed=200), _key(size="smoke"), _key(what="floor:cute")):
        assert other != base


def test_floor_keys_hold_the_dsl_gpu_and_versions_but_no_problem_or_config():
    # the empty call's windows read nothing of the problem or the config (mkb.grader._session): one key per DSL
    base = _key(what="floor:cute")
    for same in (_key(what="floor:cute", problem=72), _key(what="floor:cute", sha="b" * 64),
                 _key(what="floor:cute", sha="unknown"), _key(what="floor:cute", size="smoke"),
                 _key(what="floor:cute", n_timed=200), _key(what="floor:cute", n_warmup=7)):
        assert same == base
    assert base.problem == 0 and base.problem_hash == "*"
    for other in (_key(what="floor:tirx"), _key(what="floor:cute", gpu="NVIDIA H100"),
                  _key(what="floor:cute", torch_v="2.12.0"), _key(what="eager"), _key(what="reference")):
        assert other != base
    assert trusted_key("floor:cute", problem=28, problem_hash="a" * 64, ready={"gpu": "NVIDIA H200", "torch": "2.11.0"},
                       cfg=GraderConfig(), grader_version="1.1") != base
    assert trusted_key("floor:cute", problem=28, problem_hash="a" * 64, ready={"gpu": "NVIDIA H200", "torch": "2.11.0",
                       "visible_devices": "3"}, cfg=GraderConfig(), grader_version="1.0") != base
    # the problem-keyed figures still differ by problem
    assert _key(what="eager", problem=72) != _key(what="eager") and _key(what="reference", sha="b" * 64) != _key(what="reference")


def test_no_key_when_the_worker_did_not_say_what_ran_where():
    assert trusted_key("eager", problem=28, problem_hash="a" * 64, ready={"gpu": "x"}, cfg=GraderConfig(), grader_version="1") is None
    assert _key(sha="unknown") is None and _key(what="reference", sha="unknown") is None
    assert trusted_key("floor:cute", problem=28, problem_hash="a" * 64, ready={"gpu": "x"}, cfg=GraderConfig(), grader_version="1") is None
    cache = TrustedCache()
    cache.put(None, {"median_us": 1.0})
    assert cache.get(None) is None and len(cache) == 0


def test_entries_expire():
    cache = TrustedCache(max_age_s=0.0)
    cache.put(_key(), {"median_us": 1.0})
    assert cache.get(_key()) is None


def test_second_grading_in_a_pool_reuses_the_eager_timing(tmp_path, fake_dsl, cpu_config, store):
    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    with WorkerPool((fake_dsl,), device="cpu") as pool:
        v1 = grade(28, fake_dsl, k, store=store, config=cpu_config, pool=pool)
        v2 = grade(28, fake_dsl, k, store=store, config=cpu_config, pool=pool)
        assert len(pool.trusted) == 3  # eager, reference (upstream's baseline timing), floor:fake
    assert v1.passed and v2.passed, (v1.message, v2.message)
    t1, t2 = v1.stage("timing").figures, v2.stage("timing").figures
    assert t1["eager_cached"] is False and t2["eager_cached"] is True
    assert t2["eager_median_us"] == t1["eager_median_us"]
    assert t1["reference_cached"] is False and t2["reference_cached"] is True
    assert t2["reference_median_us"] == t1["reference_median_us"] and v2.reference_median_us == v1.reference_median_us
    assert "eager_timing" in v1.stage("compile").figures["trusted_phases_s"]
    assert "eager_timing" not in v2.stage("compile").figures["trusted_phases_s"]


def test_without_a_pool_nothing_is_cached(tmp_path, fake_dsl, cpu_config, store):
    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    v = grade(28, fake_dsl, k, store=store, config=cpu_config)
    assert v.passed and v.stage("timing").figures["eager_cached"] is False


def test_launch_floors_are_measured_once_per_dsl_across_problems(tmp_path, fake_dsl, cpu_config, store):
    k28, k25 = tmp_path / "k28.py", tmp_path / "k25.py"
    k28.write_text(TORCH_BASELINE_28)
    k25.write_text(torch_baseline_25())
    with WorkerPool((fake_dsl,), device="cpu") as pool:
        v1 = grade(28, fake_dsl, k28, store=store, config=cpu_config, pool=pool)
        v2 = grade(25, fake_dsl, k25, store=store, config=cpu_config, pool=pool)
        whats = sorted((key.what, key.problem) for key, _ in pool.trusted.entries())
    assert v1.passed and v2.passed, (v1.message, v2.message)
    # eager and reference per problem, one floor for the DSL
    assert whats == sorted([("eager", 28), ("reference", 28), ("eager", 25), ("reference", 25), (f"floor:{fake_dsl}", 0)])
    p1, p2 = v1.stage("compile").figures["trusted_phases_s"], v2.stage("compile").figures["trusted_phases_s"]
    assert "floors" in p1 and "floors" not in p2
    assert "eager_timing" in p2  # the second problem's own eager timing is still measured
    t1, t2 = v1.stage("timing").figures, v2.stage("timing").figures
    assert t2["window_floor_us"] == t1["window_floor_us"]


def test_the_eager_key_names_how_its_sets_were_placed():
    """An eager timed with another first pass (an A/B arm) is another figure: never read from the other's cache entry."""
    from mkb.grader import GraderConfig
    from mkb.grader._session import trusted_key

    ready = {"gpu": "NVIDIA H200", "torch": "2.11.0"}
    k = lambda cfg, what="eager": trusted_key(what, problem=25, problem_hash="h", ready=ready, cfg=cfg, grader_version="x")  # noqa: E731
    assert k(GraderConfig()) != k(GraderConfig(set_first_pass="make"))
    assert k(GraderConfig(), "floor:cute") == k(GraderConfig(set_first_pass="make"), "floor:cute")
    with pytest.raises(ValueError, match="set_first_pass"):
        GraderConfig(set_first_pass="twice")
    assert GraderConfig(set_first_pass="none").first_pass is None and GraderConfig().first_pass == "allocate"


def test_the_configs_first_passes_are_inputstreams():
    from mkb.grader._config import SET_FIRST_PASSES
    from mkb.measure import FIRST_PASSES

    assert [GraderConfig(set_first_pass=x).first_pass for x in SET_FIRST_PASSES] == list(FIRST_PASSES)
