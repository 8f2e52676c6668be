"""The grader's names for the reason vocabulary, which lives in `mkb.reasons` (below mkb.measure)."""

from mkb.reasons import STAGES, Reason, is_known, stage_of, static_reason

__all__ = ["STAGES", "Reason", "is_known", "stage_of", "static_reason"]
