"""The grader's knobs: how many draws, warm-ups and timed calls, and the wall limits of one evaluation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


# GraderConfig.set_first_pass's values: mkb.measure.FIRST_PASSES with None spelled "none" (kept here, torch-free; a
# test holds the two together)
SET_FIRST_PASSES = ("allocate", "make", "none")
FS_GUARDS = ("landlock", "required", "off")  # GraderConfig.fs_guard (mkb.grader._fs_guard)
SYSCALL_GUARDS = ("seccomp", "required", "off")  # GraderConfig.syscall_guard (mkb.grader._syscall_guard)
READ_GUARDS = ("off", "landlock")  # GraderConfig.read_guard (mkb.grader._fs_guard.default_readable)
READ_GUARD_DEFAULT = "landlock"  # GraderConfig's and a Precompiler's made without one
PRECOMPILES = ("on", "off")  # GraderConfig.precompile (mkb.grader._precompile)


@dataclass(frozen=True)
class GraderConfig:
    """Policy of one evaluation. The defaults are DESIGN's minimums or above; tests shrink them.

    Why the counts: >= 5 correctness draws with secret seeds; >= 10 warm-ups (plus a secret jitter,
    so a kernel cannot count its way out of the warm-up) and >= 50 timed calls (100 by default).
    The median's stability comes from the window, not the count: on the H200 the old window's host
    time moved problem 28's median 17-30% between gradings; mkb.measure's stream window gives
    0.3-0.5% over 5 gradings. A random ~10% of timed calls and the last one are re-checked; a few
    calls at secret positions run under the profiler (their times are kept apart, since the
    profiler slows them), one of them a repeat of earlier content at fresh addresses (a content cache
    then launches no DSL kernel).
    Early stop: a kernel so slow that no threshold above 0 can be reached whatever its remaining calls
    take stops timing after max(50, half the calls + 1); see `timing_decided`.
    """

    draws: int = 5
    n_warmup: int = 10
    warmup_jitter: int = 6
    n_timed: int = 100
    recheck_fraction: float = 0.1
    n_profiled: int = 3
    size: str = "full"
    device: str = "cuda"  # "cpu" only for tests and smoke runs: no profiler, perf_counter timer
    compile_limit_s: float = 240.0  # import + first call (JIT build)
    wall_limit_s: float = 600.0  # the whole evaluation after the worker was ready
    start_limit_s: float = 180.0  # a worker's imports and CUDA init
    clock_warm_s: float = 0.3  # busy GPU time before each timing loop so clocks are boosted
    # the clock warm-up's shortest run (s): None = as shipped since 2.23, one round when the SM clock reads boosted
    # both before it and after that round, else at least CLOCK_WARM_MIN_S (30 ms); a number is that minimum always (an A/B
    # arm: 0.03 is grader 2.22's rule; every recorded H200 grading read boosted before any work, 2,197 of 2,197)
    clock_warm_min_s: float | None = None
    eager_timed: int | None = None  # defaults to n_timed
    gpu_arch: str | None = None  # the DSL target; None: detected from the device (mkb.measure.detect_arch)
    allow_unchecked_gpu: bool = False  # grade on a known GPU whose architecture is not in mkb.measure.CHECKED_ARCHS
    reference_warmup: int = 10  # upstream's baseline timing (mkb.measure.time_upstream): its counts ...
    reference_timed: int = 50
    reference_budget_s: float = 90.0  # ... and a wall bound, for references that loop per token in Python
    early_stop: bool = True  # stop timing once R@t and S cannot change (mkb.grader._verdict.timing_decided)
    # how the trusted plan keeps its expectations (DESIGN, Problem contract, full-size memory): "whole", "sampled"
    # (allclose outputs over `sample_positions` elements kept at that many secret positions), or "auto": sampled only
    # where the whole ones do not fit the device (`mkb.grader._harness.needs_sampling`); "auto" never samples on the CPU
    expectations: str = "auto"
    sample_positions: int = 2**24  # mkb.measure.SAMPLE_POSITIONS; tests lower it to sample smoke-size outputs
    # the timed input sets' first pass (mkb.measure.InputStream): "allocate" (timing policy v6: the blocks only), "make"
    # (v5: the whole sets, twice), "none" (v4's fresh blocks); anything but "allocate" is an A/B arm, recorded as an override
    set_first_pass: str = "allocate"
    # the SM hold (us) behind the empty calls whose tails are the side-work check's floor (30 before and 30 after the
    # loop): None = the hold's default (HOLD_US, 1 ms), as shipped; a number is an A/B arm (issue #10: at 1 ms the 60
    # empty windows cost ~0.07 s of GPU time per grading; whether their tails read the same behind 150 us is untested)
    floor_hold_us: float | None = None
    # whether the worker may write only beneath its own scratch folder (and /dev) once its candidate can run
    # (mkb.grader._fs_guard): "landlock" (where the kernel has it; the figures say when it does not), "required" (a
    # grading whose worker could not be confined fails as infra_error, for a user who would rather not grade unconfined),
    # or "off"
    fs_guard: str = "landlock"
    # whether the candidate is refused the calls that would let it outlive, leave or reach past its worker (a new
    # session or process group, sockets, ptrace, io_uring; mkb.grader._syscall_guard): "seccomp" (the figures say where
    # it could not be installed), "required" (such a host is refused, as fs_guard's), or "off"
    syscall_guard: str = "seccomp"
    # whether a queue makes a queued job's device code ahead, outside the GPU, for a DSL whose compile is mostly a step
    # that needs none (TIRx's nvcc; mkb.grader._precompile): "on" (where Landlock can confine the sandbox that runs the
    # candidate's code for it) or "off"; the verdict's compile figures record what each grading got
    precompile: str = "on"
    # the most of the free device memory a plan made ahead may take beside the grading in flight (mkb.grader._prefetch):
    # None = PREFETCH_FREE_FRACTION (1/16), as shipped; a number in (0, 1/4] is an A/B arm (issue #10: problem 28's
    # plan, 13.4 GB of 139 GB free, never passes 1/16 and its gradings make it inside their own time; whether a larger
    # plan beside the grading in flight moves that grading's figures is untested)
    prefetch_fraction: float | None = None
    # whether the worker may also read only beneath the system's folders, its Python's, mkb's and its own once its
    # candidate can run (mkb.grader._fs_guard.default_readable: no user's home, no /tmp, no /root): "landlock" (as
    # shipped since 2.20: the whole red-team suite and every baseline graded with it on the H200,
    # events/h200-grader-2-19-readguard) or "off" (a host whose DSL reads a file outside those folders after import)
    read_guard: str = READ_GUARD_DEFAULT

    def __post_init__(self) -> None:
        if self.draws < 1 or self.n_timed < 1 or self.n_warmup < 0:
            raise ValueError("GraderConfig needs draws >= 1, n_timed >= 1 and n_warmup >= 0")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"GraderConfig.device must be 'cuda' or 'cpu', not {self.device!r}")
        if self.expectations not in ("auto", "whole", "sampled"):
            raise ValueError(f"GraderConfig.expectations must be 'auto', 'whole' or 'sampled', not {self.expectations!r}")
        if self.set_first_pass not in SET_FIRST_PASSES:
            raise ValueError(f"GraderConfig.set_first_pass must be one of {SET_FIRST_PASSES}, not {self.set_first_pass!r}")
        if self.floor_hold_us is not None:
            self._check_floor_hold(self.floor_hold_us)
        if self.fs_guard not in FS_GUARDS:
            raise ValueError(f"GraderConfig.fs_guard must be one of {FS_GUARDS}, not {self.fs_guard!r}")
        if self.syscall_guard not in SYSCALL_GUARDS:
            raise ValueError(f"GraderConfig.syscall_guard must be one of {SYSCALL_GUARDS}, not {self.syscall_guard!r}")
        if self.read_guard not in READ_GUARDS:
            raise ValueError(f"GraderConfig.read_guard must be one of {READ_GUARDS}, not {self.read_guard!r}")
        if self.precompile not in PRECOMPILES:
            raise ValueError(f"GraderConfig.precompile must be one of {PRECOMPILES}, not {self.precompile!r}")
        if self.prefetch_fraction is not None and not 0 < self.prefetch_fraction <= 0.25:
            raise ValueError(f"GraderConfig.prefetch_fraction must be in (0, 0.25] (or None: 1/16), not {self.prefetch_fraction!r}"
                             "\nhint: the grading in flight keeps a quarter of the free memory for its input sets")
        if self.clock_warm_min_s is not None and not 0 <= self.clock_warm_min_s <= self.clock_warm_s:
            raise ValueError(f"GraderConfig.clock_warm_min_s must be None or within 0..clock_warm_s ({self.clock_warm_s}), "
                             f"not {self.clock_warm_min_s!r}")
        if self.sample_positions < 1:
            raise ValueError(f"GraderConfig.sample_positions must be >= 1, not {self.sample_positions}")

    @staticmethod
    def _check_floor_hold(us: float) -> None:
        from mkb.measure import HOLD_MAX_US, HOLD_MIN_US  # torch only for an A/B arm's config

        if not HOLD_MIN_US <= us <= HOLD_MAX_US:
            raise ValueError(f"GraderConfig.floor_hold_us must be None or within {HOLD_MIN_US:g}..{HOLD_MAX_US:g} us "
                             f"(the hold's range), not {us}")

    @property
    def first_pass(self) -> str | None:
        """`set_first_pass` as `InputStream` takes it."""
        return None if self.set_first_pass == "none" else self.set_first_pass

    @property
    def n_expectations(self) -> int:
        """Expectations a grading keeps from its trusted phase through timing: the draws, the re-check sets (a
        random recheck_fraction of the timed calls but the last, plus the last) and the final draw: 5 + 11 + 1 = 17
        with the defaults (mkb.grader._harness._Plan)."""
        return self.draws + min(max(1, round(self.recheck_fraction * self.n_timed)), self.n_timed - 1) + 1 + 1

    @classmethod
    def quick(cls, **overrides) -> "GraderConfig":
        """A short policy for tests and smoke runs (never used for a reported verdict)."""
        base = dict(draws=3, n_warmup=2, warmup_jitter=1, n_timed=6, n_profiled=1, clock_warm_s=0.0, reference_warmup=1,
                    reference_timed=3)
        base.update(overrides)
        return cls(**base)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GraderConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def overrides(self) -> dict[str, Any]:
        """The fields that differ from the shipped defaults, recorded on every verdict: a figure graded under a
        changed configuration (an A/B run, a quick test config) must be told apart from one the grader as shipped
        gave (`mkb-run problems speed-table` uses only the latter)."""
        base = GraderConfig()
        return {k: v for k, v in self.as_dict().items() if getattr(base, k) != v}

    @property
    def meets_design(self) -> bool:
        return self.draws >= 5 and self.n_warmup >= 10 and self.n_timed >= 50 and self.device == "cuda"
