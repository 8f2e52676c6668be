"""What GPU a measurement ran on and in what state (name, clocks, temperature), recorded beside timings."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict, dataclass

import torch


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


def _from_pynvml(phys: int) -> dict | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(phys)
        out = {
            "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            "max_sm_clock_mhz": float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
            "temperature_c": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "driver": str(pynvml.nvmlSystemGetDriverVersion()),
            "source": "pynvml",
        }
        pynvml.nvmlShutdown()
        return out
    except Exception:
        return None


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
