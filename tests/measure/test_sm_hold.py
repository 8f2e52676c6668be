"""The timing window's SM hold (timing policy v4): a raw NVRTC kernel whose grid fills every thread slot and that
spins a fixed cycle count touching no memory. Its launch geometry, cycle count and launches are checked on the CPU
against a fake device; the gpu-marked tests check residency and duration on a real one."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import mkb.measure._timing as T
from mkb.measure import HOLD_US, TIMING_POLICY, SmHold, hold_cycles, hold_launch, sm_hold

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gpu_sm_hold_check as check_script  # noqa: E402

_REAL_COMPILE_KERNEL = getattr(torch.cuda, "_compile_kernel", None)  # before any fixture replaces it
_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.mark.parametrize("sms, per_sm, max_block, expect", [
    (132, 2048, 1024, (264, 1024)),  # H200 / H100 SXM
    (108, 2048, 1024, (216, 1024)),  # A100
    (84, 1536, 1024, (168, 768)),  # sm_86: 1536 slots, a block may not have 1536 threads
    (16, 1024, 1024, (16, 1024)),  # sm_75
    (4, 2048, 512, (16, 512)),  # a device whose blocks are capped lower
])
def test_the_hold_grid_is_the_devices_resident_thread_capacity_in_whole_blocks(sms, per_sm, max_block, expect):
    grid, block = hold_launch(sms, per_sm, max_block)
    assert (grid, block) == expect
    assert grid * block == sms * per_sm  # every thread slot of every SM, no more (one wave)
    assert block % 32 == 0 and block <= max_block and per_sm % block == 0  # blocks never straddle an SM's slots


def test_every_warp_multiple_slot_count_gets_the_largest_dividing_block():
    for per_sm in range(32, 4097, 32):
        grid, block = hold_launch(7, per_sm, 1024)
        assert grid * block == 7 * per_sm and per_sm % block == 0 and block % 32 == 0 and block <= 1024
        assert not any(per_sm % b == 0 for b in range(block + 32, min(1024, per_sm) + 1, 32))


@pytest.mark.parametrize("sms, per_sm", [(0, 2048), (132, 0), (132, 2000), (132, 16)])
def test_a_device_whose_slots_cannot_be_filled_with_whole_warps_is_named(sms, per_sm):
    with pytest.raises(ValueError, match=f"cannot fill {sms} SMs of {per_sm} thread slots"):
        hold_launch(sms, per_sm)


def test_cycles_come_from_the_sms_maximum_clock_with_no_per_process_calibration():
    assert hold_cycles(HOLD_US, 1980.0) == 1_980_000  # 1 ms at the H200's 1980 MHz
    assert hold_cycles(150.0, 1980.0) == 297_000
    assert hold_cycles(2000.0, 1980.0) == 3_960_000  # the longest hold fits the kernel's 32-bit argument
    assert hold_cycles(1e-6, 1980.0) == 1
    assert hold_cycles(1e9, 1980.0) == 2**31 - 1
    for bad in ((0.0, 1980.0), (-1.0, 1980.0), (100.0, 0.0), (float("nan"), 1980.0)):
        with pytest.raises(ValueError, match="positive duration and clock"):
            hold_cycles(*bad)


def test_the_kernel_source_spins_on_the_clock_and_touches_no_memory():
    src = T._HOLD_SRC
    sig = re.search(r'extern "C" __global__ void (\w+)\(([^)]*)\)', src)
    assert sig and sig.group(1) == T._HOLD_KERNEL and sig.group(2).strip() == "int cycles"  # no pointer argument
    body = src[src.index("{") + 1:src.rindex("}")]
    assert "clock64()" in body and "while" in body
    for memory in ("*", "[", "__shared__", "__device__", "atomic", "printf", "malloc"):
        assert memory not in body, memory  # no load, store, shared array or global it could touch
    assert src.count("__global__") == 1


class _FakeKernel:
    def __init__(self, log: list) -> None:
        self.log = log

    def __call__(self, grid=(1, 1, 1), block=(1, 1, 1), args=None, shared_mem=0, stream=None) -> None:
        self.log.append(("launch", grid, block, list(args or []), stream))


@pytest.fixture
def fake_cuda(monkeypatch):
    """A device of 132 SMs x 2048 slots at 1980 MHz whose NVRTC records what is compiled and launched."""
    import mkb.measure._device as D

    log: list = []
    props = SimpleNamespace(multi_processor_count=132, max_threads_per_multi_processor=2048, max_threads_per_block=1024,
                            warp_size=32, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def compile_kernel(src, name, *a, **k):
        log.append(("compile", src, name))
        return _FakeKernel(log)

    monkeypatch.setattr(torch.cuda, "_compile_kernel", compile_kernel, raising=False)
    current = [0]

    @__import__("contextlib").contextmanager
    def device_ctx(index):
        log.append(("device", index))
        saved, current[0] = current[0], index
        yield
        current[0] = saved

    monkeypatch.setattr(T, "_device_ctx", device_ctx)
    monkeypatch.setattr(T, "_current_device", lambda: current[0])
    monkeypatch.setattr(T, "_current_stream", lambda d=None: ("stream", str(d)))
    monkeypatch.setattr(T, "_sync", lambda d=None: log.append(("sync", str(d))))
    monkeypatch.setattr(D, "SmClock", lambda d=None: SimpleNamespace(max_mhz=1980.0))
    monkeypatch.setattr(T, "_HOLDS", {})
    monkeypatch.setattr(T, "_EARLY_HOLDS", {})
    return log


def test_the_hold_is_compiled_once_launched_once_before_any_window_and_then_spins_its_cycles(fake_cuda):
    hold = sm_hold("cuda")
    assert sm_hold("cuda:0") is hold and sm_hold() is hold  # one per device and process
    compiles = [e for e in fake_cuda if e[0] == "compile"]
    assert compiles == [("compile", T._HOLD_SRC, T._HOLD_KERNEL)]
    assert [e[0] for e in fake_cuda] == ["device", "compile", "device", "launch", "sync"]  # compiled and first
    assert fake_cuda[-1] == ("sync", "cuda:0")  # launched under the device's context, in the build, then waited for
    assert (hold.grid, hold.block, hold.threads) == (264, 1024, 132 * 2048)
    assert hold.us == HOLD_US and hold.cycles == 1_980_000 and not hasattr(hold, "per_thread")
    assert hold.build == "compiled (no early build)"
    del fake_cuda[:]
    hold.set_us(300.0)
    hold()
    assert fake_cuda == [("launch", (264, 1, 1), (1024, 1, 1), [594_000], ("stream", "cuda:0"))]
    hold.set_us(hold.default_us)
    hold()
    assert fake_cuda[-1][3] == [1_980_000]
    assert all(isinstance(a, int) for e in fake_cuda for a in e[3])  # no buffer: the only argument is the count


def test_a_hold_launched_while_another_device_is_current_launches_under_its_own(fake_cuda, monkeypatch):
    hold = sm_hold("cuda:1")
    assert hold.device == torch.device("cuda", 1) and sm_hold("cuda:0") is not hold
    del fake_cuda[:]
    hold()  # device 0 is current
    assert fake_cuda == [("device", 1), ("launch", (264, 1, 1), (1024, 1, 1), [1_980_000], ("stream", "cuda:1"))]
    monkeypatch.setattr(T, "_current_device", lambda: 1)
    del fake_cuda[:]
    hold()  # its own device is current: no context switch on the path before the window
    assert [e[0] for e in fake_cuda] == ["launch"]


def test_without_nvrtc_kernels_the_hold_is_not_built_and_says_so(fake_cuda, monkeypatch):
    monkeypatch.delattr(torch.cuda, "_compile_kernel")
    with pytest.raises(RuntimeError, match=r"no torch\.cuda\._compile_kernel"):
        SmHold("cuda:0")
    assert not T._HOLDS


@pytest.fixture
def fake_nvrtc(fake_cuda, monkeypatch):
    """torch's NVRTC and module loader recorded: the early build's compile returns a cubin, the load a fake kernel."""
    calls: dict = {"nvrtc": [], "load": []}

    def nvrtc(src, name, *a, **k):
        calls["nvrtc"].append((src, name, a, k))
        return b"\x7fELF-cubin", "mkb_sm_hold"

    def load(binary, names=None):
        calls["load"].append((binary, names))
        fake_cuda.append(("load",))
        return {n: _FakeKernel(fake_cuda) for n in names}

    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", nvrtc)
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module", load)
    return calls


def test_the_early_build_compiles_the_holds_source_for_a_capability_without_touching_a_device(fake_nvrtc, fake_cuda,
                                                                                             monkeypatch):
    def no_device(*a, **k):
        raise AssertionError("the early build touched the device")

    for name in ("get_device_properties", "current_device", "init", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, no_device)
    built = T.build_hold_binary((9, 0))
    assert built is not None and built.capability == (9, 0) and built.binary == b"\x7fELF-cubin"
    assert built.name == "mkb_sm_hold" and built.build_s >= 0
    assert fake_nvrtc["nvrtc"] == [(T._HOLD_SRC, T._HOLD_KERNEL, (), {"compute_capability": "90"})]
    assert fake_cuda == [] and fake_nvrtc["load"] == []  # no context, no load: that is the warm start's


def test_the_early_build_asks_nvrtc_for_what_compile_kernel_asks_on_that_device(fake_nvrtc, fake_cuda):
    """The installed torch's own `_compile_kernel` (today's path) passes the same source and name and nothing but
    defaults, so the capability it derives from the device is the one difference: nothing timed changes."""
    if _REAL_COMPILE_KERNEL is None:
        pytest.skip(f"torch {torch.__version__} has no torch.cuda._compile_kernel")
    _REAL_COMPILE_KERNEL(T._HOLD_SRC, T._HOLD_KERNEL)
    T.build_hold_binary((9, 0))
    (theirs_src, theirs_name, theirs_a, theirs_k), ours = fake_nvrtc["nvrtc"]
    assert (theirs_src, theirs_name) == ours[:2] == (T._HOLD_SRC, T._HOLD_KERNEL)
    assert all(v is None for v in (*theirs_a, *theirs_k.values())), (theirs_a, theirs_k)  # the capability from the device
    assert ours[2:] == ((), {"compute_capability": "90"})


def test_a_hold_whose_capability_was_built_early_loads_that_cubin_and_never_compiles(fake_nvrtc, fake_cuda):
    T.build_hold_binary((9, 0))
    hold = sm_hold("cuda")
    assert hold.build == "prebuilt"
    assert [e[0] for e in fake_cuda] == ["device", "load", "device", "launch", "sync"]  # loaded in the device's context
    assert fake_nvrtc["load"] == [(b"\x7fELF-cubin", ["mkb_sm_hold"])] and len(fake_nvrtc["nvrtc"]) == 1
    assert not any(e[0] == "compile" for e in fake_cuda)
    del fake_cuda[:]
    hold()  # the loaded kernel launches as the compiled one did: same grid, block and only argument
    assert fake_cuda == [("launch", (264, 1, 1), (1024, 1, 1), [1_980_000], ("stream", "cuda:0"))]


def test_a_hold_built_early_for_another_capability_compiles_as_before(fake_nvrtc, fake_cuda):
    T.build_hold_binary((10, 0))
    hold = sm_hold("cuda")
    assert hold.build == "compiled (built early for sm_100, the device is sm_90)"
    assert [e[0] for e in fake_cuda] == ["device", "compile", "device", "launch", "sync"] and not fake_nvrtc["load"]


def test_an_early_build_that_raised_is_silent_and_the_hold_compiles_as_before(fake_nvrtc, fake_cuda, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.13.0\nmore lines")

    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", broken)
    assert T.build_hold_binary((9, 0)) is None  # never raises
    hold = sm_hold("cuda")
    assert hold.build == ("compiled (the early build failed: RuntimeError: nvrtc: error: failed to open "
                          "libnvrtc-builtins.so.13.0)")
    assert [e[0] for e in fake_cuda] == ["device", "compile", "device", "launch", "sync"] and not fake_nvrtc["load"]


@pytest.mark.parametrize("returned", [(b"", "mkb_sm_hold"), ("ptx text", "mkb_sm_hold"), (b"cubin", ""), b"cubin"])
def test_an_early_build_that_returned_no_binary_and_name_is_not_loaded(fake_nvrtc, fake_cuda, monkeypatch, returned):
    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", lambda *a, **k: returned)
    assert T.build_hold_binary((9, 0)) is None
    assert sm_hold("cuda").build.startswith("compiled (the early build failed: ")
    assert not fake_nvrtc["load"]


def test_a_torch_without_the_nvrtc_helpers_compiles_as_before(fake_nvrtc, fake_cuda, monkeypatch):
    monkeypatch.delattr(torch.cuda._utils, "_nvrtc_compile")
    assert T.build_hold_binary((9, 0)) is None
    assert sm_hold("cuda").build == ("compiled (the early build failed: RuntimeError: torch "
                                     f"{torch.__version__} has no torch.cuda._utils._nvrtc_compile)")


def test_a_cubin_that_fails_to_load_falls_back_to_compiling(fake_nvrtc, fake_cuda, monkeypatch):
    def bad_load(binary, names=None):
        raise RuntimeError("CUDA error: device kernel image is invalid")

    T.build_hold_binary((9, 0))
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module", bad_load)
    hold = sm_hold("cuda")
    assert hold.build == "compiled (loading the early build failed: RuntimeError: CUDA error: device kernel image is invalid)"
    assert [e[0] for e in fake_cuda] == ["device", "device", "compile", "device", "launch", "sync"]


def test_the_policy_names_the_quiet_hold():
    assert "sm-quiet-hold-1ms" in TIMING_POLICY and TIMING_POLICY.endswith("/v6")


def _figures(**over) -> dict:
    fig = {"sms": 132, "threads_per_sm": 2048, "threads": 132 * 2048, "allocated_delta": 0, "reserved_delta": 0,
           "durations_us": {"150.0": 151.2, "1000.0": 1001.0, "2000.0": 2003.5},
           "side": {"hold_us": 2000.0, "hold_side_done_us": 2010.0, "sleep_side_done_us": 310.0}}
    fig.update(over)
    return fig


def test_the_gpu_checks_verdicts_fail_each_broken_property():
    assert check_script.judge(_figures()) == []
    assert "is not SMs x slots" in check_script.judge(_figures(threads=132 * 1024))[0]
    assert "allocated device memory" in check_script.judge(_figures(reserved_delta=8 << 20))[0]
    assert "a 1000.0 us hold lasted 500.0 us" in check_script.judge(
        _figures(durations_us={"150.0": 151.0, "1000.0": 500.0}))[0]
    ran_ahead = _figures(side={"hold_us": 2000.0, "hold_side_done_us": 320.0, "sleep_side_done_us": 310.0})
    assert "ran while the hold was resident" in check_script.judge(ran_ahead)[0]


def test_the_gpu_check_reports_a_hold_it_cannot_build_in_one_line(monkeypatch, tmp_path, capsys):
    def broken() -> dict:
        raise RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.13.0\nmore")

    monkeypatch.setattr(check_script, "check", broken)
    assert check_script.main(["--out", str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip() == ("SM HOLD FAILED to build or run: RuntimeError: nvrtc: error: failed to "
                                              "open libnvrtc-builtins.so.13.0")
    assert "error" in __import__("json").loads((tmp_path / "sm_hold.json").read_text())


@pytest.mark.gpu
@_cuda
def test_gpu_the_hold_fills_every_slot_allocates_nothing_lasts_and_holds_back_side_streams():
    """The hold's reason to exist: work launched on another stream once the hold is resident ends only after the
    hold (a one-thread sleep lets it run at once). Checked by the script the v4 validation runs first."""
    fig = check_script.check()
    assert check_script.judge(fig) == [], fig
    assert fig["side"]["sleep_side_done_us"] < fig["side"]["hold_side_done_us"]  # the contrast: a sleep lets it run


def _fake_pynvml(monkeypatch, capability=(9, 0), fail: str | None = None, name=b"NVIDIA H200") -> list:
    """A pynvml whose calls are logged; `fail` names the call that raises."""
    log: list = []

    def call(name_, result=None):
        def fn(*a):
            log.append((name_, *a))
            if name_ == fail:
                raise RuntimeError(f"NVML {name_} failed")
            return result
        return fn

    fake = SimpleNamespace(nvmlInit=call("init"), nvmlShutdown=call("shutdown"),
                           nvmlDeviceGetHandleByIndex=lambda i: log.append(("handle", i)) or ("handle", i),
                           nvmlDeviceGetCudaComputeCapability=call("capability", capability),
                           nvmlDeviceGetName=call("name", name))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return log


def _fake_smi(monkeypatch, answer: str | None) -> list:
    """nvidia-smi as `query_gpu` runs it: `answer` is its CSV line (None: not installed); the calls are logged."""
    from mkb.measure import _device

    calls: list = []
    monkeypatch.setattr(_device.shutil, "which", lambda exe: None if answer is None else f"/usr/bin/{exe}")
    monkeypatch.setattr(_device.subprocess, "run", lambda argv, **k: calls.append(argv) or SimpleNamespace(
        returncode=0, stdout=answer or "", stderr=""))
    return calls


@pytest.fixture
def no_cuda_context(monkeypatch):
    def touched(*a, **k):
        raise AssertionError("the capability lookup touched CUDA")

    for name in ("init", "current_device", "get_device_properties", "get_device_capability", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, touched, raising=False)


@pytest.mark.parametrize("visible, index, physical", [(None, 0, 0), ("3,5", 0, 3), ("3,5", 1, 5), ("7", 0, 7)])
def test_nvml_gives_the_name_and_capability_of_the_visible_device_without_a_cuda_context(monkeypatch, no_cuda_context,
                                                                                          visible, index, physical):
    from mkb.measure import query_gpu

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    log = _fake_pynvml(monkeypatch, capability=(10, 3))
    smi = _fake_smi(monkeypatch, "NVIDIA B200, 10.0")
    assert query_gpu(index) == ("NVIDIA H200", (10, 3))
    assert log == [("init",), ("handle", physical), ("capability", ("handle", physical)), ("name", ("handle", physical)),
                   ("shutdown",)]
    assert smi == []  # NVML answered: no subprocess


@pytest.mark.parametrize("fail", ["init", "capability"])
def test_an_nvml_that_does_not_answer_is_shut_down_and_nvidia_smi_answers_instead(monkeypatch, no_cuda_context, fail):
    from mkb.measure import query_gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    log = _fake_pynvml(monkeypatch, fail=fail)
    smi = _fake_smi(monkeypatch, "NVIDIA H100 80GB HBM3, 9.0\n")
    assert query_gpu(1) == ("NVIDIA H100 80GB HBM3", (9, 0))
    assert (log[-1] == ("shutdown",)) == (fail != "init")  # opened only when init succeeded
    assert len(smi) == 1 and smi[0][-2:] == ["-i", "5"]  # the same physical device
    _fake_smi(monkeypatch, None)
    assert query_gpu(0) is None  # neither answers


def test_without_pynvml_nvidia_smi_answers(monkeypatch, no_cuda_context):
    from mkb.measure import query_gpu

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    _fake_smi(monkeypatch, "NVIDIA H200, 9.0")
    assert query_gpu(0) == ("NVIDIA H200", (9, 0))
    _fake_smi(monkeypatch, None)
    assert query_gpu(0) is None


@pytest.mark.gpu
@_cuda
def test_gpu_a_fresh_process_builds_the_hold_before_any_cuda_use_and_loads_it():
    """Grader 2.11 on the device: the capability (NVML, else nvidia-smi), NVRTC with no CUDA context, then the hold loaded (not compiled)
    and as long as its cycles, in a fresh process as a worker is."""
    import subprocess

    code = ("import json, torch; from mkb.measure import build_hold_binary, query_gpu, sm_hold\n"
            "q = query_gpu(0); cap = q and q[1]; early = build_hold_binary(cap) if cap else None\n"
            "ctx = torch.cuda.is_initialized(); h = sm_hold(); h.set_us(1000.0)\n"
            "a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
            "a.record(); h(); b.record(); b.synchronize()\n"
            "print(json.dumps({'cap': cap, 'early': early is not None, 'ctx': ctx, 'build': h.build,"
            " 'us': a.elapsed_time(b) * 1000.0, 'device_cap': list(torch.cuda.get_device_capability())}))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert res.returncode == 0, res.stderr[-3000:]
    fig = __import__("json").loads(res.stdout.strip().splitlines()[-1])
    assert fig["cap"] == fig["device_cap"] and fig["early"] and not fig["ctx"], fig
    assert fig["build"] == "prebuilt" and fig["us"] >= 950.0, fig


def test_the_hold_check_asks_the_driver_whether_a_primary_context_exists(monkeypatch) -> None:
    """gpu_sm_hold_check's `primary_context_active` on a fake libcuda: the driver's answer, or None when it cannot ask."""
    import ctypes
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "gpu_sm_hold_check", Path(__file__).resolve().parents[2] / "scripts" / "gpu_sm_hold_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class FakeCuda:
        def __init__(self, active: int, init: int = 0) -> None:
            self.active, self.init, self.calls = active, init, []

        def cuInit(self, flags):
            self.calls.append("init")
            return self.init

        def cuDeviceGet(self, dev, index):
            self.calls.append(("get", index))
            return 0

        def cuDevicePrimaryCtxGetState(self, dev, flags, active):
            ctypes.cast(active, ctypes.POINTER(ctypes.c_int)).contents.value = self.active
            self.calls.append("state")
            return 0

    for active, want in ((0, False), (1, True)):
        fake = FakeCuda(active)
        monkeypatch.setattr(ctypes, "CDLL", lambda name, fake=fake: fake)
        assert mod.primary_context_active(0) is want and fake.calls == ["init", ("get", 0), "state"]
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeCuda(0, init=100))  # cuInit failed: not known
    assert mod.primary_context_active(0) is None

    def missing(name):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert mod.primary_context_active(0) is None
