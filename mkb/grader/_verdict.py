"""What one evaluation concluded: per-stage results and the frozen `Verdict` a caller gets back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from mkb.reasons import Reason
from mkb.scoring import THRESHOLDS, r_at, s_score, s_upstream


@dataclass(frozen=True)
class StageResult:
    """One stage (compile, verification, timing, integrity) as the worker reported it."""

    stage: str
    ok: bool
    reason: str | None = None
    figures: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    log: str = ""

    @property
    def timing(self) -> "TimingFigures | None":
        """The timing stage's figures, typed (None for another stage or a failed timing)."""
        return TimingFigures.from_figures(self.figures) if self.stage == "timing" and self.ok else None

    @property
    def typed(self) -> "CompileFigures | VerificationFigures | TimingFigures | IntegrityFigures":
        """This stage's figures as its typed record (fields it did not report are None)."""
        return _FIGURES[self.stage].from_figures(self.figures)


class _Figures:
    """Typed figures of one stage: built by the harness, sent as a dict (`as_dict`), read back with `from_figures`."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_figures(cls, f: dict[str, Any]):
        names = {x.name for x in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in f.items() if k in names})


@dataclass(frozen=True)
class CompileFigures(_Figures):
    """The compile stage: import + first call, and what the trusted phase before it cost."""

    compile_s: float | None = None
    kernel_patterns: list[str] | None = None
    trusted_s: float | None = None
    trusted_phases_s: dict[str, float] | None = None
    quiet_wait_s: dict[str, float] | None = None
    # grader 2.10: the worker's GPU warm start by step, in seconds: cuda_context_and_profiler_init (the profiler's first
    # use is the worker's first CUDA use, so it creates the context too), sm_clock, hold_compile, first_use; since 2.11
    # hold_nvrtc_before_go first (before `imported`, not under the quiet rule)
    warm_start_s: dict[str, float] | None = None
    # grader 2.11: how the warm start got the SM hold: "prebuilt" (the cubin NVRTC built before `imported`, step
    # hold_nvrtc_before_go, loaded) or "compiled (why not)" (as in 2.10)
    hold_build: str | None = None
    # grader 2.14: what the worker could write from the candidate's import on (mkb.grader._fs_guard): "landlock abi N:
    # writes only beneath <its scratch>, /dev", or "not confined: why" (a kernel without Landlock, or GraderConfig.fs_guard off)
    fs_guard: str | None = None
    # grader 2.15: the calls refused to the candidate (mkb.grader._syscall_guard): "seccomp: setsid, setpgid, socket, ...
    # refused ...", or "not kept: why" (no table for the machine, no seccomp, GraderConfig.syscall_guard off)
    syscall_guard: str | None = None
    # grader 2.17: the device code made ahead for this job (mkb.grader._precompile): state ("ready", "late", "failed";
    # None: none was asked, as in a grading outside a queue), seconds, sources and builds made, and the worker's own
    # compiler calls that read a build (hits), found none (misses) or could not be keyed (uncacheable)
    device_code: dict[str, Any] | None = None
    # graders 2.4-2.9 recorded two of those steps on their own; kept so their events read back whole, never written now
    profiler_init_at_warm_start_s: float | None = None
    first_use_at_warm_start_s: float | None = None


@dataclass(frozen=True)
class VerificationFigures(_Figures):
    """The verification stage: the secret draws compared, and the write check's worst share."""

    draws: int | None = None
    max_abs_err: float | None = None
    tolerance: float | None = None
    details: list[dict[str, Any]] | None = None
    copied_fraction_max: float | None = None  # the largest share of an answer torch copies produced (mkb.grader._provenance)
    # grader 2.3: how the expectations were kept ("whole", or "sampled" where the whole ones do not fit the device),
    # output name -> positions compared for each sampled output (every draw, re-check and the final draw alike),
    # the bytes kept, the bytes the whole ones would have kept, the first expectation's working peak and the free
    # device memory the decision was taken against (None off the GPU)
    expectations: str | None = None
    sampled_positions: dict[str, int] | None = None
    expectations_kept_bytes: int | None = None
    expectations_whole_bytes: int | None = None
    expectation_working_bytes: int | None = None
    device_free_bytes: int | None = None


@dataclass(frozen=True)
class TimingFigures(_Figures):
    """What a passed timing stage measured: the figures a verdict is computed from, and the timing's record."""

    median_us: float | None = None
    eager_median_us: float | None = None
    iqr_us: float | None = None
    cv: float | None = None
    eager_iqr_us: float | None = None
    eager_cv: float | None = None
    n_warmup: int | None = None
    n_timed: int | None = None  # timed calls made (fewer than planned when timing stopped early)
    n_timed_planned: int | None = None
    stopped_early: bool = False
    eager_cached: bool | None = None
    eager_measured_unix: float | None = None
    reference_median_us: float | None = None  # the problem's reference, timed as upstream MetaKernelBench times it
    reference_n_timed: int | None = None
    reference_policy: str | None = None
    reference_cached: bool | None = None
    launch_floor_us: float | None = None
    window_floor_us: float | None = None
    dsl_launch_floor_us: float | None = None
    timing_policy: str | None = None
    gpu: str | None = None  # the device's name as the driver reports it
    gpu_model: str | None = None  # the GPU table's key (H200, B200, ...)
    gpu_arch: str | None = None
    clocks: dict[str, Any] | None = None
    rechecked: int | None = None
    timed_s: float | None = None
    times_us: list[float] | None = None
    input_sets_alive: int | None = None
    # policy v5: device segments created while the timed sets were made (0: all in recycled blocks); the eager's in eager_*
    input_sets_new_segments: int | None = None
    eager_input_sets_new_segments: int | None = None
    # segments the candidate loop's first set and first pass created (0: the worker had the blocks cached already)
    input_sets_first_pass_segments: int | None = None
    input_set_bytes: int | None = None  # one set's bytes; with the budget (a quarter of the free memory) they set the capacity
    input_budget_bytes: int | None = None
    # grader 2.19: where the candidate loop's `timing_inputs` went (mkb.measure.InputsMade: first pass and make seconds,
    # CPU seconds, the allocator's device mallocs, frees and retries)
    input_sets_made: dict[str, Any] | None = None
    run_phases_s: dict[str, float] | None = None
    tail_us_median: float | None = None
    floor_tail_us_median: float | None = None
    floor_tail_after_us_median: float | None = None  # empty calls' tails after the loop (the side-work check takes the later floor)
    floor_hold_us: float | None = None  # the SM hold the empty calls ran behind (GraderConfig.floor_hold_us; None off the GPU)
    host_us_median: float | None = None  # the candidate's host dispatch per call (not in the time; mkb.measure)
    eager_host_us_median: float | None = None
    hold_us: float | None = None  # the SM hold in front of each timed window (mkb.measure.timed_loop's rule)
    # the candidate loop's wall seconds by part (mkb.measure.LOOP_PARTS: inputs, before, window, after, between;
    # grader 2.21): which part of `timing_loop` beyond the windows an overhead cut would aim at
    loop_split_s: dict[str, float] | None = None
    # grader 2.22: the seconds of `loop_split_s["after"]` spent comparing the re-checked calls' outputs (the rest is the
    # guard's per-call check)
    recheck_s: float | None = None
    side_work_us: float | None = None
    quiet_wait_s: dict[str, float] | None = None
    quiet_windows_monotonic: dict[str, list[float]] | None = None
    # grader 2.5: the candidate loop's clock warm-up: SM clock before it, rounds, seconds, ended by "clock" or "time"
    clock_warm: dict[str, Any] | None = None

    @property
    def speedup(self) -> float | None:
        return _ratio(self.eager_median_us, self.median_us)

    @property
    def speedup_upstream(self) -> float | None:
        return _ratio(self.reference_median_us, self.median_us)


@dataclass(frozen=True)
class IntegrityFigures(_Figures):
    """The integrity stage: the profiled calls (kernels, streams, the limits and the figures they were checked on)."""

    kernels_seen: list[str] | None = None
    profiled: list[dict[str, Any]] | None = None
    native_threads_before: int | None = None
    native_threads_after: int | None = None
    profiler: bool | None = None


_FIGURES = {"compile": CompileFigures, "verification": VerificationFigures, "timing": TimingFigures,
            "integrity": IntegrityFigures}


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


@dataclass(frozen=True)
class Verdict:
    """The grade of one kernel. `passed` means correct and integrity-clean; `reason` names the first failure."""

    evaluation_id: str
    problem: int
    dsl: str
    kernel_sha256: str
    passed: bool
    reason: str | None
    speedup: float | None
    eager_median_us: float | None
    candidate_median_us: float | None
    gpu: str
    stages: tuple[StageResult, ...] = ()
    wall_s: float | None = None  # request to verdict
    overhead_s: float | None = None  # wall_s minus the candidate's compile and timed-call time
    worker_wait_s: float | None = None  # time spent waiting for a warm worker (0 when one was ready)
    queue_wait_s: float | None = None  # submit to start in a GradingQueue (an agent's working time excludes it)
    message: str = ""
    gpu_model: str | None = None  # the GPU table's key (H200, B200, ...); `gpu` is the driver's name
    gpu_arch: str | None = None
    timed_calls: int | None = None  # timed calls the candidate got (fewer than planned after an early stop)
    reference_median_us: float | None = None  # the problem's reference timed as upstream MetaKernelBench times it
    speedup_upstream: float | None = None  # reference_median_us / candidate_median_us (upstream's baseline)
    problem_hash: str | None = None  # mkb.problems.problem_hash of the problem graded (None: not a catalog problem)
    # grader 2.4: every second of wall_s by named phase, summing to wall_s; the phases outside `kernel.*` sum to
    # overhead_s (mkb.grader._phases). None for a verdict built without the parent's clock.
    phases_s: dict[str, float] | None = field(default=None, hash=False, compare=False)
    # grader 2.5: how the trusted plan was made (mkb.grader._prefetch): state ("none": in its trusted phase, as
    # before; "ready": made ahead and used, `plan_used` as the worker said; ...), the seconds the job waited for it (in
    # phases_s as parent.prefetch_wait), the prepare's own seconds (before the job: not in wall_s). None: a verdict
    # built outside `grade_with`
    prefetch: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    # grader 2.5: seconds from the end of the previous grading on this queue's device to this one's start (None: the
    # first, or not in a queue); beside the timing's `clock_warm`, whether a warm-up right after another can be cut
    device_idle_s: float | None = None

    @property
    def r_at(self) -> dict[float, bool]:
        return r_at(self.passed, self.speedup)

    @property
    def s(self) -> float:
        return s_score(self.passed, self.speedup)

    @property
    def s_upstream(self) -> float:
        return s_upstream(self.passed, self.speedup_upstream)

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["r_at"] = {str(k): v for k, v in self.r_at.items()}
        d["s"] = self.s
        d["s_upstream"] = self.s_upstream
        return d


def exit_failure(*, phase: str, exit_status: int | None) -> tuple[str, str]:
    """(reason, note) for a worker that ended without the harness's completion message.

    Whose fault is decided by how far the worker got: before the compile phase (the candidate was
    not yet imported) the death is the host's (`infra_error`, retried and excluded); from the import
    on it is the candidate's and counts as a submission (`crash`, or `integrity_exit` for a clean
    exit), so a kernel cannot buy uncounted probes by killing its own process when it is wrong.
    """
    if phase == "setup":
        return Reason.INFRA_ERROR.value, f"the worker died (exit status {exit_status}) before the candidate was imported"
    if exit_status == 0:
        return Reason.INTEGRITY_EXIT.value, "the worker exited with status 0 before the harness finished (os._exit or similar)"
    return Reason.CRASH.value, f"the worker died (exit status {exit_status}) during the {phase} phase, after importing the candidate"


def timeout_failure(phase: str) -> str:
    """The reason when a phase runs past its limit: the trusted phase (before the import) is the host's."""
    if phase == "setup":
        return Reason.INFRA_ERROR.value
    return Reason.COMPILE_TIMEOUT.value if phase == "compile" else Reason.TIMEOUT.value


def missing_stages_reason(phase: str) -> str:
    """The reason when the worker reported `done` without every stage: the candidate's (`crash`) once it was
    imported (a forged completion message must not be a free probe), the host's before."""
    return Reason.INFRA_ERROR.value if phase == "setup" else Reason.CRASH.value


def timing_decided(times_us: list[float] | tuple[float, ...], *, n_planned: int, eager_median_us: float,
                   min_calls: int = 50) -> bool:
    """True when more timed calls cannot change the candidate's R@t (hence S): the grader then stops timing.

    The final median of `n_planned` calls lies between the median with every remaining call taking no
    time and the one with every remaining call taking forever; if even the first leaves the speedup
    below the lowest threshold above 0, the thresholds it reaches are decided (R@0 only, S = 20 if it
    passes). Only that side stops early: a kernel that reaches a threshold keeps every planned call, so
    the medians of passing kernels (and baselines) are measured exactly as before. Never before
    `min_calls` (DESIGN's minimum) nor before more than half of the calls were made (until then the
    optimistic median is 0).
    """
    n = len(times_us)
    if n >= n_planned or n < min(min_calls, n_planned) or 2 * n <= n_planned or eager_median_us <= 0:
        return False
    missing = n_planned - n
    optimistic = sorted([0.0] * missing + list(times_us))
    mid = n_planned // 2
    med = optimistic[mid] if n_planned % 2 else (optimistic[mid - 1] + optimistic[mid]) / 2
    lowest = min(t for t in THRESHOLDS if t > 0)
    return med > 0 and eager_median_us / med < lowest
