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


def _fake_cuda_without_a_hold(monkeypatch, compile_kernel) -> list:
    """A 'cuda' worker whose profiler and clock warm steps succeed and whose NVRTC does what `compile_kernel` does."""
    from types import SimpleNamespace

    import torch

    import mkb.measure._timing as T

    ran: list = []
    monkeypatch.setattr(_harness, "_WARM", {})
    monkeypatch.setattr(_harness._Device, "harness_streams", lambda self: ran.append("streams") or ("harness",))
    monkeypatch.setattr(_harness, "SmClock", lambda *a: ran.append("clock") or SimpleNamespace(max_mhz=1980.0))
    monkeypatch.setattr(_harness, "_first_use", lambda: ran.append("first_use"))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(
        multi_processor_count=132, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    if compile_kernel is None:
        monkeypatch.delattr(torch.cuda, "_compile_kernel", raising=False)
    else:
        monkeypatch.setattr(torch.cuda, "_compile_kernel", compile_kernel, raising=False)
    monkeypatch.setattr(T, "_device_ctx", lambda index: __import__("contextlib").nullcontext())
    monkeypatch.setattr(T, "_HOLDS", {})
    return ran


@pytest.mark.parametrize("nvrtc", ["broken", "absent"])
def test_a_worker_whose_nvrtc_cannot_build_the_sm_hold_fails_its_warm_start_naming_the_step(monkeypatch, nvrtc) -> None:
    """Timing policy v4's hold is a raw NVRTC kernel: without it the worker does not start (never a window with
    no hold, which would let side-stream work run ahead of it), and the operator reads which step broke."""
    import mkb.measure._timing as T

    def broken(src, name, *a, **k):
        raise RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.13.0\nmore lines")

    ran = _fake_cuda_without_a_hold(monkeypatch, broken if nvrtc == "broken" else None)
    with pytest.raises(_harness.WarmStartError) as e:
        _harness.warm_start("cuda")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("the grader worker's warm start failed at building the timing window's SM hold (a raw kernel "
                          "compiled by NVRTC, torch.cuda._compile_kernel): RuntimeError: ")
    assert ("nvrtc: error: failed to open libnvrtc-builtins" if nvrtc == "broken" else "no torch.cuda._compile_kernel") in msg
    assert "hint: check that torch can compile and launch an NVRTC kernel here" in msg
    assert ran == ["streams", "clock"]  # nothing after the hold's step ran: the worker stops there
    assert not T._HOLDS and "hold_compile_s" not in _harness._WARM


def test_a_warm_start_records_each_of_its_steps_for_the_verdict(monkeypatch) -> None:
    """Grader 2.10: the warm-up a spare holds the device for is attributed to its steps (CompileFigures.warm_start_s)."""
    ran = _fake_cuda_without_a_hold(monkeypatch, None)
    monkeypatch.setattr(_harness, "sm_hold", lambda: ran.append("hold"))
    assert _harness.warm_start_steps() is None  # off the GPU, or before the warm start: nothing to report
    _harness.warm_start("cuda")
    assert ran == ["streams", "clock", "hold", "first_use"]
    steps = _harness.warm_start_steps()
    assert list(steps) == ["cuda_context_and_profiler_init", "sm_clock", "hold_compile", "first_use"]
    assert all(isinstance(v, float) and v >= 0 for v in steps.values())


def test_the_bench_takes_the_median_of_each_warm_start_step_over_the_workers_that_report_them() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import grader_bench

    rows = [{"warm_start_s": {"profiler_init": 0.2, "first_use": 0.1}}, {"warm_start_s": {"profiler_init": 0.6}},
            {"warm_start_s": None}, {"warm_start_s": {"profiler_init": 0.3, "first_use": 0.3}}]
    t = grader_bench.warm_start_table(rows)
    assert t["n"] == 3 and t["median_s"] == {"profiler_init": 0.3, "first_use": 0.1}  # a missing step counts 0
