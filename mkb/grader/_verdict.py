"""What one evaluation concluded: per-stage results and the frozen `Verdict` a caller gets back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

THRESHOLDS: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)


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
        return {t: bool(self.passed and self.speedup is not None and self.speedup >= t) for t in THRESHOLDS}

    @property
    def s(self) -> float:
        return 100.0 * sum(self.r_at.values()) / len(THRESHOLDS)

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["r_at"] = {str(k): v for k, v in self.r_at.items()}
        d["s"] = self.s
        return d
