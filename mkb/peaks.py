"""Speed of light: the fastest a problem can run on a GPU, from its FLOPs, bytes and the peak that applies.

Torch-free on purpose (the read side, `mkb.analysis`, scores S_sol with it and must not import torch);
`mkb.measure` re-exports it.

Peaks are dense (no sparsity) datasheet figures per GPU model, keyed by `ProblemMeta.peak`; a new GPU
is one entry in `GPU_PEAKS`. Memory-bound problems ("memory") are bounded by HBM bandwidth, with their
arithmetic counted at the fp32 SIMT rate (elementwise math runs on the CUDA cores).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuPeaks:
    """Datasheet peaks of one GPU model (dense FLOP/s per peak class, HBM bytes/s)."""

    model: str
    hbm_bytes_per_s: float
    flops_per_s: dict = field(default_factory=dict, hash=False)
    source: str = ""

    def compute(self, peak: str) -> float:
        key = "fp32_simt" if peak == "memory" else peak
        try:
            return self.flops_per_s[key]
        except KeyError:
            raise ValueError(f"no {peak!r} peak for {self.model}\nhint: known peaks: {', '.join(sorted(self.flops_per_s))}") from None


T = 1e12
GPU_PEAKS: dict[str, GpuPeaks] = {
    "H200": GpuPeaks(
        "H200", 4.8e12,
        {"bf16_tc": 989 * T, "fp16_tc": 989 * T, "fp8_tc": 1979 * T, "tf32_tc": 494.5 * T, "fp32_simt": 66.9 * T},
        "NVIDIA H200 SXM datasheet (dense); DESIGN.md",
    ),
    "H100": GpuPeaks(
        "H100", 3.35e12,
        {"bf16_tc": 989 * T, "fp16_tc": 989 * T, "fp8_tc": 1979 * T, "tf32_tc": 494.5 * T, "fp32_simt": 66.9 * T},
        "NVIDIA H100 SXM5 datasheet (dense)",
    ),
    # Blackwell: per GPU, dense = half the datasheets' sparse tensor figures (HGX B200 / GB200 NVL72 / HGX B300)
    "B200": GpuPeaks(
        "B200", 8.0e12,
        {"bf16_tc": 2250 * T, "fp16_tc": 2250 * T, "fp8_tc": 4500 * T, "tf32_tc": 1125 * T, "fp32_simt": 75 * T},
        "NVIDIA HGX B200 datasheet, per GPU (dense)",
    ),
    "GB200": GpuPeaks(
        "GB200", 8.0e12,
        {"bf16_tc": 2500 * T, "fp16_tc": 2500 * T, "fp8_tc": 5000 * T, "tf32_tc": 1250 * T, "fp32_simt": 80 * T},
        "NVIDIA GB200 NVL72 datasheet, per GPU (dense)",
    ),
    "B300": GpuPeaks(
        "B300", 8.0e12,
        {"bf16_tc": 2250 * T, "fp16_tc": 2250 * T, "fp8_tc": 4500 * T, "tf32_tc": 1125 * T, "fp32_simt": 75 * T},
        "NVIDIA HGX B300 datasheet, per GPU (dense)",
    ),
}


def gpu_peaks(gpu: str = "H200") -> GpuPeaks:
    """The peaks for a GPU model name as torch reports it ("NVIDIA H200") or a short key ("H200")."""
    up = gpu.upper()
    for key in sorted(GPU_PEAKS, key=len, reverse=True):
        if key in up:
            return GPU_PEAKS[key]
    raise KeyError(f"no peak table for GPU {gpu!r}\nhint: add an entry to mkb.peaks.GPU_PEAKS (known: {', '.join(GPU_PEAKS)})")


@dataclass(frozen=True)
class SpeedOfLight:
    seconds: float
    compute_s: float
    memory_s: float
    bound: str  # "compute" or "memory"
    gpu: str
    peak: str

    @property
    def us(self) -> float:
        return self.seconds * 1e6


def speed_of_light(*, flops: float, bytes: float, peak: str, gpu: str = "H200") -> SpeedOfLight:
    """max(flops / peak FLOP/s, bytes / HBM bandwidth) on `gpu`."""
    p = gpu_peaks(gpu)
    c = flops / p.compute(peak)
    m = bytes / p.hbm_bytes_per_s
    return SpeedOfLight(max(c, m), c, m, "compute" if c >= m else "memory", p.model, peak)
