"""The vectorised bootstrap gives the numbers of the implementation it replaced, bit for bit, for the same seed."""

import numpy as np
import polars as pl
import pytest

from mkb.analysis import BootstrapSpec, cluster_bootstrap, lift_table, load_tables
from mkb.analysis._stats import (
    _matrices, _mean_lift, _percentiles, _rel, _standing_stat, cluster_bootstrap_many,
)
from mkb.analysis._tables import NOISE_ARM
from bootstrap_oracle import reference_cluster_bootstrap

pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")


def _lift_sums(seed: int, cells: int = 23, problems: int = 9):
    """Integer-valued per-cell, per-problem sums as lift_table builds them, with holes: some cells lack
    problems (several resample groups), one cell has a single problem (no CI), some solos sum to 0 (NaN resamples)."""
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 4, size=(cells, problems)).astype(float)
    n[rng.random((cells, problems)) < 0.15] = 0
    n[3, :] = 0
    n[3, 2] = 2
    n[5] = n[6] = n[7]  # cells sharing one problem set
    SA = 20.0 * rng.integers(0, 6, size=n.shape) * n
    SB = 20.0 * rng.integers(0, 6, size=n.shape) * n
    SB[8] = 0
    SB[9, :-1] = 0
    return {"SA": SA, "SB": SB, "n": n}


def _same(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # NaN == NaN here, otherwise exact


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("resamples", [1, 2, 7, 400])
def test_vectorised_bootstrap_equals_the_previous_implementation(seed, resamples):
    sums = _lift_sums(seed)
    cells = list(range(sums["n"].shape[0]))
    problems = np.arange(sums["n"].shape[1])
    spec = BootstrapSpec(seed=100 + seed, resamples=resamples)
    for stat in (_rel, _mean_lift):
        for got, want in zip(cluster_bootstrap(cells, problems, sums, stat, spec),
                             reference_cluster_bootstrap(cells, problems, sums, stat, spec)):
            _same(got, want)
    many = cluster_bootstrap_many(cells, problems, sums, {"rel": _rel, "mean": _mean_lift}, spec)
    for name, stat in (("rel", _rel), ("mean", _mean_lift)):
        for got, want in zip(many[name], reference_cluster_bootstrap(cells, problems, sums, stat, spec)):
            _same(got, want)


@pytest.mark.parametrize("scale", [0.1, 1e6])  # not integers; integers too large for exact float32 products
def test_bootstrap_falls_back_to_float64_products_where_float32_would_round(scale):
    sums = _lift_sums(4)
    sums = {"SA": sums["SA"] * scale, "SB": sums["SB"] * scale, "n": sums["n"]}
    cells, problems = list(range(sums["n"].shape[0])), np.arange(sums["n"].shape[1])
    spec = BootstrapSpec(seed=7, resamples=4000)
    for got, want in zip(cluster_bootstrap(cells, problems, sums, _rel, spec), reference_cluster_bootstrap(cells, problems, sums, _rel, spec)):
        _same(got, want)


@pytest.mark.parametrize("seed", [0, 1])
def test_tail_order_statistics_equal_numpy_quantile_on_bootstrap_sized_rows(seed):
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal((300, 10_000)) * 40) / 7  # discrete, like resampled S sums
    x[1] = 2.0  # one value: every candidate ties
    x[2, :500] = 9.0  # a pilot that brackets nothing: the row is selected in full
    x[3] = rng.integers(0, 3, 10_000)  # heavy ties
    x[4, -3:] = -50.0  # extremes outside the pilot
    for qs in ([0.025, 0.975], [0.005, 0.995], [0.0, 0.01, 1.0]):
        _same(_percentiles(x, qs), np.quantile(x, qs, axis=1))


def test_vectorised_bootstrap_equals_the_previous_implementation_for_standing():
    rng = np.random.default_rng(5)
    shape = (17, 12)
    na, nb = rng.integers(0, 4, size=shape).astype(float), rng.integers(0, 4, size=shape).astype(float)
    ia = np.minimum(na, rng.integers(0, 3, size=shape))
    ra = na - ia - (na - ia > 0) * rng.integers(0, 2, size=shape)
    ib = np.minimum(nb, rng.integers(0, 3, size=shape))
    rb = nb - ib
    n = na + nb + rng.integers(0, 2, size=shape)
    sums = {"ia": ia, "ra": ra, "na": na, "ib": ib, "rb": rb, "nb": nb, "n": n}
    stat = lambda n, **k: _standing_stat(**k)  # noqa: E731
    spec = BootstrapSpec(seed=9, resamples=300)
    cells = list(range(shape[0]))
    for got, want in zip(cluster_bootstrap(cells, np.arange(shape[1]), sums, stat, spec),
                         reference_cluster_bootstrap(cells, np.arange(shape[1]), sums, stat, spec)):
        _same(got, want)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 401, 10_000])
def test_percentiles_equal_numpy_quantile(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((13, n))
    x[2] = np.round(x[2])  # ties
    x[3] = 1.0
    x[4, : n // 2] = np.inf
    for qs in ([0.025, 0.975], [0.0, 1.0], [0.5], [0.005, 0.3333, 0.995]):
        with np.errstate(invalid="ignore"):
            _same(_percentiles(x, qs), np.quantile(x, qs, axis=1))


@pytest.mark.parametrize("resamples", [1000, 10_000])  # 10,000: the tail-bracketing order statistics and float32 products
def test_lift_table_cis_equal_the_previous_bootstrap(planted_lift, resamples):
    pairs = load_tables(planted_lift.store).pairs
    spec = BootstrapSpec(seed=3, resamples=resamples)
    lt = lift_table(pairs, spec=spec)
    cell = ["stratum", "model", "arm_kind", "direction", "source_dsl", "target_dsl"]
    p = pairs.filter(pl.col("arm_kind") != NOISE_ARM)
    cells, problems, m = _matrices(p, cell, {"SA": pl.col("S").sum(), "SB": pl.col("S_solo").sum(), "n": pl.len()})
    rel = reference_cluster_bootstrap(cells, problems, m, _rel, spec)
    ml = reference_cluster_bootstrap(cells, problems, m, _mean_lift, spec)
    want = cells.with_columns(rel_lift=pl.Series(rel[0]), rel_lo=pl.Series(rel[1]), rel_hi=pl.Series(rel[2]),
                              lift=pl.Series(ml[0]), lift_lo=pl.Series(ml[1]), lift_hi=pl.Series(ml[2]))
    got = cells.join(lt, on=cell, how="left", nulls_equal=True).select(want.columns)
    assert got.height == lt.height == want.height
    for c in ("rel_lift", "rel_lo", "rel_hi", "lift", "lift_lo", "lift_hi"):
        _same(got[c].to_numpy(), want[c].to_numpy())


def test_the_pass_test_clustered_by_problem_sees_problems_not_pairs():
    """McNemar counts 12 discordant pairs as 12 independent pieces of evidence; when they all come from one problem
    the problem-level test sees one problem out of many that changed, and does not call it significant."""
    import polars as pl

    from mkb.analysis._stats import add_tests

    # 12 problems; problem 0 gains a pass in all 12 of its pairs, the other 11 are unchanged
    diffs = [1.0] + [0.0] * 11
    cells = pl.DataFrame({"stratum": ["all"], "arm_kind": ["transfer"], "problem_lifts": [[20.0] + [0.0] * 11],
                          "problem_pass_diffs": [diffs], "mcnemar_b": [0], "mcnemar_c": [12]})
    out = add_tests(cells, group=["stratum", "arm_kind"])
    assert out["p_mcnemar"][0] < 0.001
    assert out["p_pass_clustered"][0] > 0.05
    # spread over 12 problems, the same gains are evidence at the problem level too
    cells2 = cells.with_columns(problem_pass_diffs=pl.Series([[1.0] * 12]))
    assert add_tests(cells2, group=["stratum", "arm_kind"])["p_pass_clustered"][0] < 0.01
