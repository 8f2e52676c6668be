"""The grader: isolated single-use workers, trust-ordered correctness, timing and integrity checks, verdict events."""

from mkb.grader._config import GraderConfig
from mkb.grader._confine import ConfinementUnavailable
from mkb.grader._grade import GRADER_VERSION, grade
from mkb.grader._pool import Worker, WorkerPool, quiet_for
from mkb.grader._queue import GradeJob, GradingQueue
from mkb.reasons import STAGES, Reason, is_known, stage_of, static_reason
from mkb.grader._verdict import (
    THRESHOLDS, CompileFigures, IntegrityFigures, StageResult, TimingFigures, VerificationFigures, Verdict,
)

__all__ = [
    "CompileFigures", "IntegrityFigures", "TimingFigures", "VerificationFigures",
    "GRADER_VERSION", "GradeJob", "GraderConfig", "GradingQueue", "ConfinementUnavailable", "Reason", "STAGES", "StageResult", "THRESHOLDS",
    "Verdict", "Worker", "WorkerPool", "grade", "is_known", "quiet_for", "stage_of", "static_reason",
]
