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
    queue_wait_s: float | None = None  # submit to start in a GradingQueue (an agent's working time excludes it)
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
