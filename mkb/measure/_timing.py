"""End-to-end timing of one callable under the DESIGN policy: fresh inputs, L2 flushed, the call's device time.

Each timed call is `synchronize; flush L2; hold every SM ~1 ms; start; fn(*inputs); end; wait; tail`
(`stream_window`). The time is start -> end on the GPU: every launch the call made on the current stream
and any gap between them (a host sync inside the call, a launch the host made late), but not the host's
dispatch of the first launches, which overlaps the flush and the hold (`SmHold`, `HOLD_US`): the start
event runs only once the host has enqueued the call, so the window holds the device's work alone.
The hold fills every thread slot of every SM with threads that spin on the SM's clock and touch no memory
(policy v4: a hold that wrote 8.6 MB slowed the kernel after it; see `SmHold`), and the host dispatches the call only
once the flush has ended and the hold is resident: work the call puts on another stream cannot run ahead
of the window in an idle GPU (a single-thread sleep would leave it 131 free SMs for a millisecond).
Why (measured on the H200, benchmarks/timing_repro.py, 2026-12-01): with only the flush (~100 us) in
front of the window, a call whose host dispatch outran it carried the excess into the window, and that
excess is the host's state, not the kernel's: problem 72's eager (about 60 small launches) measured
346-791 us between gradings of one process (spread 41-72% within a run) while its device time stayed
at 322 us (0.67%); and the grader's worker, whose profiler (CUPTI) slows every launch on the host,
made 20 us kernels bimodal (19-59 us medians). The host's dispatch time is kept per call beside the
window (`LoopRecord.host_us`) and reported, never mixed into the time. A call that dispatches for
longer than the hold, or syncs with the host, still pays it inside the window.
`tail` (end -> after a spin on the current stream and a device-wide synchronize) is kept per call: work
left on other streams after `end` shows up there, and the grader compares it with an empty call's
(`side_work_us`); the spin keeps the host's wake-up from a blocking wait out of it.
Inputs are fresh values at fresh addresses on every call (an `InputStream`; since v5 in blocks the caching
allocator had handed out before, so a worker's history does not decide where they lie), and L2 is flushed
outside the window with a read-only pass (it leaves clean lines, so the next kernel pays no
write-back of the flush's lines), so neither a pointer-keyed cache nor a warm cache can speed a call up.
TIMING_POLICY names this policy; figures from different policies must not be compared.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

# Names the timing policy (window, flush, input placement): part of every cache key and timing event, so
# figures measured under different policies are never mixed. Bump it with any semantic change here.
TIMING_POLICY = "stream-window/flush-read-6xL2/sm-quiet-hold-1ms/preallocated-sets/v6"
FIRST_PASSES = ("allocate", "make", None)  # InputStream's first pass: v6's blocks only, v5's whole sets, none (v4)
MIN_WARMUP = 10
MIN_TIMED = 50
_DEFAULT_L2_BYTES = 60 * 1024 * 1024  # H200; used only when the device does not report its L2 size


@dataclass(frozen=True)
class Timing:
    """Per-call times (microseconds) and their summary."""

    times_us: tuple[float, ...]
    median_us: float
    iqr_us: float
    cv: float
    mean_us: float
    min_us: float
    max_us: float
    n_warmup: int
    n_timed: int
    clock: str  # "cuda_event" or "perf_counter"
    l2_flushed: bool
    input_sets: int  # distinct input sets alive at once (addresses never repeat within this window)
    tail_us_median: float | None = None  # median end -> after device-wide sync (see stream_window)
    host_us_median: float | None = None  # median host dispatch of a call (outside the time; see the module docstring)
    hold_us: float | None = None  # the SM hold in front of each timed window (timed_loop's rule)
    policy: str = ""  # TIMING_POLICY of the measurement


def summarize(times_us: Sequence[float], **extra: Any) -> Timing:
    """Median, IQR (q75 - q25, linear interpolation) and CV (sample sd / mean) of `times_us`."""
    xs = sorted(float(t) for t in times_us)
    if not xs:
        raise ValueError("no timed calls to summarize")
    if len(xs) >= 2:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        iqr = q[2] - q[0]
        mean = statistics.fmean(xs)
        cv = statistics.stdev(xs) / mean if mean > 0 else math.nan
    else:
        iqr, mean, cv = 0.0, xs[0], 0.0
    return Timing(
        times_us=tuple(float(t) for t in times_us), median_us=statistics.median(xs), iqr_us=iqr, cv=cv,
        mean_us=mean, min_us=xs[0], max_us=xs[-1],
        n_warmup=extra.get("n_warmup", 0), n_timed=len(xs), clock=extra.get("clock", "perf_counter"),
        l2_flushed=extra.get("l2_flushed", False), input_sets=extra.get("input_sets", 1),
        tail_us_median=extra.get("tail_us_median"), host_us_median=extra.get("host_us_median"),
        hold_us=extra.get("hold_us"),
        policy=extra.get("policy", TIMING_POLICY),
    )


def l2_bytes(device: torch.device | str | int | None = None) -> int:
    """The device's L2 size as torch reports it (60 MiB on an H200), or 60 MiB if it does not."""
    try:
        return int(torch.cuda.get_device_properties(device).L2_cache_size) or _DEFAULT_L2_BYTES
    except (AttributeError, RuntimeError, AssertionError):
        return _DEFAULT_L2_BYTES


FLUSH_KINDS = ("add", "memset", "read")
FLUSH_KIND = "read"
FLUSH_FACTOR = 6.0  # x L2: long enough (~100 us of reads on an H200) to hide the host's dispatch of the call
SPIN_WAIT = True  # the tail's wait spins on the current stream first (see wait_device)
HOLD_US = 1000.0  # how long `SmHold` keeps every SM busy before the window opens (at the GPU's maximum clock)
# a timing loop sets the hold from its warm-ups: twice their longest host dispatch, within these bounds
HOLD_MIN_US, HOLD_MAX_US = 150.0, 2000.0
_HOLD_KERNEL = "mkb_sm_hold"
# every thread spins on its SM's cycle counter and touches no memory (no load, no store, no argument but the count)
_HOLD_SRC = r"""
extern "C" __global__ void mkb_sm_hold(int cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < (long long)cycles) { }
}
"""
_INT32_MAX = 2**31 - 1

# bound at import, before any candidate exists (the grader's guard watches this module's names)
_sync = torch.cuda.synchronize
_current_stream = torch.cuda.current_stream
_stream_query = torch.cuda.Stream.query
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_ev_sync = torch.cuda.Event.synchronize
_Event_query = torch.cuda.Event.query
_device_ctx = torch.cuda.device
_current_device = torch.cuda.current_device


def hold_launch(sms: int, threads_per_sm: int, max_threads_per_block: int = 1024, warp: int = 32) -> tuple[int, int]:
    """(grid, block) of the hold: blocks of whole warps that divide an SM's thread slots exactly, as large as a
    block may be, so `grid x block` is the device's resident-thread capacity and every slot is taken at once
    (H200: 132 SMs x 2048 -> 264 blocks of 1024; a 1536-slot SM gets blocks of 768, never a 1536-thread block)."""
    if sms < 1 or threads_per_sm < warp or threads_per_sm % warp:
        raise ValueError(f"SmHold: cannot fill {sms} SMs of {threads_per_sm} thread slots with whole warps of {warp}")
    block = next(b for b in range(min(max_threads_per_block, threads_per_sm) // warp * warp, 0, -warp)
                 if threads_per_sm % b == 0)
    return sms * (threads_per_sm // block), block


def hold_cycles(us: float, mhz: float) -> int:
    """SM cycles of a hold of `us` microseconds at `mhz` (the SM's maximum clock: at a lower clock it lasts longer),
    as the kernel's 32-bit argument (2 ms at 1980 MHz is 3.96 M cycles)."""
    if not us > 0 or not mhz > 0:
        raise ValueError(f"SmHold: a hold needs a positive duration and clock (got {us} us at {mhz} MHz)")
    return max(1, min(_INT32_MAX, int(us * mhz)))


@dataclass(frozen=True)
class HoldBinary:
    """The hold's NVRTC output for one compute capability, built before any CUDA use (`build_hold_binary`)."""

    capability: tuple[int, int]
    binary: bytes  # what torch's `_nvrtc_compile` returns (a cubin; PTX in older torches), loaded as _compile_kernel does
    name: str  # the kernel's lowered name in it
    build_s: float


# capability -> its early build, or why that build failed (`SmHold` then compiles as before)
_EARLY_HOLDS: dict[tuple[int, int], "HoldBinary | str"] = {}


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or ['(no message)'])[0]}"[:300]


def build_hold_binary(capability: Sequence[int]) -> HoldBinary | None:
    """NVRTC turns the hold's source into a cubin for `capability` ((9, 0) on an H200) without touching a device: pure
    CPU work, so the grader's worker does it before its `go` and the warm start under the quiet rule only loads and
    launches it (grader 2.11; on the H200 NVRTC was most of 2.10's `hold_compile`, 0.424 s median per worker).
    The compile is the one `torch.cuda._compile_kernel` makes on that device (same source, same name; the
    `compute_capability` it derives from the device's properties), so nothing timed changes. Never raises: a failure
    is kept for `SmHold`, which then compiles as before, and None is returned."""
    cap = (int(capability[0]), int(capability[1]))
    t0 = time.perf_counter()
    try:
        compile_ = getattr(getattr(torch.cuda, "_utils", None), "_nvrtc_compile", None)
        if compile_ is None:
            raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._utils._nvrtc_compile")
        out = compile_(_HOLD_SRC, _HOLD_KERNEL, compute_capability=f"{cap[0]}{cap[1]}")
        binary, name = out
        if not isinstance(binary, (bytes, bytearray)) or not binary or not isinstance(name, str) or not name:
            raise TypeError(f"_nvrtc_compile returned {type(binary).__name__} and {type(name).__name__}, not a binary "
                            "and a kernel name")
    except Exception as exc:  # noqa: BLE001 - the warm start compiles as before; the reason is kept for the figures
        _EARLY_HOLDS[cap] = f"the early build failed: {_first_line(exc)}"
        return None
    _EARLY_HOLDS[cap] = held = HoldBinary(cap, bytes(binary), name, time.perf_counter() - t0)
    return held


def _early_kernel(dev: torch.device, props: Any) -> tuple[Any, str]:
    """(the hold's kernel loaded into `dev`'s context from its early build, "") or (None, why there is none)."""
    cap = (getattr(props, "major", None), getattr(props, "minor", None))
    early = _EARLY_HOLDS.get(cap)  # type: ignore[arg-type]
    if early is None:
        built = ", ".join(f"sm_{a}{b}" for a, b in _EARLY_HOLDS)
        return None, (f"built early for {built}, the device is sm_{cap[0]}{cap[1]}" if built else "no early build")
    if isinstance(early, str):
        return None, early
    try:
        load = getattr(getattr(torch.cuda, "_utils", None), "_cuda_load_module", None)
        if load is None:
            raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._utils._cuda_load_module")
        with _device_ctx(dev.index):
            loaded = load(early.binary, [early.name])
        return (loaded[early.name] if isinstance(loaded, dict) else getattr(loaded, early.name)), ""
    except Exception as exc:  # noqa: BLE001 - compiled as before instead
        return None, f"loading the early build failed: {_first_line(exc)}"


class SmHold:
    """Keeps every thread slot of every SM spinning for about `us` microseconds, touching no memory.

    Why not `torch.cuda._sleep`: it spins one thread, and while it runs the call's work on another stream
    would have the rest of the GPU to itself, ahead of the window. Here the grid is exactly the device's
    resident-thread capacity (SMs x max threads per SM), so every slot is taken until the hold ends.
    Why no memory (timing policy v4, grader 2.4): the jiterator hold it replaces read and wrote an 8.6 MB
    buffer just before every window, and the kernel after it paid for those dirty lines: on the H200 25 cute
    ran 4.0% and 28 cute 1.5% slower behind it than behind this kernel, with a level that moved 2.5-6x more
    between processes (`events/h200-timing-levels`); its work size was also calibrated per process (4 or 8
    elements per thread). This one spins a fixed cycle count from the SM's maximum clock, with no calibration.
    A raw NVRTC kernel (`torch.cuda._compile_kernel`), compiled once per process outside every window; since grader
    2.11 the cubin NVRTC made before any CUDA use (`build_hold_binary`) is loaded instead where it was built for this
    device's capability (`build`: "prebuilt", or "compiled (why not)").
    """

    def __init__(self, device: torch.device | str | int | None = None, *, us: float | None = None) -> None:
        dev = torch.device(device if device is not None else "cuda")
        if dev.index is None:
            dev = torch.device(dev.type, torch.cuda.current_device())
        self.device = dev
        props = torch.cuda.get_device_properties(dev)
        self.grid, self.block = hold_launch(
            int(props.multi_processor_count), int(getattr(props, "max_threads_per_multi_processor", 2048)),
            int(getattr(props, "max_threads_per_block", 1024) or 1024), int(getattr(props, "warp_size", 32) or 32))
        self.threads = self.grid * self.block
        self._kernel, why = _early_kernel(dev, props)
        self.build = "prebuilt" if self._kernel is not None else f"compiled ({why})"
        if self._kernel is None:
            compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
            if compile_kernel is None:
                raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC kernels need "
                                   "torch >= 2.8)")
            with _device_ctx(dev.index):
                self._kernel = compile_kernel(_HOLD_SRC, _HOLD_KERNEL)
        from mkb.measure._device import SmClock

        self.mhz = SmClock(dev).max_mhz or 1980.0
        self.default_us = HOLD_US if us is None else float(us)
        self.set_us(self.default_us)
        with _device_ctx(dev.index):  # the first launch (module load, argument path) here, outside every window
            self._kernel(grid=(self.grid, 1, 1), block=(self.block, 1, 1), args=[hold_cycles(1.0, self.mhz)],
                         stream=_current_stream(dev))
            _sync(dev)

    def set_us(self, us: float) -> None:
        """Hold for about `us` microseconds from the next call on (at the GPU's maximum clock)."""
        self.us = float(us)
        self.cycles = hold_cycles(self.us, self.mhz)

    def __call__(self) -> None:
        if _current_device() == self.device.index:
            self._launch()
        else:  # the kernel was loaded into this device's context, which must be current when it launches
            with _device_ctx(self.device.index):
                self._launch()

    def _launch(self) -> None:
        self._kernel(grid=(self.grid, 1, 1), block=(self.block, 1, 1), args=[self.cycles],
                     stream=_current_stream(self.device))


_HOLDS: dict[str, SmHold] = {}


def sm_hold(device: torch.device | str | int | None = None) -> SmHold:
    """The process's `SmHold` for `device` (compiled on first use)."""
    dev = torch.device(device if device is not None else "cuda")
    key = f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
    if key not in _HOLDS:
        _HOLDS[key] = SmHold(dev)
    return _HOLDS[key]


class L2Flusher:
    """Evicts L2 with a pass over a buffer twice its size; `flush()` is called outside the timed window.

    kind "add" reads and writes every line (it leaves L2 full of dirty lines that the next kernel's
    misses must write back), "memset" only writes, "read" only reads (it leaves clean lines: eviction
    costs the next kernel nothing extra).
    """

    def __init__(self, device: torch.device | str | int | None = None, *, factor: float | None = None,
                 kind: str | None = None) -> None:
        self.device = torch.device(device if device is not None else "cuda")
        self.kind = kind or FLUSH_KIND
        if self.kind not in FLUSH_KINDS:
            raise ValueError(f"unknown L2 flush kind {self.kind!r}\nhint: one of {', '.join(FLUSH_KINDS)}")
        self.nbytes = int(l2_bytes(self.device) * (factor if factor is not None else FLUSH_FACTOR))
        if self.kind == "read":
            self._buf = torch.ones(self.nbytes // 4, dtype=torch.float32, device=self.device)
            self._acc = torch.empty((), dtype=torch.float32, device=self.device)
        else:
            self._buf = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)

    def flush(self) -> None:
        if self.kind == "add":
            self._buf.add_(1)
        elif self.kind == "memset":
            self._buf.zero_()
        else:
            torch.sum(self._buf, dim=(0,), out=self._acc)


def wait_device(device: torch.device | str | int | None = None, *, spin: bool | None = None) -> None:
    """Device-wide synchronize; with `spin`, first poll the current stream in a busy loop.

    The busy loop keeps the host thread running while the call's kernels execute, so the end of the
    window does not include waking an idle (v)CPU from a blocking wait (see TIMING_POLICY).
    Work on other streams is still waited for by the device-wide synchronize that follows.
    """
    if spin if spin is not None else SPIN_WAIT:
        st = _current_stream(device)
        while not _stream_query(st):
            pass
    _sync(device)


def stream_window(fn: Callable[[], Any], *, flush: Callable[[], None] | None = None,
                  device: torch.device | str | int | None = None,
                  hold: Callable[[], None] | None | bool = True) -> tuple[Any, float, float]:
    """`synchronize; flush; hold; start; fn(); end; wait; tail` -> (result, start->end us, end->tail us).

    The flush and the hold are enqueued, and the host waits only until the flush has ended (so the hold
    is resident on every SM before any launch of `fn`), then dispatches `fn` while the GPU holds; the
    window starts when the hold ends. A dispatch longer than the hold, or a host sync inside `fn`,
    leaves a gap inside the window. `hold=True` is the device's `sm_hold()`; None or False: no hold.
    """
    _sync(device)
    if hold is True:
        hold = sm_hold(device)
    flushed = None
    if flush is not None:
        flush()
    if hold:
        flushed = _Event()
        _record(flushed)
        hold()
    start, end, tail = _Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True)
    _record(start)
    if flushed is not None:
        while not _Event_query(flushed):
            pass
    result = fn()
    _record(end)
    wait_device(device)
    _record(tail)
    _ev_sync(tail)
    return result, _elapsed(start, end) * 1000.0, _elapsed(end, tail) * 1000.0


def side_work_us(tails_us: Sequence[float], floor_tails_us: Sequence[float]) -> float:
    """How much later than for an empty call the device went idle after `end`, median over calls (us).

    An honest call leaves nothing behind `end` (its tail is the host's sync latency, as for an empty
    call); work left running on another stream adds its duration here.
    """
    if not tails_us or not floor_tails_us:
        return 0.0
    return statistics.median(tails_us) - statistics.median(floor_tails_us)


def tensor_bytes(values: Sequence[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@contextlib.contextmanager
def one_cpu_thread() -> Iterator[None]:
    """Run the body with torch's intra-op pool at one thread, restored after (nested uses are free).

    Why: input sets are made with CPU work in them (a paged problem's page order is a CPU randperm on every draw),
    and torch spreads each such op over one thread per core. On a host whose cores are busy (the queue's other
    worker, a precompile, a neighbour) every such parallel region waits for its slowest thread: on the H200 problem
    1's 113 sets took 0.16-0.27 s alone and 1.9-2.2 s beside one busy process per core (events/h200-inputs-probe),
    the `timing_inputs` split of benchmarks/timing_inputs_split.py. One thread gives the same values (the generator
    is seeded per draw; tests/measure/test_one_cpu_thread.py) and is only used outside every timed window.
    """
    before = _get_threads()
    if before == 1:
        yield
        return
    _set_threads(1)
    try:
        yield
    finally:
        _set_threads(before)


# bound when mkb.measure is imported, before any candidate code exists (a kernel may rebind torch's attributes)
_get_threads, _set_threads = torch.get_num_threads, torch.set_num_threads


@dataclass(frozen=True)
class InputsMade:
    """Where the seconds of an `InputStream`'s construction went (the grader's `timing_inputs` phase).

    Why: problem 1's `timing_inputs` took either ~0.2 s or ~1.9 s with the same sets, the same count and the same first
    pass (events/h200-grader-bench-2-15 .. 2-18-pause), and the phase alone cannot tell which of these it was: the
    host's CPU (wall well above `cpu_s`: starved by neighbours), the allocator (device frees or retries: it ran out
    and released its cache, each cudaFree a device sync), or the device (neither).
    """

    first_pass_s: float  # the first set and the first pass
    make_s: float  # the sets made up front after it (premade: all; otherwise none)
    sets_made: int  # calls of `make` (the first set is made twice where the first pass recycles)
    cpu_s: float  # this process's CPU seconds (all threads) over the whole construction
    device_mallocs: int | None  # the caching allocator's cudaMalloc calls meanwhile (None off the GPU)
    device_frees: int | None  # its cudaFree calls (it frees only when a malloc failed, or when told to)
    alloc_retries: int | None  # mallocs that failed and were retried after freeing cached blocks

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


class InputStream:
    """Input sets for call i = 0, 1, ...: fresh values (seed `base_seed + i`) and fresh addresses.

    If `n_calls` sets fit in `max_bytes` they are all made up front (no allocation between calls).
    Otherwise a ring of `capacity` sets is kept alive and call i's set is made, outside the timed
    window, *before* the oldest one is dropped, so the caching allocator cannot hand a call any
    address used by the `capacity - 1` calls before it; values are new on every call either way.

    `first_pass` (policy v6: "allocate", the default): on a GPU the first `capacity` sets' blocks are allocated
    once (`empty_like` of the first set's tensors: no values, no kernels) and dropped to the caching allocator
    (never to the driver), so every timed set is then made into blocks the allocator already had. "make" (policy
    v5) made the whole sets twice for the same state: graded ABBA against it, "allocate" gave every short
    baseline's median within 0.5% (events/h200-checks-ab-allocate) for microseconds where "make" cost 0.16 s per
    grading (events/h200-grader-bench-2-6). None: no first pass (policy v4).
    Why: where a set lies moves a short kernel's time by whole percents, and before v5 that depended on the worker's history: a worker that had timed the eager
    (whose dropped sets the candidate's then reused) timed 25 cute 4.4% and 01 cute 1.4% faster than one
    whose eager came from the cache (fresh blocks), while either state alone repeats within 0.1-0.4%
    (events/h200-recycle-levels, events/h200-eager-level). With it, every timed loop starts in one state.
    """

    def __init__(self, make: Callable[[int], Sequence[Any]], *, n_calls: int, base_seed: int = 1_000,
                 max_bytes: int | None = None, min_capacity: int = 3, first_pass: str | None = "allocate") -> None:
        if first_pass not in FIRST_PASSES:
            raise ValueError(f"InputStream first_pass must be one of {FIRST_PASSES}, not {first_pass!r}")
        self._make = make
        made_sets = [0]

        def make_set(seed: int) -> Sequence[Any]:
            made_sets[0] += 1
            return make(seed)

        self.base_seed = base_seed
        t_start, cpu_start, alloc_pre = time.perf_counter(), time.process_time(), _allocator_counts()
        seg_pre = _segments_allocated()
        first = tuple(make_set(base_seed))
        per_set = max(1, tensor_bytes(first))
        cap = n_calls if max_bytes is None else max(min_capacity, min(n_calls, max_bytes // per_set))
        self.capacity = max(1, min(cap, n_calls))
        self.set_bytes = per_set
        cuda = _on_cuda(first)
        self.recycled = first_pass is not None and cuda
        if self.recycled:  # a first pass dropped to the caching allocator; the sets are made (again) below
            if first_pass == "make":
                once = [first] + [tuple(make_set(base_seed + i)) for i in range(1, self.capacity)]
            else:  # "allocate": the blocks only, one set more than "make" holds at once (the first set's own)
                once = [first] + [tuple(torch.empty_like(t) if isinstance(t, torch.Tensor) else t for t in first)
                                  for _ in range(self.capacity)]
            del first
            once.clear()
        seg0 = _segments_allocated() if cuda else None
        if self.recycled:
            first = tuple(make_set(base_seed))
        t_made = time.perf_counter()
        self._ring: deque[tuple[int, tuple]] = deque([(0, first)])
        self.premade = self.capacity >= n_calls
        if self.premade:
            for i in range(1, n_calls):
                self._ring.append((i, tuple(make_set(base_seed + i))))
        seg1 = _segments_allocated() if cuda else None
        t_end, alloc_post = time.perf_counter(), _allocator_counts()
        self.made = InputsMade(
            first_pass_s=t_made - t_start, make_s=t_end - t_made, sets_made=made_sets[0],
            cpu_s=time.process_time() - cpu_start,
            **{k: (alloc_post[k] - alloc_pre[k] if cuda and alloc_pre and alloc_post else None)
               for k in ("device_mallocs", "device_frees", "alloc_retries")})
        # the device segments the allocator had to create for the sets made here (besides the first one when not
        # recycled): 0 means every timed set lies in blocks it already had (policy v5's aim); None off the GPU
        self.new_segments: int | None = seg1 - seg0 if seg0 is not None and seg1 is not None else None
        # the segments the first set and the first pass created: 0 means the process already had every block cached
        # (a worker that timed the eager, say); problem 1's slow and fast `timing_inputs` both created ~250 (`made` tells them apart)
        self.first_pass_new_segments: int | None = (seg0 - seg_pre if cuda and seg_pre is not None and seg0 is not None
                                                    else None)

    def __call__(self, i: int) -> tuple:
        for j, inputs in self._ring:
            if j == i:
                return inputs
        new = (i, tuple(self._make(self.base_seed + i)))  # allocate before freeing: addresses stay fresh
        self._ring.append(new)
        while len(self._ring) > self.capacity:
            self._ring.popleft()
        return new[1]


def _on_cuda(inputs: Sequence[Any]) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)


def _allocator_counts() -> dict[str, int] | None:
    """The caching allocator's cudaMalloc and cudaFree calls and failed-then-retried mallocs in this process so far."""
    try:
        st = torch.cuda.memory_stats()
        return {"device_mallocs": int(st["num_device_alloc"]), "device_frees": int(st["num_device_free"]),
                "alloc_retries": int(st["num_alloc_retries"])}
    except Exception:  # noqa: BLE001 - a figure for the record (no CUDA, or a torch without these counters)
        return None


def _segments_allocated() -> int | None:
    """How many device segments the caching allocator has created in this process so far (cudaMalloc calls)."""
    try:
        return int(torch.cuda.memory_stats().get("segment.all.allocated", 0))
    except Exception:  # noqa: BLE001 - a figure for the record, never a reason to fail a timing
        return None


# the parts of a timing loop's wall time (LoopRecord.split_s): inputs: `inputs(i)`; before: `before_call`; window: the
# whole `window` (sync, flush, hold, the call, its tail); after: `after_call`; between: `between_calls`
LOOP_PARTS = ("inputs", "before", "window", "after", "between")


@dataclass
class LoopRecord:
    """What `timed_loop` measured so far (the hooks see it while it runs)."""

    times_us: list[float]  # timed calls only
    tails_us: list[float]
    host_us: list[float] = field(default_factory=list)  # host dispatch of each timed call (perf_counter around fn)
    calls: int = 0  # warm-ups included
    hold_us: float | None = None  # the SM hold the timed calls ran behind (set from the warm-ups' dispatch)
    stopped_after: int | None = None  # the timed call after which `between_calls` stopped the loop
    # the loop's wall seconds by part (LOOP_PARTS), every call's warm-ups included: where a loop's time goes outside
    # its windows (making sets in a ring, the hooks' checks and re-checks, profiled calls), read by perf_counter
    # outside every window
    split_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOOP_PARTS, 0.0))


def timed_loop(fn: Callable[..., Any], inputs: Callable[[int], Sequence[Any]], *, warmup: int, timed: int,
               window: Callable[[Callable[[], Any]], tuple[Any, float, float]],
               before_call: Callable[[int], None] | None = None,
               after_call: Callable[[int, Any, Sequence[Any], float], None] | None = None,
               between_calls: Callable[[int, LoopRecord], bool] | None = None,
               hold: "SmHold | None" = None) -> LoopRecord:
    """The one timing loop (problem characterisation, the grader's eager baseline and its candidate loop).

    Call i (k = i - warmup; k < 0 are warm-ups) gets `args = inputs(i)`, then `before_call(i)`, then one
    `window` around `fn(*args)`; `after_call(k, result, args, us)` sees the result, which is dropped
    before `between_calls(k, record)`, which may run untimed work and returns True to stop (the
    grader's profiled calls and early stop). Nothing of the hooks runs inside a window.
    `hold` (the `SmHold` the window uses): the warm-ups run behind its default duration, the timed calls
    behind twice the warm-ups' longest host dispatch (the second longest of 4 or more; within
    HOLD_MIN_US..HOLD_MAX_US), so a call that
    dispatches in 40 us does not pay a millisecond per call and one that dispatches in 600 us is hidden;
    a timed call that dispatches longer than that pays the excess inside its window. Restored after.
    """
    rec = LoopRecord([], [])
    host = [0.0]
    warm_host: list[float] = []
    if hold is not None:
        hold.set_us(hold.default_us)

    def call(args: Sequence[Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            host[0] = (time.perf_counter() - t0) * 1e6

    split = rec.split_s
    clock = time.perf_counter
    for i in range(warmup + timed):
        k = i - warmup
        t0 = clock()
        args = inputs(i)
        t1 = clock()
        if before_call is not None:
            before_call(i)
        t2 = clock()
        result, us, tail = window(lambda: call(args))
        t3 = clock()
        split["inputs"] += t1 - t0
        split["before"] += t2 - t1
        split["window"] += t3 - t2
        rec.calls += 1
        if k >= 0:
            rec.times_us.append(us)
            rec.tails_us.append(tail)
            rec.host_us.append(host[0])
        else:
            warm_host.append(host[0])
        t4 = clock()
        if after_call is not None:
            after_call(k, result, args, us)
        del result
        t5 = clock()
        split["after"] += t5 - t4
        if hold is not None and k == -1:
            longest = sorted(warm_host)[-2] if len(warm_host) >= 4 else max(warm_host)  # one host hiccup is not the call's
            hold.set_us(min(HOLD_MAX_US, max(HOLD_MIN_US, 2.0 * longest)))
            rec.hold_us = hold.us
        stop = between_calls is not None and between_calls(k, rec)
        split["between"] += clock() - t5
        if stop:
            rec.stopped_after = k
            break
    if hold is not None:
        hold.set_us(hold.default_us)
    return rec


def perf_window(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """The CPU stand-in for `stream_window` (tests, smoke runs): perf_counter around fn, no tail."""
    t0 = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - t0) * 1e6, 0.0


def time_calls(fn: Callable[..., Any], inputs: Callable[[int], Sequence[Any]], *, warmup: int = MIN_WARMUP,
               timed: int = MIN_TIMED, device: torch.device | str | None = None, flush_l2: bool = True,
               on_timed: Callable[[int, Any, Sequence[Any]], None] | None = None,
               input_sets: int = 1) -> Timing:
    """Time `fn(*inputs(i))` for `warmup + timed` calls; returns the summary of the timed ones.

    On a CUDA device each timed window is `stream_window` (L2 flushed before the window, the host's
    dispatch overlapping the flush); on the CPU (tests, smoke runs) it is `perf_counter` around fn.
    `on_timed(k, result, args)` sees every timed call's result outside the window (the grader
    re-checks some of them).
    """
    dev = torch.device(device) if device is not None else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    cuda = dev.type == "cuda"
    if cuda:
        flusher = L2Flusher(dev) if flush_l2 else None
        flush = flusher.flush if flusher else None
        window = lambda f: stream_window(f, flush=flush, device=dev)  # noqa: E731
    else:
        window = perf_window
    hook = None
    if on_timed is not None:
        hook = lambda k, result, args, us: on_timed(k, result, args) if k >= 0 else None  # noqa: E731
    rec = timed_loop(fn, inputs, warmup=warmup, timed=timed, window=window, after_call=hook,
                     hold=sm_hold(dev) if cuda else None)
    if cuda:
        _sync(dev)
    return summarize(rec.times_us, n_warmup=warmup, clock="cuda_event" if cuda else "perf_counter",
                     l2_flushed=cuda and flush_l2, input_sets=input_sets,
                     tail_us_median=statistics.median(rec.tails_us) if cuda and rec.tails_us else None,
                     host_us_median=statistics.median(rec.host_us) if rec.host_us else None, hold_us=rec.hold_us)


def time_problem_fn(fn: Callable[..., Any], make: Callable[[int], Sequence[Any]], *, warmup: int = MIN_WARMUP,
                    timed: int = MIN_TIMED, device: torch.device | str | None = None, base_seed: int = 1_000,
                    max_input_bytes: int | None = None, flush_l2: bool = True,
                    on_timed: Callable[[int, Any, Sequence[Any]], None] | None = None) -> Timing:
    """`time_calls` with an `InputStream` over `make(seed)`: the usual way to time a problem's callable.

    `max_input_bytes` bounds the memory spent on live input sets (default: a quarter of the free
    device memory on CUDA, unbounded on the CPU).
    """
    dev = torch.device(device) if device is not None else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if max_input_bytes is None and dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        max_input_bytes = free // 4
    stream = InputStream(make, n_calls=warmup + timed, base_seed=base_seed, max_bytes=max_input_bytes)
    try:
        return time_calls(fn, stream, warmup=warmup, timed=timed, device=dev, flush_l2=flush_l2,
                          on_timed=on_timed, input_sets=stream.capacity)
    finally:
        del stream


# Upstream MetaKernelBench's baseline timing (YIGE24/MetaKernelBench d90ba28, template/contract.py), reproduced so
# that a speedup over it can be set beside upstream's published numbers: the problem's fp32 reference under
# upstream's "reference numerics", 10 warm-up and 50 timed calls on fresh draws, each `sync; start; fn; sync;
# end; sync` (host dispatch and the sync's wake-up inside the window), no L2 flush.
UPSTREAM_POLICY = "upstream-mkb-d90ba28/sync-start-fn-sync-end/fresh-draws/no-flush/reference-numerics"
UPSTREAM_WARMUP = 10
UPSTREAM_TIMED = 50


@contextlib.contextmanager
def reference_numerics() -> Iterator[None]:
    """Upstream's numerics while its reference runs: no TF32 or reduced-precision reductions, fp32 default dtype."""
    mm = torch.backends.cuda.matmul
    saved = (torch.backends.cudnn.allow_tf32, mm.allow_bf16_reduced_precision_reduction,
             mm.allow_fp16_reduced_precision_reduction, torch.get_float32_matmul_precision(), torch.get_default_dtype())
    torch.backends.cudnn.allow_tf32 = False
    mm.allow_bf16_reduced_precision_reduction = False
    mm.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved[0]
        mm.allow_bf16_reduced_precision_reduction = saved[1]
        mm.allow_fp16_reduced_precision_reduction = saved[2]
        torch.set_float32_matmul_precision(saved[3])
        torch.set_default_dtype(saved[4])


def time_upstream(fn: Callable[..., Any], make: Callable[[int], Sequence[Any]], *, warmup: int = UPSTREAM_WARMUP,
                  timed: int = UPSTREAM_TIMED, device: torch.device | str | None = None,
                  budget_s: float | None = None, min_timed: int = 5) -> Timing:
    """Time `fn(*make(i))` as upstream MetaKernelBench times its baseline (`UPSTREAM_POLICY`).

    `budget_s` bounds the wall time (upstream's own references include per-token Python loops): once
    it is spent, no more warm-ups run and timing stops after `min_timed` calls; the summary's
    `n_warmup` / `n_timed` say what was made.
    """
    dev = torch.device(device) if device is not None else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    over = lambda: budget_s is not None and time.perf_counter() - t0 > budget_s  # noqa: E731
    times: list[float] = []
    n_warm = 0
    with reference_numerics():
        for i in range(warmup):
            if over():
                break
            fn(*make(i))
            n_warm += 1
        start, end = (_Event(enable_timing=True), _Event(enable_timing=True)) if cuda else (None, None)
        for j in range(timed):
            if len(times) >= min_timed and over():
                break
            inputs = make(warmup + j)
            if cuda:
                _sync(dev)
                _record(start)
                out = fn(*inputs)
                _sync(dev)
                _record(end)
                _sync(dev)
                times.append(_elapsed(start, end) * 1000.0)
            else:
                c0 = time.perf_counter()
                out = fn(*inputs)
                times.append((time.perf_counter() - c0) * 1e6)
            del out, inputs
    return summarize(times, n_warmup=n_warm, clock="cuda_event" if cuda else "perf_counter", l2_flushed=False,
                     policy=UPSTREAM_POLICY)
