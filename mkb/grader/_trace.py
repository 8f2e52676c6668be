"""Which GPU kernels one call launched, on which streams: torch.profiler (CUPTI) around the call, read back
from its Chrome trace, and the rules that say whether those kernels are the variant's DSL doing the work."""

from __future__ import annotations

import io
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
    dur_us: float = 0.0  # device time (the trace's `dur`)
    nbytes: int = 0  # bytes moved (memcpy / memset only)


# Host calls that make the CPU wait for the device (runtime and driver API names as CUPTI reports them). A
# synchronous cudaMemcpy waits too; `.item()`, `.tolist()` and `.cpu()` show up as cudaMemcpyAsync + cudaStreamSynchronize.
HOST_SYNCS: frozenset[str] = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cudaMemcpyFromSymbol", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpy", "cuMemcpy2D", "cuMemcpy2D_v2",
})
SOLVE_RANGE = "mkb::solve"  # the record_function range around the candidate's call inside a profiled call
_HOST_CATS = {"cuda_runtime", "cuda_driver"}


@dataclass(frozen=True)
class CallTrace:
    """What one profiled call did on the device and between the host and the device."""

    launches: tuple[Launch, ...]
    host_syncs: int = 0  # host-waits-for-device calls made inside the candidate's call
    d2h_bytes: int = 0  # bytes copied device -> host

    def __iter__(self):  # a CallTrace reads as its launches where a launch list is expected
        return iter(self.launches)


@dataclass(frozen=True)
class CallLimits:
    """What one call may do beside its DSL kernels (DESIGN, Grader: integrity), derived from the problem.

    Host reads: a kernel may read its problem's declared structure inputs (varlen lengths, routing
    counts, page tables) on the host, once each, plus a few scalars; anything more moved off the
    device is the answer being computed on the host. Allowlisted launches (fill, copy, memset) are for
    initialisation and layout: a few per tensor, and less device time than the DSL kernels take
    (with a floor, so a tiny DSL kernel may still zero its output).
    """

    max_d2h_bytes: int
    max_host_syncs: int
    max_allowlisted_launches: int
    allowlist_time_ratio: float = 1.0
    allowlist_time_floor_us: float = 20.0

    @classmethod
    def for_call(cls, *, structure_bytes: int, n_structure: int, n_inputs: int, n_outputs: int) -> "CallLimits":
        return cls(
            max_d2h_bytes=int(structure_bytes) + HOST_SCALAR_BYTES,
            max_host_syncs=int(n_structure) + 1,
            max_allowlisted_launches=2 * (int(n_inputs) + int(n_outputs)) + 2,
        )

    def as_dict(self) -> dict:
        return {"max_d2h_bytes": self.max_d2h_bytes, "max_host_syncs": self.max_host_syncs,
                "max_allowlisted_launches": self.max_allowlisted_launches,
                "allowlist_time_ratio": self.allowlist_time_ratio, "allowlist_time_floor_us": self.allowlist_time_floor_us}


HOST_SCALAR_BYTES = 4096  # a few scalars read with .item() beside the structure inputs


# bound when this module is imported, before any candidate: the trace is read through neither a rebound builtins.open
# nor json's shared default decoder (an object, not a callable the guard watches); these two, module attributes of a
# watched module, are watched themselves
_OPEN = io.open
_DECODE = json.JSONDecoder().decode


def profile_call(fn: Callable[[], Any], sync: Callable[[], None], *,
                 before_export: Callable[[], None] | None = None) -> tuple[Any, CallTrace]:
    """Run fn() under torch.profiler (CUDA activities) inside a `SOLVE_RANGE` range, synchronise, and return
    its result and what it did (launches, host syncs inside the range, device-to-host bytes).

    `before_export()` runs between the sync and the trace's export to a file (raising stops it): the file lies in the
    worker's scratch folder, which whatever the candidate left running could write too (the grader checks that nothing
    is left running there)."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(SOLVE_RANGE):
            result = fn()
        sync()
    if before_export is not None:
        before_export()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="mkb-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with _OPEN(path, "rb") as f:
            trace = _DECODE(f.read().decode())
    finally:
        os.unlink(path)
    return result, call_trace(trace)


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
        out.append(Launch(str(ev.get("name", "")), stream, str(ev.get("cat")), _num(ev.get("dur")), int(_num(args.get("bytes")))))
    return out


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def call_trace(trace: dict) -> CallTrace:
    """The Chrome trace of one profiled call, read: launches, host syncs inside the solve range, DtoH bytes.

    Without the solve range (an older profiler), every sync counts except the harness's own final
    device-wide synchronize.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    launches = launches_from_trace(trace)
    d2h = sum(l.nbytes for l in launches if l.cat == "gpu_memcpy" and "DtoH" in l.name)
    syncs = _reading_syncs(events)
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e.get("name") == SOLVE_RANGE]
    if ranges:
        lo = min(_num(r.get("ts")) for r in ranges)
        hi = max(_num(r.get("ts")) + _num(r.get("dur")) for r in ranges)
        n_sync = sum(1 for e in syncs if lo <= _num(e.get("ts")) <= hi)
    else:
        syncs.sort(key=lambda e: _num(e.get("ts")))
        if syncs and syncs[-1].get("name") == "cudaDeviceSynchronize":
            syncs = syncs[:-1]
        n_sync = len(syncs)
    return CallTrace(tuple(launches), n_sync, int(d2h))


def _reading_syncs(events: list[dict]) -> list[dict]:
    """The host-sync calls, less those that only finish a host-to-device copy.

    torch copies from pageable host memory with `cudaMemcpyAsync` + `cudaStreamSynchronize`; that wait
    moves nothing off the device (a kernel building a small index tensor from a list), so it is not
    what the bound is about. The copy's direction comes from its device-side memcpy (same `correlation`).
    """
    kind_of = {}
    for e in events:
        if e.get("cat") == "gpu_memcpy":
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                kind_of[corr] = str(e.get("name", ""))
    host = sorted((e for e in events if e.get("cat") in _HOST_CATS), key=lambda e: (e.get("tid"), _num(e.get("ts"))))
    out, prev = [], None
    for e in host:
        name = str(e.get("name", ""))
        if name in HOST_SYNCS:
            after_h2d = (prev is not None and prev.get("tid") == e.get("tid") and str(prev.get("name", "")).startswith("cudaMemcpy")
                         and "HtoD" in kind_of.get((prev.get("args") or {}).get("correlation"), ""))
            if not after_h2d:
                out.append(e)
        prev = e
    return out


def classify(launches: Iterable[Launch] | CallTrace, patterns: Iterable[str], *, streams: set[int] | None,
             limits: CallLimits | None = None) -> tuple[str | None, str]:
    """(reason, message) for one profiled call, reason None when it is clean.

    - no launch matching the candidate's own kernel-name patterns: integrity_no_dsl_kernel;
    - a launch that is neither the DSL's nor allowlisted data movement: integrity_non_dsl_compute;
    - more device-to-host bytes or host syncs than `limits` allow: integrity_host_compute;
    - more allowlisted launches, or more allowlisted device time, than `limits` allow: integrity_allowlist_work;
    - a launch on a stream other than the harness's: integrity_stream.
    """
    pats = [re.compile(p) for p in patterns]
    trace = launches if isinstance(launches, CallTrace) else None
    launches = list(launches)
    dsl = [l for l in launches if l.cat == "kernel" and any(p.search(l.name) for p in pats)]
    other = [l for l in launches if l not in dsl]
    compute = [l for l in other if not _ALLOW_RE.search(l.name)]
    if not dsl:
        return "integrity_no_dsl_kernel", f"no kernel of the variant's DSL ran; saw {[l.name[:120] for l in launches]}"
    if compute:
        return "integrity_non_dsl_compute", f"non-DSL compute kernels ran: {sorted({l.name[:160] for l in compute})}"
    if limits is not None:
        if trace is not None and trace.d2h_bytes > limits.max_d2h_bytes:
            return "integrity_host_compute", (
                f"the call copied {trace.d2h_bytes} bytes from the device to the host; its structure inputs allow "
                f"{limits.max_d2h_bytes} (the work must run in the DSL's kernels, not on the host)")
        if trace is not None and trace.host_syncs > limits.max_host_syncs:
            return "integrity_host_compute", (
                f"the call made the host wait for the device {trace.host_syncs} times; its structure inputs allow "
                f"{limits.max_host_syncs}")
        if len(other) > limits.max_allowlisted_launches:
            return "integrity_allowlist_work", (
                f"{len(other)} allowlisted copy/fill launches beside {len(dsl)} DSL kernel(s); at most "
                f"{limits.max_allowlisted_launches} are allowed (the allowlist is for initialisation and layout)")
        t_dsl = sum(l.dur_us for l in dsl)
        t_other = sum(l.dur_us for l in other)
        cap = max(limits.allowlist_time_ratio * t_dsl, limits.allowlist_time_floor_us)
        if t_other > cap:
            return "integrity_allowlist_work", (
                f"allowlisted copy/fill launches took {t_other:.1f} us of device time against {t_dsl:.1f} us in the "
                f"DSL kernels (at most {cap:.1f} us allowed): data movement, not the DSL, did the work")
    if streams is not None:
        off = [l for l in launches if l.stream is not None and l.stream not in streams]
        if off:
            return "integrity_stream", f"kernels on streams {sorted({l.stream for l in off})}, the harness uses {sorted(streams)}: {[l.name[:80] for l in off]}"
    return None, f"{len(dsl)} DSL kernel(s), {len(other)} allowlisted launch(es)"


def call_figures(trace: CallTrace, patterns: Iterable[str]) -> dict[str, Any]:
    """The figures the limits are checked on, recorded with every profiled call (to see the margins)."""
    pats = [re.compile(p) for p in patterns]
    dsl = [l for l in trace.launches if l.cat == "kernel" and any(p.search(l.name) for p in pats)]
    other = [l for l in trace.launches if l not in dsl]
    return {"dsl_device_us": round(sum(l.dur_us for l in dsl), 3), "allowlisted_device_us": round(sum(l.dur_us for l in other), 3),
            "allowlisted_launches": len(other), "host_syncs": trace.host_syncs, "d2h_bytes": trace.d2h_bytes}
