"""What one evaluation concluded: per-stage results and the frozen `Verdict` a caller gets back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mkb.scoring import THRESHOLDS, r_at, s_score



@dataclass(frozen=True)
class StageResult:
    """One stage (compile, verification, timing, integrity) as the worker reported it."""

    stage: str
    ok: bool
    reason: str | None = None
    figures: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    log: str = ""


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
    message: str = ""

    @property
    def r_at(self) -> dict[float, bool]:
        return r_at(self.passed, self.speedup)

    @property
    def s(self) -> float:
        return s_score(self.passed, self.speedup)

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["r_at"] = {str(k): v for k, v in self.r_at.items()}
        d["s"] = self.s
        return d


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
