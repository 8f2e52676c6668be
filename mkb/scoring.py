"""The one definition of the scores every verdict and every analysis table uses: R@t and S (DESIGN.md, Definitions).

Pure Python on purpose: the grader, the agent and the read side (`mkb.analysis`, which must run without
torch) all import it, so a threshold can never differ between what was graded and what is reported.
"""

from __future__ import annotations

THRESHOLDS: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
R_COLS: tuple[str, ...] = ("r_at_0", "r_at_0_5", "r_at_1", "r_at_2", "r_at_4")  # event/table column per threshold


def r_at(passed: bool, speedup: float | None) -> dict[float, bool]:
    """R@t for every threshold: a failed or unscored kernel reaches none of them."""
    return {t: bool(passed and speedup is not None and speedup >= t) for t in THRESHOLDS}


def s_score(passed: bool, speedup: float | None) -> float:
    """S = 100 x mean over t of R@t."""
    return 100.0 * sum(r_at(passed, speedup).values()) / len(THRESHOLDS)


def s_upstream(passed: bool, speedup_upstream: float | None) -> float:
    """S over upstream MetaKernelBench's baseline (the problem's fp32 `reference`, timed as upstream times it):
    the same thresholds and mean as `s_score`, applied to `speedup_upstream`. Comparable with upstream's
    published R@t only through that speedup, never with mkb's S (whose baseline is `eager`)."""
    return s_score(passed, speedup_upstream)
