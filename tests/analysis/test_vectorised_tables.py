"""The per-cell figures computed for many cells at once (tests, noise floor, shrinkage) equal the loop over cells
they replaced, bit for bit."""

import math

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from mkb.analysis._stats import _add_shrinkage, _wilcoxon_lists, _zero_prob_steps, add_tests, mcnemar_exact, wilcoxon_pratt


def _reference_add_shrinkage(out: pl.DataFrame) -> pl.DataFrame:
    """The loop over cells before the vectorised version (commit 8233907), kept verbatim as the oracle."""
    from math import erf, sqrt

    floor, shrink, tau = [], [], []
    for lifts, pair_lifts, ns, sq in zip(out["problem_lifts"].to_list(), out["_pair_lifts"].to_list(), out["_n"].to_list(),
                                         out["_sq"].to_list()):
        pair_lifts = [tuple(x) for x in pair_lifts]
        d = np.asarray(lifts, float)
        n = np.asarray(ns, float)
        floor.append(float(np.mean([(1 - _zero_prob_steps(v)) / 2 for v in pair_lifts])) if len(d) else None)
        within = np.asarray(sq, float) - n * d**2
        dof = (n - 1).sum()
        if len(d) < 3 or dof <= 0:
            shrink.append(None), tau.append(None)
            continue
        s2 = within.sum() / dof
        se2 = s2 / n
        t2 = float(d.var(ddof=1) - se2.mean())
        c = d - d.mean()
        kurt = max(0.0, float((c**4).mean() / max((c**2).mean() ** 2, 1e-300) - 3.0))
        if t2 <= 3 * np.sqrt(2 / (len(d) - 1) + kurt / len(d)) * se2.mean():
            shrink.append(None), tau.append(0.0)
            continue
        mu = float(d.mean())
        B = se2 / (se2 + t2)
        mean = mu + (1 - B) * (d - mu)
        sd = np.sqrt((1 - B) * se2)
        pneg = [0.5 * (1 + erf((0 - mm) / (ss * sqrt(2)))) if ss > 0 else float(mm < 0) for mm, ss in zip(mean, sd)]
        shrink.append(float(np.mean(pneg))), tau.append(sqrt(t2))
    return out.drop("_pair_lifts", "_n", "_sq").with_columns(
        regression_noise_floor=pl.Series(floor, dtype=pl.Float64), regression_true_share=pl.Series(shrink, dtype=pl.Float64),
        between_problem_sd=pl.Series(tau, dtype=pl.Float64))


def _cells(seed: int, n_cells: int = 160) -> pl.DataFrame:
    """Cells as `_lift_cells` hands them over: per problem its mean lift, pairs, sum of squared lifts and sorted
    lift sizes in S steps; problem counts from 1 to 40 (ragged), pairs 1-4, some cells with a real spread between
    problems (so the shrinkage runs), some all ties, some with one pair per problem (no within-problem dof)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_cells):
        P = int(rng.choice([1, 2, 3, 5, 12, 40, 40, 40]))
        spread = rng.choice([0.0, 1.0, 4.0])
        reps = 1 if c % 9 == 0 else None
        lifts, pairs, ns, sqs = [], [], [], []
        for _ in range(P):
            n = reps or int(rng.integers(1, 5))
            shift = rng.normal(0, spread)
            d = 20 * np.clip(np.round(rng.normal(shift, 1.5, n)), -5, 5) if c % 13 else np.zeros(n)
            lifts.append(float(d.mean())), ns.append(n), sqs.append(float((d**2).sum()))
            pairs.append(sorted(int(round(abs(x) / 20.0)) for x in d))
        rows.append({"cell": c, "problem_lifts": lifts, "_pair_lifts": pairs, "_n": ns, "_sq": sqs})
    return pl.DataFrame(rows, schema={"cell": pl.Int64, "problem_lifts": pl.List(pl.Float64), "_pair_lifts": pl.List(pl.List(pl.Int64)),
                                      "_n": pl.List(pl.Int64), "_sq": pl.List(pl.Float64)})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shrinkage_and_noise_floor_equal_the_loop_over_cells(seed):
    cells = _cells(seed)
    # the tables hand each problem's zero probability over (counted per step multiset); the loop took the multisets
    zero = pl.Series([[_zero_prob_steps(tuple(v)) for v in c] for c in cells["_pair_lifts"].to_list()], dtype=pl.List(pl.Float64))
    got, want = _add_shrinkage(cells.with_columns(_zero=zero).drop("_pair_lifts")), _reference_add_shrinkage(cells)
    assert_frame_equal(got, want, check_exact=True)
    assert got["regression_true_share"].is_not_null().sum() > 5  # the shrinkage branch ran for several cells
    assert got["between_problem_sd"].is_null().sum() > 5  # and the "too few problems or no dof" branch too


def test_wilcoxon_of_many_lists_equals_the_scalar_function():
    rng = np.random.default_rng(7)
    lists = [[], [0.0], [0.0, 0.0], [1.0], [1.0, -1.0], [20.0, 20.0, -20.0, 0.0], [1e-10, -1e-10, 0.0]]
    for _ in range(300):
        n = int(rng.choice([2, 3, 7, 74]))
        v = 20 * rng.integers(-3, 4, n) / rng.choice([1, 3]) if rng.random() < 0.8 else rng.standard_normal(n)
        lists.append([float(x) for x in v])
    s = pl.Series(lists + [None], dtype=pl.List(pl.Float64))
    got = _wilcoxon_lists(s)
    want = [wilcoxon_pratt(np.round(np.asarray(x, dtype=float), 9)) for x in lists] + [math.nan]
    np.testing.assert_array_equal(got, np.asarray(want))


def test_add_tests_keeps_its_figures_on_ragged_cells():
    cells = _cells(4).with_columns(stratum=pl.lit("all"), arm_kind=pl.Series(["transfer", "placebo"] * 80),
                                   problem_pass_diffs=pl.col("problem_lifts").list.eval(pl.element() / 100.0),
                                   mcnemar_b=pl.col("cell") % 7, mcnemar_c=pl.col("cell") % 5)
    out = add_tests(cells.drop("_pair_lifts", "_n", "_sq"), group=["stratum", "arm_kind"]).sort("cell")
    assert out["cell"].to_list() == cells["cell"].to_list()
    for r, c in zip(out.iter_rows(named=True), cells.iter_rows(named=True)):
        assert r["p_wilcoxon"] == wilcoxon_pratt(np.round(np.asarray(c["problem_lifts"]), 9))
        assert r["p_pass_clustered"] == wilcoxon_pratt(np.round(np.asarray(c["problem_pass_diffs"]), 9))
        assert r["p_mcnemar"] == mcnemar_exact(c["mcnemar_b"], c["mcnemar_c"])


def test_latest_keeps_one_row_per_attempt_and_passes_unique_ids_through():
    from mkb.analysis._tables import _latest

    unique = pl.DataFrame({"attempt_id": ["a", "b", "c"], "ts": [3, 1, 2], "v": [1, 2, 3]})
    assert _latest(unique, keep="last") is unique  # distinct ids: the frame itself, unsorted
    dup = pl.DataFrame({"attempt_id": ["a", "b", "a", None, None], "ts": [1, 5, 2, 7, 8], "v": [1, 2, 3, 4, 5]})
    last = _latest(dup, keep="last").sort("attempt_id", nulls_last=True)
    assert last["attempt_id"].to_list() == ["a", "b", None] and last["v"].to_list() == [3, 2, 5]
    first = _latest(dup, keep="first").sort("attempt_id", nulls_last=True)
    assert first["v"].to_list() == [1, 2, 4]
