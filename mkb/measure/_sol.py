"""Re-exports the torch-free speed-of-light table (`mkb.peaks`), where it lives so the read side can use it."""

from mkb.peaks import GPU_PEAKS, T, GpuPeaks, SpeedOfLight, gpu_peaks, speed_of_light

__all__ = ["GPU_PEAKS", "GpuPeaks", "SpeedOfLight", "T", "gpu_peaks", "speed_of_light"]
