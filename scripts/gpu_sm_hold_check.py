"""The quiet SM hold (timing policy v4) on a real GPU, before any grading: what it launches, that it allocates
nothing, that it lasts at least its cycles at the maximum clock, and that work on another stream cannot run while it
is resident (a one-thread `torch.cuda._sleep` beside it as the contrast that lets it run).

    python3 scripts/gpu_sm_hold_check.py --out $OUT        # $OUT/sm_hold.json; a few seconds; exit 1 if a check fails

stdlib and torch only; run it first in the v4 validation command (scripts/gpu_checks_ab.py's docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

HOLD_FLOOR = 0.95  # a hold lasts at least this fraction of its cycles at the max clock (longer at lower clocks)
SIDE_AFTER = 0.75  # side-stream work launched while the hold is resident ends after this fraction of the hold


def judge(fig: dict) -> list[str]:
    """The checks' verdicts from the figures, one line per failed check (empty: all passed)."""
    bad = []
    if fig["threads"] != fig["sms"] * fig["threads_per_sm"]:
        bad.append(f"grid x block {fig['threads']} is not SMs x slots {fig['sms'] * fig['threads_per_sm']}")
    if fig["allocated_delta"] or fig["reserved_delta"]:
        bad.append(f"the hold allocated device memory ({fig['allocated_delta']} / {fig['reserved_delta']} bytes)")
    for us, got in fig["durations_us"].items():
        if got < HOLD_FLOOR * float(us):
            bad.append(f"a {us} us hold lasted {got:.1f} us")
    side = fig["side"]
    if side["hold_side_done_us"] < SIDE_AFTER * side["hold_us"]:
        bad.append(f"side-stream work ended {side['hold_side_done_us']:.1f} us into a {side['hold_us']} us hold: "
                   "it ran while the hold was resident")
    return bad


def _side(launch, hold_us: float) -> float:
    """us from just before `launch()` until side-stream work, launched once the launch is resident, ends."""
    import torch

    x = torch.ones(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    t0, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    launch()
    while not t0.query():
        pass
    time.sleep(300e-6)  # the launch is resident on every SM by now
    with torch.cuda.stream(side):
        x.mul_(2)
        done.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(done) * 1000.0


def primary_context_active(index: int = 0) -> bool | None:
    """Whether device `index` has its primary CUDA context now, asked of the driver (`cuDevicePrimaryCtxGetState`, which
    creates none); None where libcuda cannot be asked. Stronger than `torch.cuda.is_initialized()`, torch's own flag,
    which a context made outside torch would not set."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return None
        if cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
            return None
        return bool(active.value)
    except (OSError, AttributeError):
        return None


def check() -> dict:
    """Builds the process's hold (as a worker does: NVRTC before any CUDA use, then the load in the warm start) and
    measures it. How it was built is recorded (`hold_build`), not judged: a hold compiled as before is the same kernel."""
    import torch

    from mkb.measure import build_hold_binary, query_gpu, sm_hold

    t0 = time.perf_counter()
    q = query_gpu(0)
    cap = None if q is None else q[1]
    early = build_hold_binary(cap) if cap is not None else None
    early_s = time.perf_counter() - t0
    context_before = torch.cuda.is_initialized()  # the early build must not have created one
    primary_before = primary_context_active(0)  # nor a context torch does not know of (None: libcuda not asked)
    t0 = time.perf_counter()
    hold = sm_hold()
    build_s = time.perf_counter() - t0
    props = torch.cuda.get_device_properties(0)
    fig: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "build_s": round(build_s, 4),
                 "early_build_s": round(early_s, 4), "capability": cap, "early_build": early is not None,
                 "cuda_initialized_by_early_build": context_before, "primary_context_after_early_build": primary_before,
                 "hold_build": hold.build,
                 "sms": props.multi_processor_count, "threads_per_sm": props.max_threads_per_multi_processor,
                 "grid": hold.grid, "block": hold.block, "threads": hold.threads, "max_mhz": hold.mhz}
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(10):
        hold()
    torch.cuda.synchronize()
    fig["allocated_delta"] = torch.cuda.memory_allocated() - mem0[0]
    fig["reserved_delta"] = torch.cuda.memory_reserved() - mem0[1]
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)  # clocks up, as a grading's warm-up does
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        w = (w @ w).clamp_(-1, 1)
    del w
    fig["durations_us"] = {}
    try:
        for us in (150.0, 1000.0, 2000.0):
            hold.set_us(us)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            best = float("inf")
            for _ in range(5):
                a.record()
                hold()
                b.record()
                b.synchronize()
                best = min(best, a.elapsed_time(b) * 1000.0)
            fig["durations_us"][str(us)] = round(best, 2)
        hold.set_us(2000.0)
        sleep_cycles = int(2000.0 * hold.mhz)
        fig["side"] = {"hold_us": 2000.0, "hold_side_done_us": round(_side(hold, 2000.0), 2),
                       "sleep_side_done_us": round(_side(lambda: torch.cuda._sleep(sleep_cycles), 2000.0), 2)}
    finally:
        hold.set_us(hold.default_us)
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-gpu-out"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        fig = check()
    except Exception as exc:  # noqa: BLE001 - one line that names it, the run's other steps still go on
        first = (str(exc).strip().splitlines() or ["(no message)"])[0]
        print(f"SM HOLD FAILED to build or run: {type(exc).__name__}: {first}", flush=True)
        (out / "sm_hold.json").write_text(json.dumps({"error": f"{type(exc).__name__}: {first}"}, indent=1))
        return 1
    fig["failures"] = judge(fig)
    (out / "sm_hold.json").write_text(json.dumps(fig, indent=1))
    print("SM HOLD " + json.dumps(fig), flush=True)
    print("SM HOLD " + ("ok" if not fig["failures"] else "FAILED: " + "; ".join(fig["failures"])), flush=True)
    return 0 if not fig["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
