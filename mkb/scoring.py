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


# S_sol: the same ladder read against the speed of light instead of eager PyTorch. On memory-bound problems
# eager is often 10x or more from the speed of light, so any fused kernel reaches S = 100; the fraction of
# the speed of light reached (sol_us / candidate_us, in (0, 1] for an honest timing) keeps separating a good
# kernel from a great one. Thresholds fixed in DESIGN (Definitions) before any real data: a pass, then
# 1/8, 1/4, 1/2 and 3/4 of the speed of light.
SOL_THRESHOLDS: tuple[float, ...] = (0.0, 0.125, 0.25, 0.5, 0.75)


def sol_fraction(candidate_us: float | None, sol_us: float | None) -> float | None:
    """The fraction of the speed of light a kernel reached: sol_us / candidate_us (None when either is unknown).

    `sol_us` is the problem's speed-of-light time on the GPU that timed the candidate (`mkb.peaks`); it
    may exceed 1 only when the timing or the problem's FLOP/byte count is wrong, which is kept visible.
    """
    if candidate_us is None or sol_us is None or not candidate_us > 0 or not sol_us > 0:
        return None
    return sol_us / candidate_us


def s_sol(passed: bool, fraction: float | None) -> float:
    """S_sol = 100 x mean over f in SOL_THRESHOLDS of (passed and fraction of speed of light >= f).

    A pass with an unknown fraction scores the pass step only (20), as a pass with an unknown speedup
    scores R@0 in S; S_sol is reported as missing by the analysis when the problem has no speed of light.
    """
    hits = [bool(passed and (f == 0.0 or (fraction is not None and fraction >= f))) for f in SOL_THRESHOLDS]
    return 100.0 * sum(hits) / len(SOL_THRESHOLDS)


def speedup_over_compile(candidate_us: float | None, compile_us: float | None) -> float | None:
    """torch.compile median time / candidate median time, where the characterisation measured torch.compile."""
    if candidate_us is None or compile_us is None or not candidate_us > 0 or not compile_us > 0:
        return None
    return compile_us / candidate_us
