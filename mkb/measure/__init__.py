"""DSL-free measurement shared by problem characterisation and the grader: timing, comparison, speed of light."""

from mkb.measure._compare import (
    SAMPLE_POSITIONS, Comparison, Expected, OutputCheck, QUANTIZED_MAX_OFF_FRACTION, SampledOutput, TOL_FACTOR, as_tuple,
    clone_inputs, compare, expect, inputs_unchanged, sample, to_fp64,
)
from mkb.measure._device import (
    CHECKED_ARCHS, GPU_MODELS, GpuModel, GpuState, SmClock, UnsupportedGpu, arch_of, detect_arch, gpu_name, gpu_state, identify_gpu,
    machine_of, model_of,
    query_gpu,
)
from mkb.measure._sol import GPU_PEAKS, GpuPeaks, SpeedOfLight, gpu_peaks, speed_of_light
from mkb.measure._timing import (
    FIRST_PASSES, FLUSH_KIND, HOLD_MAX_US, HOLD_MIN_US, HOLD_US, MIN_TIMED, MIN_WARMUP, TIMING_POLICY, UPSTREAM_POLICY, UPSTREAM_TIMED, UPSTREAM_WARMUP, InputStream, InputsMade, L2Flusher, one_cpu_thread, SmHold, sm_hold,
    HoldBinary, build_hold_binary, hold_cycles, hold_launch,
    LOOP_PARTS, LoopRecord, Timing, l2_bytes, perf_window, reference_numerics, timed_loop, summarize, tensor_bytes, side_work_us, stream_window, time_calls, time_problem_fn,
    time_upstream, wait_device,
)

__all__ = [
    "LOOP_PARTS", "LoopRecord", "perf_window", "timed_loop", "HOLD_US", "HOLD_MIN_US", "HOLD_MAX_US", "SmHold", "sm_hold", "HoldBinary", "build_hold_binary", "hold_cycles", "hold_launch",
    "UPSTREAM_POLICY", "UPSTREAM_TIMED", "UPSTREAM_WARMUP", "reference_numerics", "time_upstream",
    "SmClock", "CHECKED_ARCHS", "GPU_MODELS", "GpuModel", "UnsupportedGpu", "arch_of", "detect_arch", "identify_gpu", "query_gpu",
    "machine_of", "model_of",
    "SAMPLE_POSITIONS", "SampledOutput", "sample", "Comparison", "Expected", "GPU_PEAKS", "GpuPeaks", "GpuState", "InputStream", "InputsMade", "one_cpu_thread", "L2Flusher", "MIN_TIMED",
    "FIRST_PASSES", "FLUSH_KIND", "MIN_WARMUP", "OutputCheck", "TIMING_POLICY", "QUANTIZED_MAX_OFF_FRACTION", "SpeedOfLight", "TOL_FACTOR", "Timing", "as_tuple",
    "clone_inputs", "compare", "expect", "gpu_name", "gpu_peaks", "gpu_state", "inputs_unchanged", "l2_bytes",
    "speed_of_light", "summarize", "tensor_bytes", "time_calls", "side_work_us", "stream_window", "time_problem_fn", "to_fp64", "wait_device",
]
