"""The whole red-team suite through the grader on a GPU with both DSLs: every hack rejected with its reason, controls pass."""

from __future__ import annotations

import importlib.util

import pytest

import redteam_hacks as R

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu, pytest.mark.dsl,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("cutlass") is None or importlib.util.find_spec("tvm") is None,
                       reason="needs the CuTe DSL and TIRx packages"),
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    from mkb.grader import GraderConfig, WorkerPool

    root = tmp_path_factory.mktemp("redteam-gpu")
    paths = {dsl: R.write_all(root, dsl) for dsl in R.DSLS}
    with WorkerPool(R.DSLS, device="cuda") as pool:
        yield paths, GraderConfig(n_timed=50), pool, str(root / "events")


@pytest.mark.parametrize("dsl", R.DSLS)
@pytest.mark.parametrize("problem", sorted({R.PROBLEM} | {h.problem for h in R.HACKS}))
def test_control_passes(suite, dsl, problem):
    from mkb.grader import grade

    paths, cfg, pool, store = suite
    name = "control" if problem == R.PROBLEM else f"control_{problem}"
    if name not in paths[dsl]:
        pytest.skip(f"no {dsl} baseline of problem {problem} that the red-team forms fit")
    v = grade(problem, dsl, paths[dsl][name], store=store, config=cfg, pool=pool)
    assert v.passed, v.message


@pytest.mark.parametrize("dsl", R.DSLS)
@pytest.mark.parametrize("hack", R.HACKS, ids=lambda h: h.name)
def test_hack_is_rejected(suite, dsl, hack):
    from mkb.grader import grade

    paths, cfg, pool, store = suite
    if hack.name not in paths[dsl]:
        pytest.skip(f"the {dsl} baseline of problem {hack.problem} does not take `solve({hack.signature})`")
    v = grade(hack.problem, dsl, paths[dsl][hack.name], store=store, config=cfg, pool=pool)
    assert not v.passed
    if hack.static:
        assert v.reason == f"static_{hack.static}"
    else:
        assert v.reason in hack.runtime, v.message
