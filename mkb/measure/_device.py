"""What GPU a measurement ran on and in what state (name, clocks, temperature), recorded beside timings, and
which GPUs mkb grades on (model, architecture, whether mkb has been checked there)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence, TypeVar

import torch

_T = TypeVar("_T")


@dataclass(frozen=True)
class GpuState:
    """One snapshot of the device; fields the host cannot report are None (`source` says who answered)."""

    name: str
    index: int | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    driver: str | None = None
    torch_version: str = torch.__version__
    cuda_version: str | None = torch.version.cuda
    source: str = "none"  # "pynvml", "nvidia-smi", "torch" or "none"

    def as_dict(self) -> dict:
        return asdict(self)


def _physical_index(index: int) -> int:
    """CUDA_VISIBLE_DEVICES=3,5 makes torch's device 0 the driver's device 3."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in vis.split(",") if p.strip()]
    if parts and all(p.isdigit() for p in parts) and index < len(parts):
        return int(parts[index])
    return index


def _num(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _nvml(phys: int, read: Callable[[Any, Any], _T]) -> _T | None:
    """`read(pynvml, handle)` for physical device `phys` between nvmlInit and nvmlShutdown (shut down whatever `read`
    did); None where pynvml is missing or any call fails. NVML creates no CUDA context."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return read(pynvml, pynvml.nvmlDeviceGetHandleByIndex(phys))
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _from_pynvml(phys: int) -> dict | None:
    return _nvml(phys, lambda nv, h: {
        "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        "mem_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        "max_sm_clock_mhz": float(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        "temperature_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "driver": str(nv.nvmlSystemGetDriverVersion()),
        "source": "pynvml",
    })


def _from_smi(phys: int) -> dict | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = "clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,driver_version"
    try:
        res = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", str(phys)],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0 or not res.stdout.strip():
        return None
    vals = [v.strip() for v in res.stdout.strip().splitlines()[0].split(",")]
    if len(vals) != 6:
        return None
    return {
        "sm_clock_mhz": _num(vals[0]), "mem_clock_mhz": _num(vals[1]), "max_sm_clock_mhz": _num(vals[2]),
        "temperature_c": _num(vals[3]), "power_w": _num(vals[4]), "driver": vals[5] or None, "source": "nvidia-smi",
    }


class SmClock:
    """The device's current and maximum SM clock through one NVML handle, cheap enough to poll (~0.1 ms).

    Why: a GPU idle for a moment drops its clock (an H200 to 345 MHz) and a timing loop must not start
    before it boosts again; polling says when it has, instead of always busying it for a fixed time.
    `read()` is None where NVML is not installed or does not answer (callers then fall back to a fixed time).
    """

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        self._h = self._nvml = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            dev = torch.device(device if device is not None else "cuda")
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
            self._nvml = pynvml
            self.max_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(self._h, pynvml.NVML_CLOCK_SM))
        except Exception:
            self._h = self._nvml = None
            self.max_mhz = None

    def read(self) -> float | None:
        if self._h is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetClockInfo(self._h, self._nvml.NVML_CLOCK_SM))
        except Exception:
            return None


def gpu_state(device: torch.device | str | int | None = None) -> GpuState:
    """Name, clocks and temperature of `device` (pynvml, else nvidia-smi, else torch's name only).

    Never raises: on a host without a GPU the name is "cpu" and the rest is None.
    """
    if not torch.cuda.is_available():
        return GpuState(name="cpu")
    dev = torch.device(device if device is not None else "cuda")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    phys = _physical_index(index)
    info = _from_pynvml(phys) or _from_smi(phys) or {"source": "torch"}
    return GpuState(name=name, index=index, **info)


def gpu_name(device: torch.device | str | int | None = None) -> str:
    return torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class GpuModel:
    """A GPU model mkb knows: its short name (the key of `GPU_PEAKS`), compute capability and DSL target arch."""

    model: str
    capability: tuple[int, int]
    arch: str


# Hopper and Blackwell data-centre GPUs. Longer names first where one contains another (GB200 / B200).
GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("GB200", (10, 0), "sm_100a"),
    GpuModel("B200", (10, 0), "sm_100a"),
    GpuModel("GB300", (10, 3), "sm_103a"),
    GpuModel("B300", (10, 3), "sm_103a"),
    GpuModel("H200", (9, 0), "sm_90a"),
    GpuModel("H100", (9, 0), "sm_90a"),
)
# Architectures on which both DSL backends, the baselines and the red-team suite have been run and
# recorded (events/h200-*). Others are refused until they are: a grade there would be unchecked.
CHECKED_ARCHS: frozenset[str] = frozenset({"sm_90a"})


def model_of(name: str | None) -> str | None:
    """The GPU model a driver name holds ("NVIDIA H200" -> "H200"), or None: the one name-to-model rule (the first
    entry of `GPU_MODELS` whose model is in the name, longer names first)."""
    up = (name or "").upper()
    return next((m.model for m in GPU_MODELS if m.model in up), None)


def machine_of(gpu: str | None, gpu_model: str | None = None) -> str | None:
    """The machine a recorded row belongs to: its `gpu_model`, else the model in its driver name, else that name.
    Every layer that groups rows by machine (resuming torch.compile, memory evidence, the analysis tables, the speed
    table) keys on this, or on `mkb.analysis._compile.machine_expr`, its column form."""
    return gpu_model or model_of(gpu) or gpu


class UnsupportedGpu(RuntimeError):
    """The device is not a GPU mkb grades on (unknown model, or an architecture not yet checked)."""


def arch_of(capability: Sequence[int]) -> str:
    """The DSL target for a compute capability: sm_<major><minor>a (the arch-specific features Hopper/Blackwell kernels use)."""
    major, minor = int(capability[0]), int(capability[1])
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def identify_gpu(name: str, capability: Sequence[int], *, allow_unchecked: bool = False) -> GpuModel:
    """The `GpuModel` of a device by its name ("NVIDIA H200") and compute capability; raises `UnsupportedGpu`
    (one line with a hint) for a model mkb does not know, a capability that contradicts the name, or an
    architecture not in `CHECKED_ARCHS` (unless `allow_unchecked`)."""
    cap = (int(capability[0]), int(capability[1]))
    model = next((m for m in GPU_MODELS if m.model == model_of(name)), None)
    known = ", ".join(f"{m.model} ({m.arch})" for m in GPU_MODELS)
    if model is None:
        raise UnsupportedGpu(f"GPU {name!r} (compute capability {cap[0]}.{cap[1]}, {arch_of(cap)}) is not one mkb grades on\n"
                             f"hint: known GPUs: {known}; a new one is an entry in mkb.measure.GPU_MODELS and GPU_PEAKS")
    if model.capability != cap:
        raise UnsupportedGpu(f"GPU {name!r} reports compute capability {cap[0]}.{cap[1]}, but a {model.model} is "
                             f"{model.capability[0]}.{model.capability[1]}\nhint: check the driver and CUDA_VISIBLE_DEVICES")
    if model.arch not in CHECKED_ARCHS and not allow_unchecked:
        raise UnsupportedGpu(f"{model.model} ({model.arch}) has not been checked with mkb: the DSL backends, baselines and "
                             f"red-team suite have run only on {', '.join(sorted(CHECKED_ARCHS))}\nhint: run "
                             f"scripts/gpu_grader_run.py there with GraderConfig(allow_unchecked_gpu=True), then add "
                             f"{model.arch} to mkb.measure.CHECKED_ARCHS")
    return model


def query_gpu(index: int = 0) -> tuple[str, tuple[int, int]] | None:
    """(name, compute capability) of this process's device `index` (CUDA_VISIBLE_DEVICES mapped), without creating a
    CUDA context: the grader's parent never initialises CUDA, and a worker builds the SM hold's cubin for this
    capability before its `go` (grader 2.11). NVML in this process where pynvml answers (no subprocess), else
    nvidia-smi; None when neither does (`SmHold` checks the device's own capability anyway)."""
    return _query_nvml(index) or _query_smi(index)


def _query_nvml(index: int) -> tuple[str, tuple[int, int]] | None:
    def read(nv: Any, h: Any) -> tuple[str, tuple[int, int]]:
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        name = nv.nvmlDeviceGetName(h)
        return (name.decode() if isinstance(name, bytes) else str(name)), (int(major), int(minor))

    return _nvml(_physical_index(index), read)


def _query_smi(index: int) -> tuple[str, tuple[int, int]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", str(_physical_index(index))],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_query(res.stdout) if res.returncode == 0 else None


def parse_query(text: str) -> tuple[str, tuple[int, int]] | None:
    """nvidia-smi's `name,compute_cap` CSV line -> (name, (major, minor))."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    name, _, cap = line.rpartition(",")
    try:
        major, minor = (int(p) for p in cap.strip().split("."))
    except ValueError:
        return None
    return name.strip(), (major, minor)


@functools.lru_cache(maxsize=None)
def detect_arch(index: int = 0) -> str:
    """The DSL target arch of device `index` (nvidia-smi first; torch, which initialises CUDA, only as a fallback)."""
    q = query_gpu(index)
    if q is None and torch.cuda.is_available():
        q = torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))
    if q is None:
        raise UnsupportedGpu("no CUDA device found\nhint: grade on a GPU host, or pass GraderConfig(device='cpu') for a smoke run")
    return arch_of(q[1])
