"""Red-team hacks graded on the CPU (fake DSL, torch baseline): the runtime defences that need no GPU.

Plain forms stop at the static rules; obfuscated forms and hacks the static rules cannot see must be
stopped by the worker's guards with the expected reason. Hacks whose defence is the profiler, the
stream check or CUDA's allocator (`cpu=False`) run only in the GPU suite.
"""

from __future__ import annotations

import pytest

import redteam_hacks as R
from fake_dsl import TORCH_BASELINE_28, torch_baseline_25
from mkb.grader import GraderConfig, WorkerPool, grade


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    import os

    from mkb.dsl import _registry
    from mkb.grader._backends import backend_from_target

    mp = pytest.MonkeyPatch()
    here = os.path.dirname(os.path.abspath(__file__))
    gdir = os.path.join(os.path.dirname(here), "grader")
    mp.setitem(_registry.BACKENDS, "fake", "fake_dsl:FakeBackend")
    mp.setenv("PYTHONPATH", os.pathsep.join([gdir, os.environ.get("PYTHONPATH", "")]))
    backend_from_target.cache_clear()
    root = tmp_path_factory.mktemp("redteam")
    paths = R.write_all(root, "fake", TORCH_BASELINE_28, baselines={25: torch_baseline_25()})
    cfg = GraderConfig.quick(device="cpu", size="smoke", wall_limit_s=60, compile_limit_s=30, start_limit_s=60)
    with WorkerPool(("fake",), device="cpu") as pool:
        yield paths, cfg, pool, str(root / "events")
    mp.undo()
    backend_from_target.cache_clear()


@pytest.mark.parametrize("control, problem", [("control", R.PROBLEM), ("control_25", 25)])
def test_control_passes(env, control, problem):
    paths, cfg, pool, store = env
    v = grade(problem, "fake", paths[control], store=store, config=cfg, pool=pool)
    assert v.passed, v.message


@pytest.mark.parametrize("hack", [h for h in R.HACKS if h.cpu or h.static], ids=lambda h: h.name)
def test_hack_is_rejected_with_its_reason(env, hack):
    paths, cfg, pool, store = env
    assert hack.name in paths, f"problem {hack.problem}'s baseline does not take `solve({hack.signature})`: {hack.name} is never graded"
    v = grade(hack.problem, "fake", paths[hack.name], store=store, config=cfg, pool=pool)
    assert not v.passed
    if hack.static:
        assert v.reason == f"static_{hack.static}"
    else:
        assert v.reason in hack.runtime, v.message


@pytest.mark.parametrize("hack", [h for h in R.HACKS if h.cpu and not h.static], ids=lambda h: h.name)
def test_hack_is_rejected_with_sampled_expectations(env, hack):
    """Grader 2.3 keeps 34's, 38's and 50's expectations sampled at full size: every runtime form is still rejected
    with its reason when problem 28's output is compared at 64 secret positions (a static form never reaches it)."""
    paths, cfg, pool, store = env
    assert hack.name in paths, f"problem {hack.problem}'s baseline does not take `solve({hack.signature})`: {hack.name} is never graded"
    sampled = GraderConfig.from_dict({**cfg.as_dict(), "expectations": "sampled", "sample_positions": 64})
    v = grade(hack.problem, "fake", paths[hack.name], store=store, config=sampled, pool=pool)
    assert not v.passed
    assert v.reason in hack.runtime, v.message


def test_control_passes_with_sampled_expectations(env):
    paths, cfg, pool, store = env
    sampled = GraderConfig.from_dict({**cfg.as_dict(), "expectations": "sampled", "sample_positions": 64})
    v = grade(R.PROBLEM, "fake", paths["control"], store=store, config=sampled, pool=pool)
    assert v.passed, v.message
    assert v.stage("verification").typed.sampled_positions == {"y": 64}
