"""The DESIGN Definitions as computations: lift, relative lift, rates, standing, bootstrap CIs and tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from mkb.analysis._tables import ENGINE, NOISE_ARM

DEFAULT_SEED = 20261129
DEFAULT_RESAMPLES = 10_000
DETECT_LIFT = 0.10  # a cell whose relative-lift CI half-width exceeds this could not detect a 10% lift
ARM_ORDER = ("transfer", "placebo", "same", "wrong", NOISE_ARM)
_EPS = 1e-9


@dataclass(frozen=True)
class BootstrapSpec:
    """How CIs are computed; printed with every table so a result can be reproduced."""

    seed: int = DEFAULT_SEED
    resamples: int = DEFAULT_RESAMPLES
    level: float = 0.95

    def describe(self) -> str:
        return (f"{self.level:.0%} CIs: problem-clustered percentile bootstrap, {self.resamples} resamples, "
                f"seed {self.seed}")


def _cluster_weights(n: int, spec: BootstrapSpec, rng: np.random.Generator) -> np.ndarray:
    """[resamples, n] counts: how often each of n clusters is drawn in each resample."""
    idx = rng.integers(0, n, size=(spec.resamples, n))
    flat = (idx + np.arange(spec.resamples)[:, None] * n).ravel()
    return np.bincount(flat, minlength=spec.resamples * n).reshape(spec.resamples, n).astype(np.float64)


def _percentiles(x: np.ndarray, qs: list[float]) -> np.ndarray:
    """[len(qs), rows]: np.quantile(x, qs, axis=1) (method "linear") of a NaN-free [rows, resamples] array.

    One partition of contiguous rows at the needed order statistics, then numpy's own interpolation
    (`_lerp`) written out: the same values as np.quantile (a test checks), at half its cost, because
    np.quantile also partitions at the minimum and maximum and copies the array strided.
    """
    x = np.ascontiguousarray(x)
    n = x.shape[1]
    virtual = (n - 1) * np.asarray(qs, dtype=np.float64)
    prev = np.floor(virtual)
    top = virtual >= n - 1
    prev[top] = -1.0  # numpy takes the maximum there (and its gamma then multiplies a zero difference)
    gamma = virtual - prev
    pi = prev.astype(np.intp)
    ni = np.where(top, -1, pi + 1)
    kth = np.unique(np.concatenate([pi % n, ni % n]))
    part = np.partition(x, kth, axis=1)
    a, b = part[:, pi].T, part[:, ni].T
    g = gamma[:, None]
    diff = b - a
    out = a + diff * g
    np.subtract(b, diff * (1 - g), out=out, where=np.broadcast_to(g >= 0.5, out.shape))
    return out


def cluster_bootstrap_many(cells: list, problems: np.ndarray, sums: dict[str, np.ndarray], stats: dict, spec: BootstrapSpec):
    """Several statistics from the same resamples: {name: (estimate, lo, hi)}, each as `cluster_bootstrap` returns it.

    Every statistic sees exactly the resamples a separate `cluster_bootstrap` call with the same spec
    would draw (one generator per statistic, seeded alike), so sharing them changes no number. Cells whose
    present problems are the same share one resample matrix, applied to all their cells and sums in one
    matrix product.
    """
    C = len(cells)
    present = sums["n"] > 0
    est = {name: stat(**{k: v.sum(1) for k, v in sums.items()}) for name, stat in stats.items()}
    lo = {name: np.full(C, np.nan) for name in stats}
    hi = {name: np.full(C, np.nan) for name in stats}
    groups: dict[bytes, list[int]] = {}
    for c in range(C):
        groups.setdefault(present[c].tobytes(), []).append(c)
    a = (1 - spec.level) / 2
    rng = np.random.default_rng(spec.seed)
    names = list(sums)
    for key in sorted(groups):
        cs = groups[key]
        cols = np.flatnonzero(present[cs[0]])
        if len(cols) < 2:
            continue
        w = _cluster_weights(len(cols), spec, rng)  # [resamples, problems]
        v = np.concatenate([sums[k][np.ix_(cs, cols)] for k in names])  # [sums x cells, problems]
        # one product for every sum and cell, laid out [cells, resamples] so each cell's resamples are contiguous
        # for the percentiles; the sums mkb passes are integer-valued (S is a multiple of 20, the rest counts),
        # so every product is exact and equals the former per-sum `w @ v.T` bit for bit
        summed = v @ w.T
        k = len(cs)
        parts = {name: summed[i * k:(i + 1) * k].T for i, name in enumerate(names)}  # [resamples, cells] views
        for name, stat in stats.items():
            boot = np.asarray(stat(**parts))  # [resamples, cells]
            with np.errstate(invalid="ignore"):
                q = _percentiles(boot.T, [a, 1 - a]) if not np.isnan(boot).any() else np.nanquantile(boot, [a, 1 - a], axis=0)
            lo[name][cs], hi[name][cs] = q[0], q[1]
    return {name: (est[name], lo[name], hi[name]) for name in stats}


def cluster_bootstrap(cells: list, problems: np.ndarray, sums: dict[str, np.ndarray], stat, spec: BootstrapSpec):
    """Resample problems within each cell; `sums[name]` is [cells, problems]; `stat(**summed)` -> [.., cells].

    Cells whose present problems are the same share one set of resamples (one matrix product for all);
    a problem is present in a cell when `sums["n"]` is positive there.
    """
    return cluster_bootstrap_many(cells, problems, sums, {"stat": stat}, spec)["stat"]


def _matrices(df: pl.DataFrame, cell_cols: list[str], values: dict[str, pl.Expr]):
    """Sum `values` per cell and problem into dense [cells, problems] arrays."""
    return _dense(df.group_by(*cell_cols, "problem").agg(**values), cell_cols, list(values))


def _dense(agg: pl.DataFrame, cell_cols: list[str], names: list[str]):
    """[cells, problems] arrays of the columns `names` of a per-(cell, problem) table; cells sorted."""
    cells_df = agg.select(cell_cols).unique().sort(cell_cols)
    cells_df = cells_df.with_row_index("_cell")
    problems = np.sort(agg["problem"].unique().to_numpy())
    agg = agg.join(cells_df, on=cell_cols, how="left", nulls_equal=True)
    ci = agg["_cell"].to_numpy()
    pi = np.searchsorted(problems, agg["problem"].to_numpy())
    out = {}
    for name in names:
        m = np.zeros((cells_df.height, len(problems)))
        m[ci, pi] = agg[name].to_numpy().astype(np.float64)
        out[name] = m
    return cells_df.drop("_cell"), problems, out


def _rel(SA, SB, n):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(SB > 0, (SA - SB) / np.where(SB > 0, SB, 1), np.nan)


def _mean_lift(SA, SB, n):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (SA - SB) / n


def lift_table(pairs: pl.DataFrame, *, by: tuple[str, ...] = (), spec: BootstrapSpec = BootstrapSpec(),
               tests: bool = True) -> pl.DataFrame:
    """One row per cell (stratum x model x arm x direction [x by]): lift, relative lift with CIs, rates, tests.

    relative lift = (sum S_arm - sum S_solo) / sum S_solo; rates are shares of problems whose
    replicate-mean lift is < 0 (regression), > 0 (improvement) or 0 (tie), pair-level shares beside.
    """
    cell = ["stratum", "model", "arm_kind", "direction", "source_dsl", "target_dsl", *by]
    # the noise-floor pseudo-arm is a cyclic shift of the solos: its summed lift is 0 by construction
    pairs = pairs.filter(pl.col("arm_kind") != NOISE_ARM)
    if pairs.height == 0:  # solos alone (or arms without their solo): no cell to report
        return pl.DataFrame()
    # one pass over the pairs per grouping, both collected together (in-memory engine: see _tables.ENGINE)
    lp = pairs.lazy()
    per_problem_q = lp.group_by(*cell, "problem").agg(
        SA=pl.col("S").sum(), SB=pl.col("S_solo").sum(), n=pl.len(),
        mean_lift=pl.col("lift").mean(), b=(pl.col("passed_solo") & ~pl.col("passed")).sum(),
        c=(~pl.col("passed_solo") & pl.col("passed")).sum())
    pair_rates_q = lp.group_by(cell).agg(
        n_pairs=pl.len(), S_arm=pl.col("S").mean(), S_solo=pl.col("S_solo").mean(),
        pass_arm=pl.col("passed").mean(), pass_solo=pl.col("passed_solo").mean(),
        pair_regress=(pl.col("lift") < -_EPS).mean(), pair_improve=(pl.col("lift") > _EPS).mean(),
        pair_tie=(pl.col("lift").abs() <= _EPS).mean())
    per_problem, pair_rates = pl.collect_all([per_problem_q, pair_rates_q], engine=ENGINE)
    cells, problems, m = _dense(per_problem, cell, ["SA", "SB", "n"])
    boot = cluster_bootstrap_many(cells, problems, m, {"rel": _rel, "mean": _mean_lift}, spec)
    (rel, rlo, rhi), (ml, mlo, mhi) = boot["rel"], boot["mean"]
    rates = per_problem.group_by(cell).agg(
        n_problems=pl.len(),
        regression_rate=(pl.col("mean_lift") < -_EPS).mean(), improvement_rate=(pl.col("mean_lift") > _EPS).mean(),
        tie_rate=(pl.col("mean_lift").abs() <= _EPS).mean(), problem_lifts=pl.col("mean_lift"),
        mcnemar_b=pl.col("b").sum(), mcnemar_c=pl.col("c").sum())
    out = cells.with_columns(
        lift=pl.Series(ml), lift_lo=pl.Series(mlo), lift_hi=pl.Series(mhi),
        rel_lift=pl.Series(rel), rel_lo=pl.Series(rlo), rel_hi=pl.Series(rhi),
    ).join(pair_rates, on=cell, how="left", nulls_equal=True).join(rates, on=cell, how="left", nulls_equal=True)
    out = out.with_columns(rel_halfwidth=(pl.col("rel_hi") - pl.col("rel_lo")) / 2)
    out = out.with_columns(detects_10pct=pl.col("rel_halfwidth") <= DETECT_LIFT)
    if tests:
        out = add_tests(out, group=["stratum", "arm_kind", *by])
    else:
        out = out.drop("problem_lifts")
    order = {k: i for i, k in enumerate(ARM_ORDER)}
    return out.with_columns(_o=pl.col("arm_kind").replace_strict(order, default=99)).sort("_o", *cell).drop("_o")


def wilcoxon_pratt(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value, zero_method="pratt", normal approximation with tie correction.

    The same arithmetic as scipy.stats.wilcoxon(d, zero_method="pratt", method="asymptotic") (a test
    checks they agree); written out so that `mkb-analyze lift` need not import scipy.stats (~1 s).
    """
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0 or np.all(d == 0):
        return math.nan if n == 0 else 1.0
    a = np.abs(d)
    order = np.argsort(a, kind="stable")
    sa = a[order]
    # average ranks over ties
    uniq, first, counts = np.unique(sa, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    r = np.empty(n)
    r[order] = np.repeat(avg, counts)
    r_plus, r_minus = r[d > 0].sum(), r[d < 0].sum()
    n_zero = int((d == 0).sum())
    mn = n * (n + 1) / 4.0 - n_zero * (n_zero + 1) / 4.0
    se = n * (n + 1) * (2 * n + 1) - n_zero * (n_zero + 1) * (2 * n_zero + 1)
    nz_counts = counts[uniq != 0]
    se -= 0.5 * float((nz_counts * (nz_counts * nz_counts - 1)).sum())
    se = math.sqrt(se / 24.0)
    if se == 0:
        return 1.0
    z = (min(r_plus, r_minus) - mn) / se
    return float(math.erfc(abs(z) / math.sqrt(2.0)))


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value: binomial test of c successes in b + c discordant pairs at 1/2."""
    n = b + c
    if n == 0 or b == c:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return float(min(1.0, 2.0 * tail))


def add_tests(cells: pl.DataFrame, *, group: list[str]) -> pl.DataFrame:
    """Wilcoxon (pratt) on problem-mean lifts, exact McNemar on pass, each Holm-adjusted across the cells of a group."""
    pw, pm = [], []
    for lifts, b, c in zip(cells["problem_lifts"].to_list(), cells["mcnemar_b"].to_list(), cells["mcnemar_c"].to_list()):
        # normal approximation: with zeros and ties (the rule for S lifts) an exact null does not apply
        pw.append(wilcoxon_pratt(np.round(np.asarray(lifts, dtype=float), 9)))
        pm.append(mcnemar_exact(int(b), int(c)))
    cells = cells.drop("problem_lifts").with_columns(p_wilcoxon=pl.Series(pw, dtype=pl.Float64),
                                                     p_mcnemar=pl.Series(pm, dtype=pl.Float64))
    cells = cells.with_row_index("_i")
    adj = []
    for _, g in cells.group_by(group, maintain_order=True):
        row = {"_i": g["_i"]}
        for col in ("p_wilcoxon", "p_mcnemar"):
            p = g[col].to_numpy()
            ok = ~np.isnan(p)
            h = np.full(len(p), np.nan)
            if ok.any():
                h[ok] = holm(p[ok])
            row[f"{col}_holm"] = h
        adj.append(pl.DataFrame(row))
    return cells.join(pl.concat(adj), on="_i").drop("_i")


def holm(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (as statsmodels' multipletests(method="holm"), without importing it)."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def _standing_stat(ia, ra, na, ib, rb, nb):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (ia - ra) / na - (ib - rb) / nb


def standing_table(pairs: pl.DataFrame, *, naive: bool = False, pooled: bool = True,
                   spec: BootstrapSpec = BootstrapSpec()) -> pl.DataFrame:
    """The standing table: per arm kind and direction (pooled over models, or per model), each class's
    improve/regress/tie shares and the standing effect = (improve - regress | above) - (same | below), with its CI.

    `naive` classifies against the solo the lift subtracts (biased; shown for contrast only).
    """
    col = "standing_naive" if naive else "standing"
    cell = ["stratum", "arm_kind", "direction"] + ([] if pooled else ["model"])
    p = pairs.filter(pl.col(col).is_not_null())
    if p.height == 0:
        return pl.DataFrame()
    imp, reg = pl.col("outcome") == "improve", pl.col("outcome") == "regress"
    vals = {}
    for c in ("above", "tie", "below"):
        inc = pl.col(col) == c
        vals[f"n_{c}"] = inc.sum()
        vals[f"imp_{c}"] = (inc & imp).sum()
        vals[f"reg_{c}"] = (inc & reg).sum()
    vals["n"] = pl.len()
    cells, problems, m = _matrices(p, cell, vals)
    sums = {"ia": m["imp_above"], "ra": m["reg_above"], "na": m["n_above"], "ib": m["imp_below"], "rb": m["reg_below"],
            "nb": m["n_below"], "n": m["n"]}
    est, lo, hi = cluster_bootstrap(cells, problems, sums, lambda n, **k: _standing_stat(**k), spec)
    tot = {k: v.sum(1) for k, v in m.items()}
    out = cells.with_columns(n_pairs=pl.Series(tot["n"].astype(int)))
    for c in ("above", "tie", "below"):
        n = tot[f"n_{c}"]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = out.with_columns(**{
                f"n_{c}": pl.Series(n.astype(int)),
                f"improve_{c}": pl.Series(tot[f"imp_{c}"] / n), f"regress_{c}": pl.Series(tot[f"reg_{c}"] / n),
                f"tie_{c}": pl.Series((n - tot[f"imp_{c}"] - tot[f"reg_{c}"]) / n)})
    out = out.with_columns(effect=pl.Series(est), effect_lo=pl.Series(lo), effect_hi=pl.Series(hi),
                           classified_against=pl.lit("solo the lift subtracts (naive)" if naive else "mean of other target solo replicates"))
    order = {k: i for i, k in enumerate(ARM_ORDER)}
    return out.with_columns(_o=pl.col("arm_kind").replace_strict(order, default=99)).sort("_o", *cell).drop("_o")


def cell_lift_simple(S_arm: list[float], S_solo: list[float]) -> tuple[float, float]:
    """(mean lift, relative lift) of paired S lists: the DESIGN formulas, for hand checks."""
    a, b = np.asarray(S_arm, float), np.asarray(S_solo, float)
    return float((a - b).mean()), float((a.sum() - b.sum()) / b.sum())
