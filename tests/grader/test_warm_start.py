"""A worker that cannot start says why in one line that names the step (the operator's problem, never a candidate's)."""

from __future__ import annotations

import os

import pytest

from mkb.grader import _harness
from mkb.grader._pool import Worker

HERE = os.path.dirname(__file__)


def test_a_failing_warm_step_is_named_in_one_line_with_a_hint() -> None:
    def build() -> None:
        raise RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.13.0\nmore lines")

    with pytest.raises(_harness.WarmStartError) as e:
        _harness._warm_step("building the timing window's SM hold", "check NVRTC", build)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("the grader worker's warm start failed at building the timing window's SM hold: RuntimeError: nvrtc")
    assert msg.endswith("hint: check NVRTC")
    assert isinstance(e.value.__cause__, RuntimeError)


def test_a_worker_that_cannot_import_its_toolchain_names_it_first(monkeypatch) -> None:
    from mkb.dsl import _registry
    from mkb.grader._backends import backend_from_target

    monkeypatch.setitem(_registry.BACKENDS, "broken", "fake_dsl:FakeBackendBrokenToolchain")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    backend_from_target.cache_clear()
    w = Worker("broken", device="cpu")
    try:
        assert not w.wait_ready(60)
        first = w.ready_error.splitlines()[0]
        assert first == "ModuleNotFoundError: No module named 'mkb_no_such_toolchain_module'", w.ready_error
        assert "Traceback" in w.ready_error  # the whole traceback is kept below the line
    finally:
        w.kill()
        w.cleanup()
        backend_from_target.cache_clear()
