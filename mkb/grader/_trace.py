"""Which GPU kernels one call launched, on which streams: torch.profiler (CUPTI) around the call, read back
from its Chrome trace, and the rules that say whether those kernels are the variant's DSL doing the work."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterable

# Non-DSL kernels a solve may launch: data movement and initialisation, never arithmetic on the inputs.
# Matched against torch/CUDA runtime kernel names (`void at::native::vectorized_elementwise_kernel<4,
# at::native::FillFunctor<...>>`, `...direct_copy_kernel_cuda...`, `Memcpy DtoD`, `Memset`).
ALLOWLIST: tuple[str, ...] = (
    r"FillFunctor", r"fill_kernel", r"direct_copy_kernel", r"copy_kernel", r"CopyFunctor",
    r"^Memcpy", r"^Memset", r"^memcpy", r"^memset", r"zero_kernel",
)
_ALLOW_RE = re.compile("|".join(ALLOWLIST))
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


@dataclass(frozen=True)
class Launch:
    name: str
    stream: int | None
    cat: str


def profile_call(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, list[Launch]]:
    """Run fn() under torch.profiler (CUDA activities), synchronise, and return its result and launches."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        result = fn()
        sync()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="mkb-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return result, launches_from_trace(trace)


def launches_from_trace(trace: dict) -> list[Launch]:
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") not in _DEVICE_CATS:
            continue
        args = ev.get("args") or {}
        stream = args.get("stream", ev.get("tid"))
        try:
            stream = int(stream)
        except (TypeError, ValueError):
            stream = None
        out.append(Launch(str(ev.get("name", "")), stream, str(ev.get("cat"))))
    return out


def classify(launches: Iterable[Launch], patterns: Iterable[str], *, streams: set[int] | None) -> tuple[str | None, str]:
    """(reason, message) for one profiled call, reason None when it is clean.

    - no launch matching the candidate's own kernel-name patterns: integrity_no_dsl_kernel;
    - a launch that is neither the DSL's nor allowlisted data movement: integrity_non_dsl_compute;
    - a launch on a stream other than the harness's: integrity_stream.
    """
    pats = [re.compile(p) for p in patterns]
    launches = list(launches)
    dsl = [l for l in launches if l.cat == "kernel" and any(p.search(l.name) for p in pats)]
    other = [l for l in launches if l not in dsl]
    compute = [l for l in other if not _ALLOW_RE.search(l.name)]
    if not dsl:
        return "integrity_no_dsl_kernel", f"no kernel of the variant's DSL ran; saw {[l.name[:120] for l in launches]}"
    if compute:
        return "integrity_non_dsl_compute", f"non-DSL compute kernels ran: {sorted({l.name[:160] for l in compute})}"
    if streams is not None:
        off = [l for l in launches if l.stream is not None and l.stream not in streams]
        if off:
            return "integrity_stream", f"kernels on streams {sorted({l.stream for l in off})}, the harness uses {sorted(streams)}: {[l.name[:80] for l in off]}"
    return None, f"{len(dsl)} DSL kernel(s), {len(other)} allowlisted launch(es)"
