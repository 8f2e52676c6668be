"""One evaluation inside a single-use worker, as steps in trust order: trusted, compile, verify, time, integrity.

Trust order (DESIGN, Grader): every expected output, fp64 anchor, re-check input and the eager timing is
computed before `kernel.py` is imported, and every timer and torch callable the harness uses is bound
here at module import, before the candidate exists. After import the identities, numerics flags,
environment, threads and current stream are compared with their snapshots after every call, so a
candidate that rebinds `Event.elapsed_time` or a torch op fails even though the harness never called
the rebound object. Stage results go out through `send`; the worker adds the nonce.
"""

from __future__ import annotations

import math
import random
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mkb.grader._config import GraderConfig
from mkb.grader._fs_guard import SCRATCH_ENV, FsGuard, confine_writes, default_readable
from mkb.grader._syscall_guard import SyscallGuard, refuse_escapes
from mkb.grader._guards import Guard, native_threads, python_threads, refuse_audit_hooks, watch_descendants
from mkb.grader._prefetch import free_fraction, plan_key, prefetch_fits
from mkb.grader._problems import load_problem
from mkb.grader._provenance import MAX_COPIED_FRACTION, CopyWatch, copy_share, warm_up as _warm_copy_watch
from mkb.grader._trace import CallLimits, call_figures, classify, profile_call
from mkb.grader._verdict import CompileFigures, IntegrityFigures, TimingFigures, VerificationFigures, timing_decided
from mkb.measure import (
    MIN_TIMED, TIMING_POLICY, UPSTREAM_POLICY, InputStream, L2Flusher, LoopRecord, UnsupportedGpu, clone_inputs, compare,
    SmClock, build_hold_binary, expect, gpu_state, query_gpu, sample, sm_hold, identify_gpu, inputs_unchanged, one_cpu_thread, side_work_us, stream_window as _stream_window,
    summarize,
    tensor_bytes, time_upstream, timed_loop,
)
from mkb.reasons import Reason

# Bound before any candidate code exists; the harness only ever calls these objects.
_perf = time.perf_counter
_mono = time.monotonic
_cuda_sync = torch.cuda.synchronize
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_ev_sync = torch.cuda.Event.synchronize
_tensor_type = torch.Tensor
_is_floating = torch.Tensor.is_floating_point
_empty_like = torch.empty_like
_empty = torch.empty
_fill = torch.Tensor.fill_
_warm_copy_watch()  # before any guard snapshot (it imports torch._dynamo, which rebinds torch callables)


_WARM: dict[str, Any] = {}
# this process's confinement (writes, process group), applied once before its first candidate import
_FS_GUARD: list[FsGuard] = []
_SYSCALL_GUARD: list[SyscallGuard] = []
# integrity_stream when the device stays busy after the call's `end` this much longer than after an empty call
SIDE_WORK_MIN_US = 25.0
FLOOR_CALLS = 30  # empty calls before and after the timing loop whose tails are the side-work check's floor
CLOCK_WARM_MIN_S = 0.03  # the shortest clock warm-up where the clock read low before it (grader 2.23: one round where it read boosted)
SIDE_WORK_FRACTION = 0.1


class WarmStartError(RuntimeError):
    """A step of the worker's job-independent GPU warm-up failed: the message names the step in one line."""


def _warm_step(what: str, hint: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - re-raised with the step named
        first = (str(exc).strip().splitlines() or ["(no message)"])[0]
        raise WarmStartError(f"the grader worker's warm start failed at {what}: {type(exc).__name__}: {first}; "
                             f"hint: {hint}") from exc


def build_hold_before_go(device: str) -> None:
    """The CPU half of the warm start's SM hold, run by the worker before its `imported` (grader 2.11): NVRTC builds
    the hold's cubin for the compute capability NVML reports, creating no CUDA context, so the warm start after `go`,
    under the quiet rule, only loads and launches it. Never raises and changes nothing timed: where NVML or NVRTC
    fails here, `SmHold` compiles as in 2.10 (`hold_build` says which). Off the GPU it does nothing."""
    if device.split(":")[0] != "cuda" or "hold_nvrtc_before_go_s" in _WARM:
        return
    t0 = _perf()
    try:
        cap = _capability(torch.device(device).index or 0)
        if cap is not None:
            build_hold_binary(cap)
        else:  # said in `hold_build`, which otherwise reads only "no early build"
            _WARM["hold_early_note"] = "neither NVML nor nvidia-smi gave a compute capability"
    except Exception as exc:  # noqa: BLE001 - both never raise; a bug here must not stop a worker that can still compile
        _WARM["hold_early_note"] = f"the early build raised {type(exc).__name__}"
    _WARM["hold_nvrtc_before_go_s"] = _perf() - t0


def _capability(index: int) -> tuple[int, int] | None:
    q = query_gpu(index)
    return None if q is None else q[1]


def warm_start(device: str) -> None:
    """Work that does not depend on the job, done while the worker waits for one: the profiler's (CUPTI)
    first-use initialisation, the harness stream's id as the profiler names it, and the timing window's
    SM hold (a raw NVRTC kernel, loaded from the cubin `build_hold_before_go` made, else compiled, and launched once). A failure names its step (`WarmStartError`): it is the
    host's, never a candidate's, and the operator needs to know which piece of the toolchain broke."""
    if device == "cuda" and "streams" not in _WARM:
        t0 = _perf()
        _WARM["streams"] = _warm_step(
            "the profiler's first use (CUPTI)", "check that the CUDA toolkit's CUPTI library matches the driver",
            lambda: _Device("cuda").harness_streams())
        _WARM["profiler_init_s"] = _perf() - t0
        t0 = _perf()
        _WARM["sm_clock"] = _warm_step("reading the SM clock (NVML)", "check that pynvml can open the GPU",
                                       SmClock)
        _WARM["sm_clock_s"] = _perf() - t0
        t0 = _perf()
        hold = _warm_step("building the timing window's SM hold (a raw kernel compiled by NVRTC, torch.cuda._compile_kernel)",
                          "check that torch can compile and launch an NVRTC kernel here (torch.cuda._compile_kernel; "
                          "NVRTC in the CUDA runtime torch ships); there is no timing without the hold", sm_hold)
        _WARM["hold_compile_s"] = _perf() - t0
        build, note = getattr(hold, "build", None), _WARM.get("hold_early_note")
        _WARM["hold_build"] = f"{build}; {note}" if build and build != "prebuilt" and note else build
        t0 = _perf()
        _warm_step("the first use of cuBLAS and of the timing window's kernels",
                   "check that torch can run a bf16 matmul on this GPU (cuBLAS in the CUDA runtime torch ships)",
                   _first_use)
        _WARM["first_use_s"] = _perf() - t0


def warm_start_steps() -> dict[str, float] | None:
    """Seconds of each step of this worker's GPU warm start (None off the GPU): the warm-up a spare holds the device
    for under the quiet rule, attributed (grader 2.10), since that is what the throughput of one GPU waits on.
    `hold_nvrtc_before_go` (grader 2.11) is the exception: the hold's NVRTC build before `imported`, CPU work that is
    not under the quiet rule; `hold_compile` is then the hold's load and first launch (`hold_build`: "prebuilt")."""
    names = {"hold_nvrtc_before_go_s": "hold_nvrtc_before_go",  # before `imported`: not under the quiet rule
             "profiler_init_s": "cuda_context_and_profiler_init",  # the profiler's first use is the first CUDA use
             "sm_clock_s": "sm_clock", "hold_compile_s": "hold_compile", "first_use_s": "first_use"}
    steps = {names[k]: round(v, 4) for k, v in _WARM.items() if k in names}
    return steps or None


def _first_use() -> None:
    """What every grading's clock warm-up and timing windows would otherwise pay on their first call in this
    process (grader 2.4): the cuBLAS handle and workspace, the lazily loaded GEMM, clamp, L2-flush and event
    kernels. Job-independent and before any candidate exists, like the rest of the warm start; the clock
    warm-up and the windows themselves still run in full before each timing loop."""
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    (a @ a).clamp_(-1, 1)
    flush = _flusher(_Device("cuda"))
    for _ in range(3):
        _stream_window(lambda: None, flush=flush)
    _cuda_sync()


class _Phases:
    """Seconds spent per named step, recorded in the events so overhead can be attributed."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.t0 = self._t = _perf()

    def mark(self, name: str) -> None:
        now = _perf()
        self.s[name] = round(self.s.get(name, 0.0) + now - self._t, 4)
        self._t = now


class Fail(Exception):
    """A stage's failure: which stage, the reason code, and what was seen."""

    def __init__(self, stage: str, reason: str, message: str) -> None:
        super().__init__(f"{stage}: {reason}: {message}")
        self.stage, self.reason, self.message = stage, reason, message


class _Device:
    """The few device operations the harness needs, CUDA or a CPU stand-in for tests."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.torch_device = torch.device(kind)

    def sync(self) -> None:
        if self.kind == "cuda":
            _cuda_sync()

    def window(self, fn: Callable[[], Any], flush: Callable[[], None] | None = None) -> tuple[Any, float, float]:
        """mkb.measure's stream window (sync; flush; start; fn(); end; device-wide sync; tail) -> (result, us, tail us)."""
        if self.kind == "cuda":
            return _stream_window(fn, flush=flush)
        t0 = _perf()
        result = fn()
        return result, (_perf() - t0) * 1e6, 0.0

    def hold(self) -> Any:
        """The window's SM hold (None on the CPU), which a timing loop sets from its warm-ups."""
        return sm_hold() if self.kind == "cuda" else None

    def warm_clocks(self, seconds: float, *, min_s: float | None = None) -> dict[str, Any] | None:
        """Busy the GPU until it has boosted (an idle H200 sits at 345 MHz), for at most `seconds`.

        With NVML the warm-up ends once the SM clock reads >= 95% of its maximum: after one round where it read so
        before any work too (grader 2.23: a queue's back-to-back gradings; 2,197 of 2,197 recorded H200 gradings read
        boosted before any work, so the fixed 30 ms took ~6% of a warm grading's overhead for nothing), else after at
        least `CLOCK_WARM_MIN_S`; `min_s` (GraderConfig.clock_warm_min_s, an A/B arm) is that minimum always. The
        timed calls come later still, behind the side-work floor's 30 held empty calls and >= 10 held warm-ups.
        Without NVML it lasts `seconds`. What it took is recorded in the run's phases (`clock_warm`).
        """
        if self.kind != "cuda" or seconds <= 0:
            return None
        clock = _WARM.get("sm_clock")
        a = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)]

        def work() -> None:
            for _ in range(8):
                a[0] = (a[0] @ a[0]).clamp_(-1, 1)
            _cuda_sync()

        fig = warm_until_boosted(work, clock.read if clock is not None else None,
                                 clock.max_mhz if clock is not None else None, seconds=seconds, min_s=min_s)
        a.clear()  # the 32 MiB operand freed before the timing loop's sets are made
        return fig

    def harness_streams(self) -> set[int] | None:
        """Stream ids (as the profiler names them) the harness launches on."""
        if self.kind != "cuda":
            return None
        buf = torch.empty(1024, device="cuda")
        _, launches = profile_call(lambda: buf.fill_(1.0), _cuda_sync)
        ids = {l.stream for l in launches if l.stream is not None}
        return ids or None


def warm_until_boosted(work: Callable[[], None], read: Callable[[], float | None] | None, max_mhz: float | None, *,
                       seconds: float, min_s: float | None = None, clock: Callable[[], float] = _perf) -> dict[str, Any]:
    """Run `work` rounds until `read()` gives >= 95% of `max_mhz`, for at most `seconds`: the clock warm-up's rule.

    The shortest run is one round when the clock read boosted before any work (grader 2.23), else
    `CLOCK_WARM_MIN_S`; `min_s` forces a minimum (an A/B arm). Without a reading (no NVML) it lasts `seconds`. The
    figures keep what the clock read before any work (grader 2.5's measure for this decision), the minimum used, the
    rounds and how it ended ("clock" or "time")."""
    target = 0.95 * max_mhz if read is not None and max_mhz else None
    first = read() if read is not None else None
    if min_s is None:
        min_s = 0.0 if target is not None and first is not None and first >= target else CLOCK_WARM_MIN_S
    fig: dict[str, Any] = {"first_mhz": first, "max_mhz": max_mhz, "rounds": 0, "by": "time", "min_s": min_s}
    t0 = clock()
    mhz = None
    while clock() - t0 < seconds:
        work()
        fig["rounds"] += 1
        if target is not None and clock() - t0 >= min_s:
            mhz = read()
            if mhz is not None and mhz >= target:
                fig["by"] = "clock"
                break
    fig["s"], fig["last_mhz"] = round(clock() - t0, 6), mhz
    return fig


def _poison(expected: Any) -> None:
    """Park NaN-filled blocks of each output's size in the allocator, so an output read from freed memory is NaN.

    A sampled output (`Expected.sampled`) has no whole reference: its block is made from its shape and dtype."""
    blocks = []
    for k, v in enumerate(expected.reference):
        s = expected.sampled.get(k)
        if s is not None:
            b = _empty(s.shape, dtype=s.dtype, device=s.device)
            _fill(b, math.nan)
            blocks.append(b)
        elif isinstance(v, _tensor_type) and _is_floating(v) and v.numel():
            b = _empty_like(v)
            _fill(b, math.nan)
            blocks.append(b)
    del blocks


def _looks_like_compile_error(exc: BaseException, backend: Any) -> bool:
    """The backend says which exceptions are its compiler's (mkb.dsl: DSL names live there only)."""
    check = getattr(backend, "is_compile_error", None)
    return bool(check(exc)) if check is not None else "ompil" in type(exc).__name__


def _fmt_exc(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:]


def _call(solve: Callable, args: tuple, stage: str) -> Any:
    try:
        return solve(*args)
    except SystemExit as exc:
        raise Fail("integrity", "integrity_exit", f"solve raised SystemExit({exc.code!r})") from None
    except Fail:
        raise
    except BaseException as exc:  # noqa: BLE001 - any candidate exception is the candidate's failure
        raise Fail(stage, "runtime_error", _fmt_exc(exc)) from None


class _Quiet:
    """This worker's GPU-sensitive phases (eager timing and floors, the timing loop), announced to the parent.

    `hold` says the phase starts and waits for the parent's `go` (given once no spare worker of the
    parent's process is in its GPU warm-up; no spare starts one until `release`). The windows are
    reported (monotonic, one clock for the host's processes) so the overlap can be checked.
    """

    def __init__(self, send: Callable[[dict], None], wait_go: Callable[[], Any] | None) -> None:
        self.send, self.wait_go = send, wait_go
        self.windows: dict[str, list[float]] = {}
        self.waited_s: dict[str, float] = {}
        self._open: str | None = None

    def hold(self, what: str) -> None:
        t0 = _mono()
        self.send({"type": "hold", "on": True, "what": what})
        if self.wait_go is not None:
            self.wait_go()
        self.waited_s[what] = round(_mono() - t0, 4)
        self.windows[what] = [_mono()]
        self._open = what

    def release(self) -> None:
        if self._open is None:
            return
        self.windows[self._open].append(_mono())
        self._open = None
        self.send({"type": "hold", "on": False})


def evaluate(job: dict, send: Callable[[dict], None], wait_go: Callable[[], Any] | None = None) -> None:
    """Run one evaluation and `send` one message per stage reached; never raises for candidate faults.

    `wait_go` blocks until the parent lets a GPU-sensitive phase start (None: start at once). The last
    message is the worker's `timeline` (mkb.grader._phases): every second from the job's arrival, by step.
    """
    quiet = _Quiet(send, wait_go)
    line = _Phases()
    box: dict[str, _Evaluation] = {}
    try:
        _evaluate(job, send, quiet, line, box)
    finally:
        quiet.release()
        line.mark("report")
        send({"type": "timeline", "phases_s": _timeline(line, box.get("ev")), "span_s": round(_perf() - line.t0, 6)})


def _timeline(line: _Phases, ev: "_Evaluation | None") -> dict[str, float]:
    """The worker's steps with the trusted plan's and the run's sub-steps spliced in; each step's remainder is `<step>.other`."""
    subs = {"trusted": getattr(ev, "trusted_ph", None), "run": getattr(ev, "ph", None)}
    out: dict[str, float] = {}
    for k, v in line.s.items():
        sub = subs.get(k)
        if sub is None:
            out[k] = v
            continue
        for sk, sv in sub.s.items():
            out[f"{k}.{sk}"] = sv
        out[f"{k}.other"] = round(max(0.0, v - sum(sub.s.values())), 6)
    return out


def _evaluate(job: dict, send: Callable[[dict], None], quiet: _Quiet, line: _Phases, box: dict) -> None:
    ev = box["ev"] = _Evaluation(job, send, quiet)
    supported = ev.device_is_supported()
    line.mark("setup")
    if not supported:
        return
    try:
        ev.trusted()
    except Exception as exc:  # the harness or the problem failed: not the candidate's fault
        line.mark("trusted")
        ev.stage("compile", False, "infra_error", exc.message if isinstance(exc, Fail) else _fmt_exc(exc),
                 **CompileFigures(**guard_figures()).as_dict())
        return
    line.mark("trusted")
    try:
        ev.compile()
        ev.verify()
        ev.time()
        line.mark("run")
        ev.integrity()
        line.mark("integrity")
    except Fail as f:
        line.mark("integrity" if "timing" in ev.reached else "run")
        if f.stage == "integrity" and "compile" not in ev.reached:
            ev.stage("compile", True, None, "", **ev.compile_figures().as_dict())
        ev.stage(f.stage, False, f.reason, f.message)


def needs_sampling(mode: str, *, n_expectations: int, expectation_bytes: int, working_bytes: int | None,
                   free_bytes: int | None) -> bool:
    """Whether the trusted plan keeps its expectations sampled (GraderConfig.expectations).

    "auto" samples only where the whole ones do not fit: the n - 1 further expectations beside the first one's
    measured working peak (its inputs, their fp64 copies, the reference's temporaries and the expectation itself)
    exceed the free device memory left after the timing loop's input sets (a quarter, `_input_budget`). Not a
    tighter budget: problem 56 keeps ~85 GiB of whole expectations and fits an H200 today (its grading peak
    ~87 GiB, benchmarks/full_size_memory.py), and a problem that fits is graded as before (grader 2.3). Without
    a device figure (the CPU) "auto" keeps them whole.
    """
    if mode != "auto":
        return mode == "sampled"
    if free_bytes is None or working_bytes is None:
        return False
    return (n_expectations - 1) * expectation_bytes + working_bytes > free_bytes - free_bytes // 4


def _free_bytes(device: str) -> int | None:
    if device != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info()
    return int(free)


def _measured(device: str, fn: Callable[[], Any]) -> tuple[Any, int | None]:
    """fn() and the device bytes its peak held above what was allocated before it (None off the GPU)."""
    if device != "cuda":
        return fn(), None
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    return out, int(torch.cuda.max_memory_allocated() - base)


class PrefetchDeclined(Exception):
    """A prefetched plan would not be kept as the job's own lazy plan would, or would crowd the grading in flight."""


class _Plan:
    """What the trusted phase fixed before the candidate exists: secret draws with their expected outputs,
    the warm-up count, the re-checked, profiled and content-repeat positions.

    A draw is kept as (secret seed, expectation), and its inputs are made again from the seed where they are
    used (make_inputs is deterministic, which the audit checks): a full-size input set reaches 12 GB and
    keeping all 17 of them (draws, re-checks, the final draw) from here to the end of timing does not fit an
    H200 for several problems (benchmarks/full_size_memory.py). The expectations, the part that must exist
    before the candidate does, are computed here as before; re-making the same values after the import gives
    a candidate nothing it could not see on the call itself.

    Where the whole expectations do not fit beside the timing loop's input sets (`needs_sampling`; 34, 38 and 50 at
    full size), each is computed whole as before and then kept sampled (`mkb.measure.sample`, with a secret seed
    per expectation from the trusted rng); every other problem draws nothing more from the rng and keeps its
    expectations whole, as before.
    """

    def __init__(self, mod: Any, cfg: GraderConfig, rng: random.Random, make: Callable[[int], tuple],
                 fresh_seed: Callable[[], int], *, device: str = "cpu", prefetch: bool = False) -> None:
        free = _free_bytes(device)
        seed = fresh_seed()
        box: dict[str, int] = {}

        def first_expectation() -> Any:
            inputs = make(seed)
            box["input_bytes"] = tensor_bytes(inputs)
            return expect(mod, inputs)

        first, working = _measured(device, first_expectation)
        self.whole_bytes = first.nbytes() * cfg.n_expectations
        self.working_bytes, self.free_bytes, self.input_bytes = working, free, box["input_bytes"]
        self.expectations = "sampled" if needs_sampling(
            cfg.expectations, n_expectations=cfg.n_expectations, expectation_bytes=first.nbytes(),
            working_bytes=working, free_bytes=free) else "whole"
        if prefetch and cfg.expectations == "auto" and self.expectations == "sampled":
            # beside a grading in flight (mkb.grader._prefetch): never a plan kept otherwise than the lazy one would be
            raise PrefetchDeclined("auto would sample the expectations beside the grading in flight")

        def keep(exp: Any) -> Any:
            if self.expectations == "whole":
                return exp
            return sample(exp, seed=fresh_seed(), positions=cfg.sample_positions)

        self.draws = [(seed, keep(first))]
        del first
        if prefetch:
            kept = self.draws[0][1].nbytes() * cfg.n_expectations + self.input_bytes
            if not prefetch_fits(plan_bytes=kept, working_bytes=working, free_bytes=free, fraction=cfg.prefetch_fraction):
                raise PrefetchDeclined(f"the plan ({kept} B kept, {working} B working) exceeds "
                                       f"{free_fraction(cfg.prefetch_fraction):.4f} of the free device memory ({free} B)")
        for _ in range(cfg.draws - 1):
            seed = fresh_seed()
            self.draws.append((seed, keep(expect(mod, make(seed)))))
        self.compile_inputs = make(fresh_seed())
        self.n_warm = cfg.n_warmup + rng.randrange(cfg.warmup_jitter + 1)
        self.n_timed = n_timed = cfg.n_timed
        n_re = max(1, round(cfg.recheck_fraction * n_timed))
        recheck = set(rng.sample(range(n_timed - 1), min(n_re, n_timed - 1))) | {n_timed - 1}
        self.recheck_sets = {}
        for k in sorted(recheck):
            seed = fresh_seed()
            self.recheck_sets[k] = (seed, keep(expect(mod, make(seed))))
        self.final_seed = fresh_seed()
        self.final_expected = keep(expect(mod, make(self.final_seed)))
        kept = [e for _, e in self.draws] + [e for _, e in self.recheck_sets.values()] + [self.final_expected]
        self.kept_bytes = sum(e.nbytes() for e in kept)
        self.sampled_positions = self.final_expected.sampled_positions()
        # profiled calls at secret positions after timed call k; the last repeats an earlier re-check set's content
        first_re = min(recheck)
        self.prof_after = sorted(rng.sample(range(n_timed), min(cfg.n_profiled, n_timed)))
        self.probe_pos = rng.randrange(first_re, n_timed)
        self.probe_src = rng.choice([k for k in recheck if k <= self.probe_pos])


def _maker(mod: Any, dev: _Device, cfg: GraderConfig) -> Callable[[int], tuple]:
    """The worker's one way to make an input set: with one CPU thread (grader 2.20, `one_cpu_thread` says why)."""
    def make(seed: int) -> tuple:
        with one_cpu_thread():
            return tuple(mod.make_inputs(seed, device=dev.torch_device, size=cfg.size))
    return make


# the one plan this worker made ahead of its job (`prepare`), taken by that job's trusted phase or dropped
_PREPARED: dict[str, Any] = {}
_PREPARED_LOG: dict[str, Any] = {}


def _device_code_figures(record: dict | None) -> dict | None:
    """The record as the compile figures keep it: the worker's counts read now (they grow while the kernel compiles)."""
    if record is None:
        return None
    counts = record.get("counts")
    out = {k: v for k, v in record.items() if k != "counts"}
    return {**out, **dict(counts)} if isinstance(counts, dict) else out


def confine_candidate(cfg: GraderConfig, *, reads: Sequence[Path] = ()) -> tuple[FsGuard, SyscallGuard]:
    """Before a candidate is first imported in this process: from then on it (and what it starts) writes only beneath
    the worker's scratch folder and /dev (mkb.grader._fs_guard) and is refused the calls that would let it outlive,
    leave or reach past the worker (mkb.grader._syscall_guard); once per process, idempotent. Only in a grading worker
    (`Worker` names its scratch folder in the environment): a harness run in some other process (a test's own) must
    not confine that process for the rest of its life. Raises `Fail(infra_error)` where `cfg.fs_guard` is "required"
    and Landlock did not confine: called at the end of the trusted phase, so that is never the candidate's fault.
    `reads`: what the grading reads after it besides the system's and its Python's folders, where `cfg.read_guard`
    confines reads too (the kernel file, the folder of its device code made ahead)."""
    if not _FS_GUARD:
        import os

        scratch = os.environ.get(SCRATCH_ENV)
        if not scratch:
            _FS_GUARD.append(FsGuard(False, 0, (), "not in a grading worker (no scratch folder named)"))
            _SYSCALL_GUARD.append(SyscallGuard(False, "not in a grading worker (no scratch folder named)"))
        else:
            try:
                readable = default_readable([Path(scratch), *reads]) if cfg.read_guard == "landlock" else None
                fs = (FsGuard(False, 0, (), "GraderConfig.fs_guard is off") if cfg.fs_guard == "off"
                      else confine_writes([Path(scratch), Path("/dev")], readable=readable))
            except Exception as exc:  # noqa: BLE001 - both "never raise"; were one to, it is recorded, not fatal
                fs = FsGuard(False, 0, (), f"confine_writes raised {type(exc).__name__}: {exc}")
            try:
                sc = (SyscallGuard(False, "GraderConfig.syscall_guard is off") if cfg.syscall_guard == "off"
                      else refuse_escapes())
            except Exception as exc:  # noqa: BLE001
                sc = SyscallGuard(False, f"refuse_escapes raised {type(exc).__name__}: {exc}")
            _FS_GUARD.append(fs)
            _SYSCALL_GUARD.append(sc)
            watch_descendants()  # whatever the candidate starts stays a child of the worker while it lives
            refuse_audit_hooks()  # no hook of the candidate's inside the harness's opens and imports
    fs, sc = _FS_GUARD[0], _SYSCALL_GUARD[0]
    if cfg.fs_guard == "required" and not fs.confined:
        raise Fail("compile", "infra_error", f"GraderConfig.fs_guard is 'required' and this worker's writes could not be "
                   f"confined ({fs.describe()})\nhint: grade on Linux >= 5.13 with landlock among its LSMs (lsm= on the "
                   f"kernel command line), or pass fs_guard='landlock' to grade unconfined and have it recorded")
    if cfg.syscall_guard == "required" and not sc.kept:
        raise Fail("compile", "infra_error", f"GraderConfig.syscall_guard is 'required' and this worker's calls could "
                   f"not be filtered ({sc.describe()})\nhint: grade on x86_64 or aarch64 Linux with seccomp filters, or "
                   f"pass syscall_guard='seccomp' to grade unfiltered and have it recorded")
    return fs, sc


def guard_figures() -> dict[str, str | None]:
    """The two guards as CompileFigures records them (None before `confine_candidate` ran in this process)."""
    return {"fs_guard": _FS_GUARD[0].describe() if _FS_GUARD else None,
            "syscall_guard": _SYSCALL_GUARD[0].describe() if _SYSCALL_GUARD else None}


def _release_device_memory(kind: str) -> None:
    """Hand a dropped plan's blocks back to the driver, so the grading in flight (another process) sees them free."""
    if kind == "cuda":
        _cuda_sync()
        torch.cuda.empty_cache()


def prepare(msg: dict) -> dict:
    """Make a job's trusted plan ahead of the job (mkb.grader._prefetch), before anything of a candidate exists here.

    Exactly what the job's trusted phase would do first: load the problem, seed the job's rng from its secret and build
    `_Plan` (draws, expectations, re-check sets, the compile call's inputs), declining where the plan would be kept
    otherwise than lazily or would crowd the grading in flight. Kept under `plan_key(msg)`; only a job of that key
    takes it. Returns the `prepared` reply (its seconds are the prepare's own, outside the job's wall)."""
    t0 = _perf()
    _PREPARED.clear()
    _PREPARED_LOG.clear()
    sealed = _seal_process()
    cfg = GraderConfig.from_dict(msg.get("config") or {})
    dev = _Device(cfg.device)
    try:
        mod = load_problem(msg["problem"])
        make = _maker(mod, dev, cfg)
        rng = random.Random(msg["secret"])
        plan = _Plan(mod, cfg, rng, make, lambda: rng.getrandbits(62), device=dev.kind, prefetch=True)
        dev.sync()
    except PrefetchDeclined as exc:
        _release_device_memory(dev.kind)
        return {"ok": False, "declined": str(exc), "prepare_s": round(_perf() - t0, 6), "sealed": sealed}
    except Exception as exc:  # noqa: BLE001 - the grader's (the problem, the device), never a candidate's
        _release_device_memory(dev.kind)
        return {"ok": False, "error": _fmt_exc(exc), "prepare_s": round(_perf() - t0, 6), "sealed": sealed}
    key = plan_key(msg)
    prepare_s = round(_perf() - t0, 6)
    _PREPARED.update(key=key, mod=mod, make=make, rng=rng, plan=plan, prepare_s=prepare_s)
    return {"ok": True, "key": key, "prepare_s": prepare_s, "plan_bytes": plan.kept_bytes + plan.input_bytes,
            "expectations": plan.expectations, "sealed": sealed}


def _seal_process() -> bool | None:
    """Make this process non-dumpable (prctl PR_SET_DUMPABLE 0) before it holds a job's plan beside another candidate.

    Why: a prefetched plan (its seeds, re-check and profiled positions) sits in this worker while the grading in
    flight runs its candidate under the same user; reading another process's memory (/proc/PID/mem, ptrace) needs
    ptrace access, which the kernel refuses to a non-dumpable target unless the reader has CAP_SYS_PTRACE. Returns
    whether the flag reads back 0 (None: not Linux / no libc), recorded on the verdict's `prefetch`."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
        return libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE
    except Exception:  # noqa: BLE001 - best effort: recorded, never fatal
        return None


def _take_prepared(job: dict) -> dict | None:
    """The prepared plan if it was made for exactly this job (every field it depends on, the secret included); a plan
    of any other key is dropped, never used, and the job makes its own."""
    if not _PREPARED:
        return None
    prepared = dict(_PREPARED)
    _PREPARED.clear()
    if prepared["key"] == plan_key(job):
        return prepared
    _PREPARED_LOG["discarded"] = True
    kind = GraderConfig.from_dict(job.get("config") or {}).device
    del prepared
    _release_device_memory(kind)
    return None


class _Evaluation:
    """One evaluation as steps in trust order: trusted (nothing of the candidate exists), compile (import and
    first call), verify (secret draws, write check), time (the shared timing loop with its re-checks,
    profiled calls and early stop, then the final draw), integrity (the profiled calls' verdicts)."""

    def __init__(self, job: dict, send: Callable[[dict], None], quiet: _Quiet) -> None:
        self.job, self.send, self.quiet = job, send, quiet
        self.cfg = GraderConfig.from_dict(job.get("config", {}))
        self.dev = _Device(self.cfg.device)
        self.rng = random.Random(job["secret"])
        self.reached: list[str] = []
        self.gpu_model = None
        self.prof_results: list[dict[str, Any]] = []
        self.device_code: dict | None = None  # builds made ahead for this job (mkb.grader._precompile), once trusted

    def fresh_seed(self) -> int:
        return self.rng.getrandbits(62)

    def stage(self, name: str, ok: bool, reason: str | None = None, log: str = "", **figures: Any) -> None:
        self.reached.append(name)
        self.send({"type": "stage", "stage": name, "ok": ok, "reason": reason, "log": log, "figures": figures})

    # ---------------- the device: a GPU of the table, of a checked architecture ----------------
    def device_is_supported(self) -> bool:
        if self.dev.kind != "cuda":
            return True
        try:
            self.gpu_model = identify_gpu(torch.cuda.get_device_name(), torch.cuda.get_device_capability(),
                                          allow_unchecked=self.cfg.allow_unchecked_gpu)
        except UnsupportedGpu as exc:
            self.stage("compile", False, Reason.UNSUPPORTED_GPU.value, str(exc))
            return False
        return True

    # ---------------- trusted phase: nothing of the candidate exists yet ----------------
    def trusted(self) -> None:
        cfg, dev, job, quiet = self.cfg, self.dev, self.job, self.quiet
        t_trusted = _perf()
        ph = self.trusted_ph = _Phases()
        prepared = _take_prepared(job)  # this job's plan if this worker made it ahead (mkb.grader._prefetch), else None
        self.prefetched = prepared is not None
        if prepared is not None:  # the very objects the lazy path below would have made, from the same secret
            self.mod, self.make, self.rng = prepared["mod"], prepared["make"], prepared["rng"]
        else:
            self.mod = load_problem(job["problem"])
            self.make = _maker(self.mod, dev, cfg)
        mod, make = self.mod, self.make
        self.meta = mod.META
        from mkb.grader._backends import backend_from_target

        self.backend = backend_from_target(job.get("backend"), job["dsl"])
        eager_fn = getattr(mod, "eager", None) or mod.reference
        ph.mark("load_problem")
        # nvidia-smi takes a while on some hosts: read the GPU state beside the trusted phase, joined before the snapshot
        gpu_box: dict[str, Any] = {}
        gpu_reader = None
        if dev.kind == "cuda":
            import threading as _threading

            gpu_reader = _threading.Thread(target=lambda: gpu_box.update(state=gpu_state().as_dict()), daemon=True)
            gpu_reader.start()
        if prepared is not None:
            self.plan = plan = prepared["plan"]
        else:
            self.plan = plan = _Plan(mod, cfg, self.rng, make, self.fresh_seed, device=dev.kind)
        ph.mark("draws_and_recheck_sets")
        # before the compile phase message, i.e. before any candidate: what the plan took (the queue's prefetch gate)
        self.send({"type": "plan", "prefetched": self.prefetched, "discarded": _PREPARED_LOG.get("discarded", False),
                   "prepare_s": prepared["prepare_s"] if prepared is not None else None,
                   "kept_bytes": plan.kept_bytes, "input_bytes": plan.input_bytes, "working_bytes": plan.working_bytes,
                   "free_bytes": plan.free_bytes, "expectations": plan.expectations})
        # eager baseline, launch floors and upstream's reference timing, before import; taken from the
        # session cache when the parent has them for this exact (problem, GPU, versions, policy) key
        self.flush = _flusher(dev)
        self.budget = _input_budget(dev)
        ph.mark("flusher_and_budget")
        cached = job.get("trusted") or {}
        eager_fig, floor_fig, ref_fig = cached.get("eager"), cached.get("floor"), cached.get("reference")
        self.fresh: dict[str, Any] = {}
        if eager_fig is None or floor_fig is None or ref_fig is None:
            quiet.hold("trusted_timing")
            ph.mark("quiet_wait")
        if eager_fig is None:
            eager_n = cfg.eager_timed or plan.n_timed
            e_stream = InputStream(lambda i: make(self.fresh_seed()), n_calls=plan.n_warm + eager_n, max_bytes=self.budget,
                                   first_pass=cfg.first_pass)
            ph.mark("eager_inputs")
            dev.warm_clocks(cfg.clock_warm_s, min_s=cfg.clock_warm_min_s)
            ph.mark("clock_warm")
            rec = timed_loop(eager_fn, e_stream, warmup=plan.n_warm, timed=eager_n,
                             window=lambda f: dev.window(f, self.flush), hold=dev.hold())
            e_segments = e_stream.new_segments
            del e_stream
            eager = summarize(rec.times_us, n_warmup=plan.n_warm)
            eager_fig = self.fresh["eager"] = {"median_us": eager.median_us, "iqr_us": eager.iqr_us, "cv": eager.cv,
                                               "n_timed": eager.n_timed, "n_warmup": plan.n_warm, "measured_unix": time.time(),
                                               "host_us_median": statistics.median(rec.host_us) if rec.host_us else None,
                                               "hold_us": rec.hold_us, "input_sets_new_segments": e_segments}
            ph.mark("eager_timing")
        if floor_fig is None:
            floor_times = sorted(dev.window(lambda: None, self.flush)[1] for _ in range(30))
            floor_fig = self.fresh["floor"] = {"window_floor_us": float(floor_times[len(floor_times) // 2]),
                                               "dsl_launch_floor_us": _dsl_launch_floor(self.backend, dev)}
            ph.mark("floors")
        if ref_fig is None:
            # upstream MetaKernelBench's baseline: the fp32 reference timed its way (S_upstream, DESIGN)
            ref = time_upstream(mod.reference, lambda i: make(self.fresh_seed()), warmup=cfg.reference_warmup,
                                timed=cfg.reference_timed, device=dev.torch_device, budget_s=cfg.reference_budget_s)
            ref_fig = self.fresh["reference"] = {"median_us": ref.median_us, "iqr_us": ref.iqr_us, "cv": ref.cv,
                                                 "n_timed": ref.n_timed, "n_warmup": ref.n_warmup, "policy": UPSTREAM_POLICY,
                                                 "measured_unix": time.time()}
            ph.mark("reference_timing")
        quiet.release()
        self.eager_fig, self.floor_fig, self.ref_fig = eager_fig, floor_fig, ref_fig
        if self.fresh:  # before the compile phase message: the parent caches only what arrives ahead of it
            self.send({"type": "trusted", **self.fresh})
        warm_start(dev.kind)
        self.streams = _WARM.get("streams")
        ph.mark("profiler_warm")
        if gpu_reader is not None:
            gpu_reader.join(60)
        self.gpu_before = gpu_box.get("state") or ({"name": "cpu"} if dev.kind != "cuda" else {"name": torch.cuda.get_device_name()})
        ph.mark("gpu_state")
        made = job.get("device_code")
        self.device_code = self._use_device_code(made)
        reads = [Path(job["kernel_path"]).resolve(),
                 *([Path(made["folder"])] if isinstance(made, dict) and isinstance(made.get("folder"), str) else [])]
        confine_candidate(cfg, reads=reads)  # from here on the candidate may run: nothing of the grader's is written after it
        ph.mark("confine")
        self.trusted_s = _perf() - t_trusted
        self.guard = Guard.take(dev.kind)
        self.threads0 = native_threads()
        ph.mark("guard_snapshot")
        self.trusted_phases_s = dict(ph.s)
        self.compile_s: float | None = None
        self.patterns: tuple[str, ...] | None = None

    def _use_device_code(self, made: dict | None) -> dict | None:
        """Builds made ahead for this job (mkb.grader._precompile): read by the DSL's own compiler calls, installed
        before the guard's snapshot; what was made and what the compile then read, for the compile figures."""
        if not isinstance(made, dict):
            return None
        record = {k: v for k, v in made.items() if k != "folder"}  # DeviceCode.as_dict(), as the parent sent it
        folder = made.get("folder")
        if made.get("state") == "ready" and isinstance(folder, str):
            try:
                counts = self.backend.use_device_code(Path(folder))
            except Exception as exc:  # noqa: BLE001 - then the worker compiles everything itself, as without one
                record["note"] = f"not used: {type(exc).__name__}: {exc}"[:300]
            else:
                return {**record, "counts": counts}
        return record

    def compile_figures(self) -> CompileFigures:
        return CompileFigures(compile_s=self.compile_s, kernel_patterns=list(self.patterns) if self.patterns is not None else None,
                              trusted_s=self.trusted_s, trusted_phases_s=self.trusted_phases_s,
                              quiet_wait_s=dict(self.quiet.waited_s), warm_start_s=warm_start_steps(),
                              hold_build=_WARM.get("hold_build"),
                              device_code=_device_code_figures(self.device_code),
                              **guard_figures())

    # ---------------- compile: import + first call (the JIT build) ----------------
    def compile(self) -> None:
        guard, dev = self.guard, self.dev
        self.ph = _Phases()
        self.send({"type": "phase", "phase": "compile"})
        t0 = _perf()
        try:
            module = self.backend.load(Path(self.job["kernel_path"]))
        except SystemExit as exc:
            raise Fail("integrity", "integrity_exit", f"kernel.py raised SystemExit({exc.code!r}) on import") from None
        except BaseException as exc:  # noqa: BLE001
            reason = "compile_error" if _looks_like_compile_error(exc, self.backend) else "import_error"
            raise Fail("compile", reason, _fmt_exc(exc)) from None
        solve = getattr(module, "solve", None)
        if not callable(solve):
            raise Fail("compile", "no_solve", "kernel.py defines no callable `solve`")
        bad = guard.check()
        if bad:
            self.compile_s = _perf() - t0
            self.stage("compile", True, None, "import changed harness state", **self.compile_figures().as_dict())
            raise Fail("integrity", *bad)
        try:
            before = python_threads()
            solve(*clone_inputs(self.plan.compile_inputs))
            dev.sync()
        except SystemExit as exc:
            raise Fail("integrity", "integrity_exit", f"solve raised SystemExit({exc.code!r})") from None
        except BaseException as exc:  # noqa: BLE001
            raise Fail("compile", "compile_error" if _looks_like_compile_error(exc, self.backend) else "runtime_error", _fmt_exc(exc)) from None
        self.compile_s = _perf() - t0
        try:
            patterns = tuple(self.backend.kernel_name_patterns(module))
        except Exception as exc:  # noqa: BLE001
            raise Fail("compile", "compile_error", f"kernel_name_patterns failed: {_fmt_exc(exc)}") from None
        bad = guard.check(threads=before)
        if bad:
            self.stage("compile", True, None, "", **self.compile_figures().as_dict())
            raise Fail("integrity", *bad)
        self.patterns = patterns
        self.solve = solve
        self.stage("compile", True, None, "", **self.compile_figures().as_dict())
        self.send({"type": "phase", "phase": "run"})
        self.ph.mark("compile")  # so that run_phases_s' verification steps hold no compile time

    # ---------------- verification: fresh secret draws, one a pointer-reuse probe, the write check ----------------
    def verify(self) -> None:
        meta, dev, guard, solve = self.meta, self.dev, self.guard, self.solve
        draws = self.plan.draws
        details, worst_err, worst_tol, copied_max = [], 0.0, None, 0.0
        first: tuple = ()
        for k, (seed, exp) in enumerate(draws):
            inputs = self.make(seed)
            if k == 0:
                first = inputs
            if k == 2:  # same addresses as draw 0, new values: a pointer-keyed cache returns draw 0's answer
                for dst, src in zip(first, inputs):
                    if isinstance(dst, _tensor_type):
                        dst.copy_(src)
                inputs = first
            if k >= 2:
                first = ()
            pristine = clone_inputs(inputs)
            _poison(exp)
            self.ph.mark("verify_inputs")
            before = python_threads()
            watch = CopyWatch(inputs)  # the write check: which output elements torch copies produced
            with watch:
                out = _call(solve, inputs, "verification")
            dev.sync()
            self.ph.mark("verify_calls")
            bad = guard.check(threads=before)
            if bad:
                raise Fail("integrity", *bad)
            unchanged = inputs_unchanged(pristine, inputs, names=meta.inputs, mutates=meta.mutates)
            if not unchanged.ok:
                raise Fail("verification", str(unchanged.reason), unchanged.message)
            cmp = compare(exp, out, inputs_after=inputs, input_names=meta.inputs)
            if cmp.ok:
                share = copy_share(_as_tuple(out), watch.writes, before=_mutated_before(meta, pristine))
                copied_max = max(copied_max, share.fraction)
                if share.too_much:
                    raise Fail("integrity", share.reason,
                               f"draw {k}: {share.copied} of the {share.produced} output elements the call produced were put "
                               f"there by torch copies of input data ({share.from_host} from host memory) and not rewritten "
                               f"by a DSL kernel (more than {MAX_COPIED_FRACTION:.0%}): the DSL kernels must compute the outputs")
            del watch
            details.append({"draw": k, "ok": cmp.ok, "checks": [
                {"name": c.name, "ok": c.ok, "max_abs_err": c.max_abs_err, "tolerance": c.tolerance} for c in cmp.checks]})
            if not cmp.ok:
                raise Fail("verification", str(cmp.reason), f"draw {k}: {cmp.message}")
            for c in cmp.checks:
                if c.max_abs_err is not None and c.max_abs_err >= worst_err:
                    worst_err, worst_tol = c.max_abs_err, c.tolerance
            del out
            self.ph.mark("verify_checks")
        plan = self.plan
        self.stage("verification", True, None, "", **VerificationFigures(
            draws=len(draws), max_abs_err=worst_err, tolerance=worst_tol, details=details, copied_fraction_max=copied_max,
            expectations=plan.expectations, sampled_positions=plan.sampled_positions, expectations_kept_bytes=plan.kept_bytes,
            expectations_whole_bytes=plan.whole_bytes, expectation_working_bytes=plan.working_bytes,
            device_free_bytes=plan.free_bytes).as_dict())

    # ---------------- timing: fresh values and addresses, L2 flushed, secret re-checks ----------------
    def _check_guard(self, threads: set) -> None:
        """The guard after a profiled call, threads and processes included: run also right before the call's trace is
        written to the scratch folder and read back, which whatever the candidate left running could rewrite."""
        bad = self.guard.check(identities=False, threads=threads)
        if bad:
            raise Fail("integrity", *bad)

    def _profiled(self, k: int, is_probe: bool) -> None:
        """One call under the profiler (untimed): which kernels ran, what moved to the host, and its limits."""
        plan, meta, dev, solve = self.plan, self.meta, self.dev, self.solve
        p_args = self.make(plan.recheck_sets[plan.probe_src][0] if is_probe else self.fresh_seed())
        limits = _call_limits(meta, p_args)
        self.flush()
        dev.sync()
        before = python_threads()
        figs: dict[str, Any] = {}
        if dev.kind == "cuda":
            try:
                p_out, trace = profile_call(lambda: _call(solve, p_args, "timing"), dev.sync,
                                            before_export=lambda: self._check_guard(before))
            except Fail:
                raise
            except Exception as exc:  # noqa: BLE001 - the profiler failed: fail closed
                raise Fail("integrity", "integrity_profiler", _fmt_exc(exc)) from None
            reason, msg = classify(trace, self.patterns or (), streams=self.streams, limits=limits)
            figs = call_figures(trace, self.patterns or ())
            launches = list(trace.launches)
        else:
            p_out, launches, reason, msg = _call(solve, p_args, "timing"), [], None, "no profiler on cpu (test mode)"
        self._check_guard(before)
        if is_probe:
            cmp = compare(plan.recheck_sets[plan.probe_src][1], p_out, inputs_after=p_args, input_names=meta.inputs)
            if not cmp.ok:
                raise Fail("timing", "integrity_recheck", f"repeated-content call: {cmp.reason}: {cmp.message}")
        self.prof_results.append({"after_timed": k, "content_repeat": is_probe, "reason": reason, "message": msg,
                                  "kernels": [l.name for l in launches],
                                  "streams": sorted({l.stream for l in launches if l.stream is not None}),
                                  **figs, "limits": limits.as_dict()})
        del p_out

    def _floor_tails(self, hold_us: float | None, n: int = FLOOR_CALLS) -> tuple[list[float], float | None]:
        """The tails of `n` empty calls through the candidate's window (the side-work check's floor) and the SM hold
        they ran behind (None off the GPU). `hold_us` (an A/B arm, `GraderConfig.floor_hold_us`): that hold instead
        of the one set now (the default, outside a timing loop); what was set is restored after."""
        hold = self.dev.hold()
        prev = hold.us if hold is not None else None
        if hold is not None and hold_us is not None:
            hold.set_us(hold_us)
        try:
            return [self.dev.window(lambda: None, self.flush)[2] for _ in range(n)], (hold.us if hold is not None else None)
        finally:
            if hold is not None:
                hold.set_us(prev)

    def _profiled_at(self, k: int) -> None:
        plan = self.plan
        for is_probe in ([False] if k in plan.prof_after else []) + ([True] if k == plan.probe_pos else []):
            self._profiled(k, is_probe)

    def time(self) -> None:
        plan, meta, dev, guard, solve, cfg, quiet = self.plan, self.meta, self.dev, self.guard, self.solve, self.cfg, self.quiet
        ph = self.ph
        ph.mark("verification")
        flush = self.flush
        n_warm, n_timed, recheck_sets = plan.n_warm, plan.n_timed, plan.recheck_sets
        state = {"rechecked": 0, "t_timed": 0.0, "before": None, "recheck_s": 0.0}

        # every call's set made up front when they fit (no allocator traffic between calls, so the
        # candidate's own allocations behave the same in every window); else a ring of fresh sets.
        # Re-check calls get their pre-import draw made again from its seed: same allocation pattern as the rest.
        def source(i: int) -> tuple:
            k = i - n_warm
            return self.make(recheck_sets[k][0] if k in recheck_sets else self.fresh_seed())

        def before_call(i: int) -> None:
            state["before"] = python_threads()

        def after_call(k: int, out: Any, args: Sequence[Any], us: float) -> None:
            state["t_timed"] += us * 1e-6
            # a re-checked call's comparison runs only after the watched names are read again (0.4 ms): a kernel that
            # rebinds a torch function in one call and restores it in the next cannot steer the re-check between
            bad = guard.check(identities=k in recheck_sets, threads=state["before"], processes=False)
            if bad:
                raise Fail("integrity", *bad)
            if k in recheck_sets:
                state["rechecked"] += 1
                t0 = _perf()
                cmp = compare(recheck_sets[k][1], out, inputs_after=args, input_names=meta.inputs)
                state["recheck_s"] += _perf() - t0
                if not cmp.ok:
                    raise Fail("timing", "integrity_recheck", f"timed call {k} (of {n_timed}, after {n_warm} warm-ups): {cmp.reason}: {cmp.message}")

        def between_calls(k: int, rec: LoopRecord) -> bool:
            if k >= 0 and (k in plan.prof_after or k == plan.probe_pos):
                ph.mark("timing_loop")
                self._profiled_at(k)
                ph.mark("profiled_calls")
            return k >= 0 and cfg.early_stop and timing_decided(
                rec.times_us, n_planned=n_timed, eager_median_us=self.eager_fig["median_us"], min_calls=min(MIN_TIMED, n_timed))

        quiet.hold("timing")
        ph.mark("quiet_wait")
        c_stream = InputStream(source, n_calls=n_warm + n_timed, base_seed=0, max_bytes=self.budget, first_pass=cfg.first_pass)
        ph.mark("timing_inputs")
        clock_warm = dev.warm_clocks(cfg.clock_warm_s, min_s=cfg.clock_warm_min_s)
        ph.mark("clock_warm")
        # empty calls through the same window in this process: the host's sync latency after `end`,
        # against which the candidate's tails are compared (work left on another stream)
        floor_tails, floor_hold_us = self._floor_tails(cfg.floor_hold_us)
        ph.mark("floor_tails")
        rec = timed_loop(lambda *args: _call(solve, args, "timing"), c_stream, warmup=n_warm, timed=n_timed,
                         window=lambda f: dev.window(f, flush), before_call=before_call, after_call=after_call,
                         between_calls=between_calls, hold=dev.hold())
        times, tails = rec.times_us, rec.tails_us
        if rec.stopped_after is not None:
            # the integrity calls planned after the stop still run: stopping early never skips a check
            # of what the kernel launches (the skipped timed calls' re-checks are covered by the final draw)
            ph.mark("timing_loop")
            later = {p for p in plan.prof_after if p > rec.stopped_after}
            if plan.probe_pos > rec.stopped_after:
                later.add(plan.probe_pos)
            for k in sorted(later):
                self._profiled_at(k)
            ph.mark("profiled_calls")
        dev.sync()
        ph.mark("timing_loop")
        # the empty calls' tails again, in the process's state after the loop (its profiled calls leave the
        # profiler's host-side work behind): the side-work check compares against the later of the two
        floor_tails_after, _ = self._floor_tails(cfg.floor_hold_us)
        ph.mark("floor_tails")
        quiet.release()
        cap, new_segments, first_pass_segments = c_stream.capacity, c_stream.new_segments, c_stream.first_pass_new_segments
        set_bytes, made = c_stream.set_bytes, c_stream.made.as_dict()
        del c_stream
        ph.mark("timing_loop")
        bad = guard.check()
        if bad:
            raise Fail("integrity", *bad)
        after_box: dict[str, Any] = {}
        after_reader = None
        if dev.kind == "cuda":
            import threading as _threading

            after_reader = _threading.Thread(target=lambda: after_box.update(state=gpu_state().as_dict()), daemon=True)
            after_reader.start()
        # the final correctness pass after the loop (a kernel that turns wrong after N calls)
        final_args = self.make(plan.final_seed)
        pristine = clone_inputs(final_args)
        _poison(plan.final_expected)
        out = _call(solve, final_args, "timing")
        dev.sync()
        cmp = compare(plan.final_expected, out, inputs_after=final_args, input_names=meta.inputs)
        if not cmp.ok:
            raise Fail("timing", "integrity_recheck", f"post-timing draw: {cmp.reason}: {cmp.message}")
        unchanged = inputs_unchanged(pristine, final_args, names=meta.inputs, mutates=meta.mutates)
        if not unchanged.ok:
            raise Fail("verification", str(unchanged.reason), f"post-timing draw: {unchanged.message}")
        del out
        cand = summarize(times, n_warmup=n_warm)
        left_behind = min(side_work_us(tails, floor_tails), side_work_us(tails, floor_tails_after))
        if dev.kind == "cuda" and left_behind > max(SIDE_WORK_MIN_US, SIDE_WORK_FRACTION * cand.median_us):
            raise Fail("integrity", "integrity_stream",
                       f"the device stayed busy {left_behind:.1f} us (median) longer after the call's last launch on the "
                       f"current stream than after an empty call (tail median {statistics.median(tails):.1f} us; empty "
                       f"calls before/after the loop {statistics.median(floor_tails):.1f}/"
                       f"{statistics.median(floor_tails_after):.1f} us): work on another stream outside the timed window")
        if after_reader is not None:
            after_reader.join(60)
        gpu_after = after_box.get("state") or ({"name": "cpu"} if dev.kind != "cuda" else {})
        ph.mark("final_check")
        eager, floor, ref = self.eager_fig, self.floor_fig, self.ref_fig
        dsl_floor = floor.get("dsl_launch_floor_us")
        gm = self.gpu_model
        self.stage("timing", True, None, "", **TimingFigures(
            median_us=cand.median_us, iqr_us=cand.iqr_us, cv=cand.cv, eager_median_us=eager["median_us"],
            eager_iqr_us=eager["iqr_us"], eager_cv=eager["cv"], n_warmup=n_warm, n_timed=cand.n_timed,
            n_timed_planned=n_timed, stopped_early=rec.stopped_after is not None,
            eager_cached="eager" not in self.fresh, eager_measured_unix=eager.get("measured_unix"),
            reference_median_us=ref["median_us"], reference_n_timed=ref.get("n_timed"),
            reference_policy=ref.get("policy"), reference_cached="reference" not in self.fresh,
            launch_floor_us=dsl_floor if dsl_floor is not None else floor["window_floor_us"],
            window_floor_us=floor["window_floor_us"], dsl_launch_floor_us=dsl_floor, timing_policy=TIMING_POLICY,
            gpu=self.gpu_before.get("name"), gpu_model=gm.model if gm else None, gpu_arch=gm.arch if gm else None,
            clocks={"before": self.gpu_before, "after": gpu_after},
            rechecked=state["rechecked"] + 1, timed_s=state["t_timed"], times_us=[round(t, 3) for t in times],
            input_sets_alive=cap, input_sets_new_segments=new_segments, input_sets_first_pass_segments=first_pass_segments,
            input_set_bytes=set_bytes, input_budget_bytes=self.budget, input_sets_made=made,
            eager_input_sets_new_segments=eager.get("input_sets_new_segments"), run_phases_s=dict(ph.s),
            tail_us_median=float(sorted(tails)[len(tails) // 2]) if tails else None,
            floor_tail_us_median=float(sorted(floor_tails)[len(floor_tails) // 2]) if floor_tails else None,
            floor_hold_us=floor_hold_us,
            floor_tail_after_us_median=statistics.median(floor_tails_after) if floor_tails_after else None,
            host_us_median=statistics.median(rec.host_us) if rec.host_us else None, hold_us=rec.hold_us,
            loop_split_s={part: round(s, 4) for part, s in rec.split_s.items()}, recheck_s=round(state["recheck_s"], 4),
            eager_host_us_median=eager.get("host_us_median"),
            side_work_us=left_behind, quiet_wait_s=dict(quiet.waited_s), clock_warm=clock_warm,
            quiet_windows_monotonic={k: [round(x, 6) for x in v] for k, v in quiet.windows.items()},
        ).as_dict())

    # ---------------- integrity: profiled calls, then the native thread count ----------------
    def integrity(self) -> None:
        kernels_seen = sorted({n for r in self.prof_results for n in r["kernels"]})
        for r in self.prof_results:
            if r["reason"]:
                raise Fail("integrity", r["reason"], r["message"])
        self.stage("integrity", True, None, "", **IntegrityFigures(
            kernels_seen=kernels_seen, profiled=self.prof_results, native_threads_before=self.threads0,
            native_threads_after=native_threads(), profiler=self.dev.kind == "cuda").as_dict())


def _input_budget(dev: _Device) -> int | None:
    """Bytes the pre-made input sets of one timing loop may take: a quarter of the free device memory."""
    if dev.kind != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info()
    return free // 4


def _flusher(dev: _Device) -> Callable[[], None]:
    if dev.kind != "cuda":
        return lambda: None
    f = L2Flusher("cuda")
    return f.flush


def _dsl_launch_floor(backend: Any, dev: _Device) -> float | None:
    """An empty kernel of the DSL through the same window, if the backend can build one."""
    make_empty = getattr(backend, "empty_kernel", None)
    if make_empty is None or dev.kind != "cuda":
        return None
    try:
        fn = make_empty()
        for _ in range(3):
            fn()
        dev.sync()
        ts = sorted(dev.window(fn, _flusher(dev))[1] for _ in range(30))
        return float(ts[len(ts) // 2])
    except Exception:  # noqa: BLE001 - the floor is informative; its absence is recorded as None
        return None


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _mutated_before(meta: Any, pristine: tuple) -> dict[int, Any]:
    """Output index -> that input's content before the call, for outputs that are mutated inputs (only what
    the call changed there was produced by it)."""
    out = {}
    for i, o in enumerate(meta.outputs):
        name = getattr(o, "name", o)
        if name in meta.mutates and name in meta.inputs:
            out[i] = pristine[meta.inputs.index(name)]
    return out


def _call_limits(meta: Any, args: tuple) -> CallLimits:
    """The call's bounds from the problem's declared structure inputs (DESIGN, Grader: integrity)."""
    idx = [meta.inputs.index(n) for n in meta.structure_inputs if n in meta.inputs]
    return CallLimits.for_call(structure_bytes=tensor_bytes([args[i] for i in idx if i < len(args)]),
                               n_structure=len(idx), n_inputs=len(meta.inputs), n_outputs=len(meta.outputs))
