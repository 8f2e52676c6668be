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
