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


def test_the_holds_nvrtc_build_before_go_is_a_step_of_its_own_and_off_the_gpu_nothing(monkeypatch) -> None:
    """Grader 2.11: the worker builds the hold's cubin before `imported` for the capability NVML reports; its seconds
    are a step of their own (not under the quiet rule), listed first."""
    built: list = []
    monkeypatch.setattr(_harness, "_WARM", {})
    monkeypatch.setattr(_harness, "_capability", lambda index: built.append(("nvml", index)) or (9, 0))
    monkeypatch.setattr(_harness, "build_hold_binary", lambda cap: built.append(("build", cap)))
    _harness.build_hold_before_go("cpu")
    assert built == [] and _harness.warm_start_steps() is None
    _harness.build_hold_before_go("cuda")
    assert built == [("nvml", 0), ("build", (9, 0))]
    _harness.build_hold_before_go("cuda")  # once per process
    assert len(built) == 2
    before_go = dict(_harness._WARM)
    ran = _fake_cuda_without_a_hold(monkeypatch, None)  # a fresh _WARM: the build before go put back in it
    monkeypatch.setattr(_harness, "_WARM", before_go)
    monkeypatch.setattr(_harness, "sm_hold", lambda: ran.append("hold"))
    _harness.warm_start("cuda")
    assert list(_harness.warm_start_steps()) == ["hold_nvrtc_before_go", "cuda_context_and_profiler_init", "sm_clock",
                                                 "hold_compile", "first_use"]


@pytest.mark.parametrize("nvml", ["none", "raises"])
def test_a_build_before_go_without_a_capability_builds_nothing_and_never_raises(monkeypatch, nvml) -> None:
    def lookup(index):
        if nvml == "raises":
            raise RuntimeError("a bug in the lookup")
        return None

    built: list = []
    monkeypatch.setattr(_harness, "_WARM", {})
    monkeypatch.setattr(_harness, "_capability", lookup)
    monkeypatch.setattr(_harness, "build_hold_binary", lambda cap: built.append(cap))
    _harness.build_hold_before_go("cuda:0")
    assert built == [] and "hold_nvrtc_before_go_s" in _harness._WARM


def _fake_nvrtc(monkeypatch, log: list, *, fail: bool = False) -> None:
    import torch

    class Kernel:
        def __call__(self, grid=(1, 1, 1), block=(1, 1, 1), args=None, shared_mem=0, stream=None) -> None:
            log.append("launch")

    def nvrtc(src, name, *a, **k):
        log.append(("nvrtc", k.get("compute_capability")))
        if fail:
            raise RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.13.0")
        return b"cubin", name

    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", nvrtc)
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module",
                        lambda binary, names=None: log.append("load") or {n: Kernel() for n in names})


@pytest.mark.parametrize("capability, build", [((9, 0), "prebuilt"),
                                               ((10, 0), "compiled (built early for sm_100, the device is sm_90)"),
                                               (None, "compiled (no early build); neither NVML nor nvidia-smi gave a compute capability")])
def test_the_warm_start_loads_the_hold_built_before_go_where_it_fits_the_device(monkeypatch, capability, build) -> None:
    """The whole path on fakes: NVML's capability -> the early cubin -> the warm start loads it (no compile) and the
    verdict's figures say so (`hold_build`); a cubin for another capability is not loaded, the hold compiles as 2.10."""
    from types import SimpleNamespace

    import torch

    import mkb.measure._timing as T

    log: list = []
    ran = _fake_cuda_without_a_hold(monkeypatch, lambda src, name, *a, **k: log.append("compile") or (lambda **kw: None))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(
        multi_processor_count=132, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32,
        major=9, minor=0))
    monkeypatch.setattr(T, "_EARLY_HOLDS", {})
    monkeypatch.setattr(T, "_current_stream", lambda d=None: "stream")
    monkeypatch.setattr(T, "_sync", lambda d=None: None)
    monkeypatch.setattr(_harness, "_capability", lambda index: capability)
    _fake_nvrtc(monkeypatch, log)
    _harness.build_hold_before_go("cuda")
    assert log == ([("nvrtc", f"{capability[0]}{capability[1]}")] if capability else [])
    _harness.warm_start("cuda")
    assert ran == ["streams", "clock", "first_use"]
    assert log[1 if capability else 0:] == (["load", "launch"] if build == "prebuilt" else ["compile"])
    assert _harness._WARM["hold_build"] == build
    assert T._HOLDS["cuda:0"].build == build.split(";")[0]  # the hold says its path; the figure adds why NVML gave none


def _run_worker_until_go(monkeypatch, device: str) -> list[dict]:
    """The worker's main in this process up to its `go`: the parent closes the job pipe at once, so after `imported` the
    worker reports start_failed and exits (os._exit, raised here as SystemExit). Returns what it sent."""
    from mkb.grader import _worker
    from mkb.grader._protocol import LineReader

    job_r, job_w = os.pipe()
    res_r, res_w = os.pipe()
    os.close(job_w)
    monkeypatch.setattr(os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    try:
        with pytest.raises(SystemExit):
            _worker.main(["--job-fd", str(job_r), "--result-fd", str(res_w), "--dsl", "fake", "--device", device,
                          "--backend", "fake_dsl:FakeBackend"])
    finally:
        os.close(res_w)
        os.close(job_r)
    reader, msgs = LineReader(res_r), []
    import time

    while (m := reader.read(time.monotonic() + 5)) not in ("eof", "timeout", None):
        msgs.append(m)
    os.close(res_r)
    return msgs


@pytest.mark.parametrize("failure", ["nvrtc", "nvml", "build"])
def test_a_worker_whose_early_hold_build_fails_still_sends_imported(monkeypatch, failure) -> None:
    import mkb.measure._timing as T

    log: list = []
    monkeypatch.setattr(_harness, "_WARM", {})
    monkeypatch.setattr(T, "_EARLY_HOLDS", {})
    _fake_nvrtc(monkeypatch, log, fail=failure == "nvrtc")

    def nvml(index):
        if failure == "nvml":
            raise RuntimeError("NVML: driver not loaded")
        return 9, 0

    def build(cap):
        raise AssertionError("a bug in the build")

    monkeypatch.setattr(_harness, "_capability", nvml)
    if failure == "build":
        monkeypatch.setattr(_harness, "build_hold_binary", build)
    msgs = _run_worker_until_go(monkeypatch, "cuda")
    assert [m["type"] for m in msgs] == ["imported", "start_failed"]  # failed only at go: the parent is gone
    assert "the parent closed the job pipe" in msgs[1]["what"]
    assert log == ([("nvrtc", "90")] if failure == "nvrtc" else [])
    assert "hold_nvrtc_before_go_s" in _harness._WARM
    if failure == "nvrtc":
        assert T._EARLY_HOLDS[(9, 0)].startswith("the early build failed: RuntimeError: nvrtc")


def test_a_cpu_worker_builds_no_hold_before_imported(monkeypatch) -> None:
    monkeypatch.setattr(_harness, "_WARM", {})
    monkeypatch.setattr(_harness, "_capability", lambda index: pytest.fail("a cpu worker looked up a capability"))
    msgs = _run_worker_until_go(monkeypatch, "cpu")
    assert [m["type"] for m in msgs] == ["imported", "start_failed"]
    assert "hold_nvrtc_before_go_s" not in _harness._WARM
