"""Fixtures for CPU grader tests: the fake DSL registered in parent and workers, a quick CPU policy, a store."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture
def fake_dsl(monkeypatch):
    """Registers the CPU-only `fake` DSL for this test (the worker finds it through PYTHONPATH)."""
    from mkb.dsl import _registry
    from mkb.grader._backends import backend_from_target

    monkeypatch.setitem(_registry.BACKENDS, "fake", "fake_dsl:FakeBackend")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    backend_from_target.cache_clear()
    yield "fake"
    backend_from_target.cache_clear()


@pytest.fixture
def fake_dsl_runtime(monkeypatch):
    """The fake DSL with no static rules, for tests of what the runtime guards catch on their own."""
    from mkb.dsl import _registry
    from mkb.grader._backends import backend_from_target

    monkeypatch.setitem(_registry.BACKENDS, "fake_rt", "fake_dsl:FakeBackendNoStatic")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    backend_from_target.cache_clear()
    yield "fake_rt"
    backend_from_target.cache_clear()


@pytest.fixture
def cpu_config():
    from mkb.grader import GraderConfig

    return GraderConfig.quick(device="cpu", size="smoke", wall_limit_s=60, compile_limit_s=30, start_limit_s=60)


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "events")


@pytest.fixture
def grader_bench(tmp_path, fake_dsl, monkeypatch, repo_script):
    """benchmarks/grader_bench.py as a module whose every baseline (and memory-bound one) is one fake-DSL copy of
    problem 28's torch baseline: the GPU run's code path on the CPU."""
    from types import SimpleNamespace

    import mkb.problems
    from fake_dsl import TORCH_BASELINE_28

    bench = repo_script("benchmarks/grader_bench.py")
    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    base = [SimpleNamespace(problem=28, dsl=fake_dsl, path=good)]
    monkeypatch.setattr(mkb.problems, "baselines", lambda problems=None, dsls=None: base)
    monkeypatch.setattr(bench, "memory_bound_baselines", lambda dsls=None: base)
    return bench
