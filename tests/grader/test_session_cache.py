"""The session cache of eager timings, upstream reference timings and launch floors: reused within a pool, never across keys."""

from __future__ import annotations

from fake_dsl import TORCH_BASELINE_28
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


def test_no_key_when_the_worker_did_not_say_what_ran_where():
    assert trusted_key("eager", problem=28, problem_hash="a" * 64, ready={"gpu": "x"}, cfg=GraderConfig(), grader_version="1") is None
    assert _key(sha="unknown") is None
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
