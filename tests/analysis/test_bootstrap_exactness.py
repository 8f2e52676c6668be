"""The bootstrap's shortcuts are exact: per-problem sums give the row-level resampling's figures, and a `Ratio`'s
percentiles selected in float32 are the float64 ones, bit for bit (same seed, same numbers)."""

import numpy as np
import polars as pl
import pytest

from mkb.analysis import BootstrapSpec, contrast_table, lift_table, load_tables
from mkb.analysis._stats import Ratio, _cluster_weights, _percentiles, cluster_bootstrap_many
from mkb.analysis._tables import NOISE_ARM
from bootstrap_oracle import reference_cluster_bootstrap

pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")  # the reference's undefined cell


def _same(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # NaN == NaN here, otherwise exact


def _near_ties(seed: int, cells: int = 12, problems: int = 30):
    """Sums whose resampled ratios crowd within a float32 step of each other: big denominators (~10^5 x problems),
    numerators a few units apart, so float32 ties many values that float64 tells apart (the case the float64
    read-off exists for), plus cells with some resampled denominators at zero (NaN resamples) and shared problem sets."""
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 4, size=(cells, problems)).astype(float)
    n[rng.random(n.shape) < 0.1] = 0
    n[4] = n[5]
    den = rng.integers(100_000, 100_050, size=n.shape).astype(float) * (n > 0)
    num = den + rng.integers(-3, 4, size=n.shape) * (n > 0)
    den[7, : problems - 2] = 0  # most resamples draw a zero denominator for this cell
    den[8] = 0  # every resample: undefined
    small = 20.0 * rng.integers(0, 6, size=n.shape) * (n > 0)
    return {"A": num, "B": den, "n": n, "S": small, "n2": n.copy()}  # n2: a sum equal to another (resampled once)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ratio_percentiles_selected_in_float32_equal_the_float64_definition(seed):
    sums = _near_ties(seed)
    stats = {"rel": Ratio("A", sub="B", den="B"), "q": Ratio("A", den="B"), "mean": Ratio("S", den="n"),
             "mixed": Ratio("A", sub="S", den="n"), "again": Ratio("S", den="n2")}
    spec = BootstrapSpec(seed=40 + seed, resamples=10_000)  # long rows: the tail-bracketed, float32 path
    got = cluster_bootstrap_many(list(range(sums["n"].shape[0])), np.arange(sums["n"].shape[1]), sums, stats, spec)
    cells, problems = list(range(sums["n"].shape[0])), np.arange(sums["n"].shape[1])
    for name, stat in stats.items():  # the plain definition: every resample in float64, then np.quantile
        _, lo, hi = reference_cluster_bootstrap(cells, problems, sums, stat, spec)
        _same(got[name][1], lo)
        _same(got[name][2], hi)
    assert np.isnan(got["rel"][1][8]) and not np.isnan(got["rel"][1][7])
    _same(got["again"][1], got["mean"][1])


def test_the_float32_stand_in_really_ties_values_that_float64_separates():
    """Guard on the test data above: without the float64 read-off the percentiles would differ."""
    sums = _near_ties(0)
    w = _cluster_weights(30, BootstrapSpec(resamples=10_000), np.random.default_rng(1))
    cols = np.flatnonzero(sums["n"][0] > 0)
    w = w[:, : len(cols)]
    a, b = (w @ sums[k][0, cols] for k in ("A", "B"))
    r64 = (a - b) / b
    r32 = (a.astype(np.float32) - b.astype(np.float32)) / b.astype(np.float32)
    assert len(np.unique(r32)) < len(np.unique(r64))
    assert not np.array_equal(_percentiles(r32[None].astype(np.float64), [0.025, 0.975]), _percentiles(r64[None], [0.025, 0.975]))


def test_percentiles_with_a_float64_read_off_equal_numpy_quantile():
    rng = np.random.default_rng(3)
    exact = np.round(rng.standard_normal((40, 10_000)), 12) + 1.0
    exact[5] = 1.0  # one value
    exact[6, :500] = 7.0  # a pilot that brackets nothing
    x32 = exact.astype(np.float32)  # ties wherever float64 values share a float32 step, and orders as they do
    got = _percentiles(x32, [0.025, 0.975], exact=lambda pos: exact.ravel()[pos])
    _same(got, np.quantile(exact, [0.025, 0.975], axis=1))


@pytest.mark.parametrize("qs", [[0.025, 0.975], [0.01, 0.025, 0.05, 0.95, 0.975, 0.99], [0.0249, 0.0251]])
def test_percentiles_read_off_from_float32_tie_groups_of_distinct_float64_values(qs):
    """Only the candidates tied (in float32) with the wanted order statistics are computed in float64: groups of several
    positions per float32 value, each holding distinct float64 values, at every rank asked for, in both tails."""
    rng = np.random.default_rng(11)
    exact = np.round(rng.standard_normal((30, 10_000)), 2) + rng.integers(0, 5, size=(30, 10_000)) * 1e-12
    x32 = exact.astype(np.float32)
    ranks = np.unique(np.concatenate([np.floor(9_999 * np.asarray(qs)), np.floor(9_999 * np.asarray(qs)) + 1])).astype(int)
    srt = np.sort(exact, axis=1)
    tied = [(np.count_nonzero(x32[r] == np.float32(srt[r, k])) > 1) and len(np.unique(exact[r][x32[r] == np.float32(srt[r, k])])) > 1
            for r in range(30) for k in ranks]
    assert np.mean(tied) > 0.5  # the case under test: the selected float32 value stands for several float64 values
    got = _percentiles(x32, qs, exact=lambda pos: exact.ravel()[pos])
    _same(got, np.quantile(exact, qs, axis=1))


def _row_level_bootstrap(pairs: pl.DataFrame, cell: dict, spec: BootstrapSpec, *, draws: np.ndarray):
    """The definition, on rows: for each resample draw problems with replacement, take every pair of each drawn
    problem as often as it is drawn, and compute the cell's figures from those rows."""
    p = pairs.filter(*(pl.col(k) == v for k, v in cell.items()))
    probs = np.sort(p["problem"].unique().to_numpy())
    by = {int(k[0]): g for k, g in p.group_by("problem")}
    rel, mean = [], []
    for idx in draws:
        rows = pl.concat([by[int(probs[i])] for i in idx])
        sa, sb = float(rows["S"].sum()), float(rows["S_solo"].sum())
        rel.append((sa - sb) / sb if sb > 0 else np.nan)
        mean.append((sa - sb) / rows.height)
    a = (1 - spec.level) / 2
    return np.quantile(rel, [a, 1 - a]), np.quantile(mean, [a, 1 - a])


def test_per_problem_sums_give_the_row_level_resampling_figures(planted_lift):
    """The bootstrap resamples per-problem sums, not rows: the same numbers, since a resample's total is the sum of
    its drawn problems' sums (exact: S is a multiple of 20, every partial sum an integer)."""
    pairs = load_tables(planted_lift.store).pairs.filter(pl.col("arm_kind") != NOISE_ARM)
    spec = BootstrapSpec(seed=5, resamples=300)
    cell = {"model": pairs["model"].min(), "arm_kind": "transfer", "direction": "cute->tirx"}
    one = pairs.filter(*(pl.col(k) == v for k, v in cell.items()))
    lt = lift_table(one, spec=spec, tests=False)  # one cell: its group is the first and only one the generator draws for
    assert lt.height == 1
    P = one["problem"].n_unique()
    rng = np.random.default_rng(spec.seed)
    draws = rng.integers(0, P, size=(spec.resamples, P))  # the draws `_cluster_weights` counts, in its order
    (rlo, rhi), (mlo, mhi) = _row_level_bootstrap(one, cell, spec, draws=draws)
    r = lt.row(0, named=True)
    assert (r["rel_lo"], r["rel_hi"]) == (rlo, rhi)
    assert (r["lift_lo"], r["lift_hi"]) == (mlo, mhi)


def test_lift_and_contrast_are_unchanged_by_the_float32_selection(planted_lift, monkeypatch):
    """The lift and contrast tables with every Ratio computed in float64 throughout (the former path) are the same."""
    import mkb.analysis._stats as st

    pairs = load_tables(planted_lift.store).pairs
    spec = BootstrapSpec(seed=8, resamples=10_000)
    fast = lift_table(pairs, spec=spec, pooled=True), contrast_table(pairs, spec=spec)

    monkeypatch.setattr(st, "_fast", lambda stat: False)  # every Ratio through float64: the former path
    slow = lift_table(pairs, spec=spec, pooled=True), contrast_table(pairs, spec=spec)
    for f, s in zip(fast, slow):
        assert f.equals(s)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [74, 255, 256, 3_000, 70_000])
def test_share_percentiles_by_counting_equal_numpy_quantile(dtype, n):
    """Shares of problems are counts over the drawn problems: their percentiles come from each row sorted as small
    integers (bytes up to 255 problems, 16 bits up to 65,535, 64 past that), the same values as np.quantile of the
    shares (float32 counts are the float32 path's exact products), in a reused scratch buffer or not; ties, rows all 0
    and all n included."""
    from mkb.analysis._stats import _count_percentiles

    rng = np.random.default_rng(11)
    counts = rng.binomial(n, rng.uniform(0, 1, (50, 1)), (50, 10_000)).astype(dtype)
    counts[3] = 0
    counts[4] = n
    counts[5, ::2] = n  # half the resamples at one end: the order statistics around the middle tie across a jump
    counts[5, 1::2] = 0
    scratch = np.full(2 * counts.size, 7, dtype=np.uint8)  # stale bytes, as a buffer reused from an earlier block has
    for qs in ([0.025, 0.975], [0.0, 0.5, 1.0]):
        want = np.quantile(counts.astype(np.float64) / n, qs, axis=1)
        _same(_count_percentiles(counts, n, qs), want)
        _same(_count_percentiles(counts, n, qs, scratch=scratch), want)
        _same(_count_percentiles(counts[:7], n, qs, scratch=scratch), want[:, :7])  # a block shorter than the buffer


@pytest.mark.parametrize("n", [4_500, 10_000])
def test_sorted_candidates_read_off_at_crossed_brackets_infinities_and_one_tail(n):
    """The order statistics read off each row's sorted tail candidates: rows whose two brackets meet (one value: every
    resample a candidate of both tails, selected in full), +inf values among the top tail's candidates (the padding's
    own value) with the float64 read-off, -inf in the bottom one, and one tail asked for alone, each equal to np.quantile."""
    rng = np.random.default_rng(n)
    exact = np.round(rng.standard_normal((24, n)), 3) + rng.integers(0, 3, size=(24, n)) * 1e-12
    exact[0] = 4.0  # both brackets the same value
    exact[1, : n // 2] = 4.0  # the low bracket at or above the high one
    exact[2, rng.choice(n, n // 30, replace=False)] = np.inf  # the top tail's wanted order statistics are +inf
    exact[3, rng.choice(n, n // 60, replace=False)] = np.inf  # +inf candidates below the wanted ones' window
    exact[4, rng.choice(n, n // 30, replace=False)] = -np.inf
    exact[5, : n // 10] = np.round(exact[5, : n // 10], 1)  # ties in the pilot only
    x32 = exact.astype(np.float32)
    for qs in ([0.025, 0.975], [0.01], [0.99], [0.0249, 0.0251, 0.9749, 0.9751]):
        with np.errstate(invalid="ignore"):
            want = np.quantile(exact, qs, axis=1)
            _same(_percentiles(x32, qs, exact=lambda pos: exact.ravel()[pos]), want)
            _same(_percentiles(exact, qs), want)


@pytest.mark.parametrize("scale", [1.0, 1 / 3])  # 1/3: scores no longer integers, so the pooled cells are grouped from the pairs
def test_pooled_cells_from_the_directions_sums_equal_the_pooled_pairs_grouped(planted_lift, monkeypatch, scale):
    """The pooled cells' per-problem sums are their directions' sums added (`_pooled_per_problem`): the same table as the
    pooled pairs grouped again, to the bit; where the scores are not integer-valued (sums no longer exact) the pairs are."""
    import mkb.analysis._stats as st

    pairs = load_tables(planted_lift.store).pairs
    if scale != 1.0:
        pairs = pairs.with_columns(pl.col("S", "S_solo", "S_sol", "S_sol_solo") * scale).with_columns(lift=pl.col("S") - pl.col("S_solo"))
    spec = BootstrapSpec(seed=4, resamples=2000)
    used = []
    real = st._pooled_per_problem
    monkeypatch.setattr(st, "_pooled_per_problem", lambda *a, **k: used.append(1) or real(*a, **k))
    pooled = lift_table(pairs, spec=spec, pooled=True)
    assert used == ([1] if scale == 1.0 else [])
    monkeypatch.setattr(st, "_pooled_per_problem", lambda *a, **k: None)  # every cell grouped from the pairs
    assert pooled.equals(lift_table(pairs, spec=spec, pooled=True))
    assert (pooled["direction"] == "pooled").sum() > 0


def test_the_count_below_a_wanted_candidate_is_read_off_its_place_or_counted_on_a_tie():
    """`_count_below` reads how many sorted candidates lie below the one at a row's place from the place itself, and
    counts a row only where the value ties the one before it: the same counts as counting every row, on rows with long
    runs of ties at, before and from the first place, places at 0, and the +inf padding after the candidates."""
    from mkb.analysis._stats import _count_below

    rng = np.random.default_rng(5)
    rows, W = 400, 60
    srt = np.sort(rng.integers(0, 12, size=(rows, W)).astype(np.float32), axis=1)  # ~5 copies of each value: ties everywhere
    srt[::7, 40:] = np.inf  # padding
    srt[3] = 2.0  # one value throughout
    at = rng.integers(0, W, size=rows)
    at[::5] = 0
    at[3] = W - 1
    v = srt[np.arange(rows), at]
    want = np.count_nonzero(srt < v[:, None], axis=1)
    assert (at != want).sum() > rows // 3  # the tied case is exercised, not only the read-off
    np.testing.assert_array_equal(_count_below(srt, at, v), want)


def test_buffers_kept_from_an_earlier_call_change_no_figure(monkeypatch):
    """A call's threads take the buffers the previous call's threads made (`_SPARE`), whatever their sizes and dtypes
    were: float64 sums after float32 ones and back, a call of more cells and sums after one of fewer, each on two threads
    and on one, give the figures a call with no buffer to take gives."""
    import mkb.analysis._stats as S

    monkeypatch.setattr(S, "_SPARE", [])  # this test's buffers are not left to the rest of the session
    small = _near_ties(0)  # float64 products (sums of ~10^5 x problems: not exact in float32)
    rng = np.random.default_rng(3)
    n = rng.integers(1, 4, size=(300, 40)).astype(float)
    big = {"A": 20.0 * rng.integers(0, 6, size=n.shape) * (n > 0), "B": 20.0 * rng.integers(1, 6, size=n.shape) * (n > 0),
           "n": n, "d": (rng.random(n.shape) < 0.3) * (n > 0).astype(float)}
    spec = BootstrapSpec(seed=9, resamples=10_000)
    stats = {"rel": Ratio("A", sub="B", den="B"), "mean": Ratio("A", den="n")}
    shares = {"d": lambda d, **_: d}
    monkeypatch.setattr(S, "BLOCK_BYTES", 2**20)  # several blocks a call: both threads take a set

    def run(sums, with_shares):
        return cluster_bootstrap_many(list(range(sums["n"].shape[0])), np.arange(sums["n"].shape[1]), sums, stats, spec,
                                      shares=shares if with_shares else None)

    fresh = {}
    for name, sums, sh in (("small", small, False), ("big", big, True)):
        S._SPARE.clear()
        fresh[name] = run(sums, sh)
    for workers in (2, 1):
        monkeypatch.setattr(S.os, "cpu_count", lambda: workers)
        for name, sums, sh in (("big", big, True), ("small", small, False), ("big", big, True), ("small", small, False)):
            got = run(sums, sh)
            assert S._SPARE  # the buffers are kept for the next call
            for k, (est, lo, hi) in fresh[name].items():
                _same(got[k][0], est), _same(got[k][1], lo), _same(got[k][2], hi)


def test_the_buffers_kept_are_bounded_and_of_the_last_calls_kinds_only(monkeypatch):
    """On a machine of many cores a call runs many threads: what is kept for the next call is capped in bytes, and a set
    keeps only the kinds of buffer its last call used (a float64 call's sums are not carried on beside float32 ones)."""
    import mkb.analysis._stats as S

    monkeypatch.setattr(S, "_SPARE", [])
    monkeypatch.setattr(S.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(S, "BLOCK_BYTES", 2**18)  # many blocks: every one of the 16 threads takes a set
    rng = np.random.default_rng(5)
    n = rng.integers(1, 4, size=(400, 30)).astype(float)
    exact = {"A": 20.0 * rng.integers(0, 6, size=n.shape) * (n > 0), "B": 20.0 * rng.integers(1, 6, size=n.shape) * (n > 0),
             "n": n}
    wide = dict(exact, B=1_000_000.0 + exact["B"])  # sums of ~10^6 x problems: past float32's exact integers, float64 products
    spec = BootstrapSpec(seed=1, resamples=2_000)
    stats = {"rel": Ratio("A", sub="B", den="B")}

    def run(sums):
        return cluster_bootstrap_many(list(range(sums["n"].shape[0])), np.arange(sums["n"].shape[1]), sums, stats, spec)

    def kept() -> int:
        return sum(a.nbytes for spare in S._SPARE for a in spare.values())

    run(wide)
    unbounded, sets = kept(), len(S._SPARE)
    assert sets >= 4  # many threads took a set each
    monkeypatch.setattr(S, "SPARE_MAX_BYTES", unbounded // 3)
    run(wide)
    assert 0 < kept() <= unbounded // 3 and 1 <= len(S._SPARE) < sets
    monkeypatch.setattr(S, "SPARE_MAX_BYTES", 128 * 2**20)
    run(wide)
    assert any("buf" in spare for spare in S._SPARE)
    run(exact)  # float32 products: the float64 buffers are given back
    assert S._SPARE and not any("buf" in spare for spare in S._SPARE)
