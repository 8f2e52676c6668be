"""Rebuilds mkb's lift, standing and regression tables from a dataset's Parquet files and its schema card, without mkb.

A third party's check that an mkb dataset is self-describing: this file imports only polars and numpy
(numpy for the bootstrap's random draws), reads the Parquet files of an exported dataset
(`mkb-analyze export`: `data/<kind>/*.parquet` and the card `README.md`) or of a raw store
(`kind=<kind>/*.parquet`, with the card given by --card), and recomputes the figures from the
definitions the card states. `tests/analysis/test_reanalysis_kit.py` checks they equal `mkb-analyze`'s.

Usage: python analysis/rebuild.py DATASET [--card README.md] [--out DIR] [--seed 20261129] [--resamples 10000]
                                  [--score s|s_upstream]
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import polars as pl

THRESHOLDS = (0.0, 0.5, 1.0, 2.0, 4.0)  # S = 100 x mean over t of (passed and speedup >= t)
EPS = 1e-9
NOISE_ARM = "solo_noise"
ARM_ORDER = ("transfer", "placebo", "same", "wrong", NOISE_ARM)
# the columns this kit reads; the card must document each (that is what "self-describing" means here)
NEEDED = {
    "attempt_started": ("attempt_id", "ts", "model", "problem", "family", "target_dsl", "source_dsl", "arm_kind", "replicate",
                        "skill_source_attempt"),
    "attempt_finished": ("attempt_id", "ts", "status", "final_kernel_sha256"),
    "verdict": ("attempt_id", "ts", "scope", "passed", "speedup", "kernel_sha256"),
    "annotation": ("target_attempt_id", "ts", "label"),
}
# the score: S on the speedup over eager, or S_upstream on the speedup over the problem's reference timed as upstream
# times it (the verdict records both, and the score itself to tell a verdict that predates it); the plan names the default
SCORES = {"s": ("speedup", "s"), "s_upstream": ("speedup_upstream", "s_upstream")}


# ----------------------------------------------------------------------------------------------- reading


def read_card(path: Path) -> dict[str, dict[str, str]]:
    """{kind: {column: type}} from the card's per-kind column tables ("## `kind` (schema x.y)" then "| `col` | type |...")."""
    kinds: dict[str, dict[str, str]] = {}
    cur = None
    for line in path.read_text().splitlines():
        m = re.match(r"^## `([a-z_]+)`", line)
        if m:
            cur = kinds.setdefault(m.group(1), {})
            continue
        m = re.match(r"^\| `([A-Za-z0-9_]+)` \| ([^|]+) \|", line)
        if m and cur is not None:
            cur[m.group(1)] = m.group(2).strip()
    return kinds


def read_kind(root: Path, kind: str, card: dict[str, dict[str, str]], *, extra: tuple[str, ...] = ()) -> pl.DataFrame:
    """Every row of one event kind (files of several schema minors are aligned by column name)."""
    files = sorted((root / "data" / kind).glob("*.parquet")) or sorted((root / f"kind={kind}").glob("*.parquet"))
    need = NEEDED.get(kind, ()) + extra
    if need:
        missing = [c for c in need if c not in card.get(kind, {})]
        if missing and files:
            raise SystemExit(f"error: the schema card does not document {kind}.{', '.join(missing)}\n"
                             "hint: the dataset is not self-describing; export it with `mkb-analyze export`")
    if not files:
        return pl.DataFrame({c: [] for c in need})
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")


def _one(df: pl.DataFrame, key: str, keep: str) -> pl.DataFrame:
    return df if df[key].n_unique() == df.height else df.sort("ts").unique(subset=key, keep=keep)


def plan_score(root: Path, card: dict[str, dict[str, str]]) -> str:
    """The score the plans of the dataset's experiments name (null, or no plan: s); experiments scored differently are refused."""
    st = read_kind(root, "attempt_started", card)
    plans = read_kind(root, "plan", card)
    named = {}
    if plans.height and "score" in plans.columns:
        for e, sc in plans.sort("ts").select("experiment", "score").iter_rows():
            named[e] = sc or "s"
    elif plans.height:
        named = {e: "s" for e in plans["experiment"]}
    used = {named.get(e, "s") for e in (st["experiment"].unique().to_list() if "experiment" in st.columns else [None])}
    if len(used) > 1:
        raise SystemExit(f"error: the dataset's experiments are scored differently ({', '.join(sorted(used))})\n"
                         "hint: pass --score s or --score s_upstream")
    return used.pop() if used else "s"


def attempts(root: Path, card: dict[str, dict[str, str]], *, score: str = "s") -> pl.DataFrame:
    """One row per attempt: the verdict that counts (pair re-grade, else the attempt's own), S, and why it is excluded."""
    sp_col, s_col = SCORES[score]
    st = _one(read_kind(root, "attempt_started", card).filter(pl.col("attempt_id").is_not_null()), "attempt_id", "first")
    fin = _one(read_kind(root, "attempt_finished", card), "attempt_id", "last").select("attempt_id", "status", "final_kernel_sha256")
    ver = read_kind(root, "verdict", card, extra=(sp_col, s_col))
    if ver.height:
        ver = ver.with_columns(pl.col(sp_col).alias("speedup"), pl.col(s_col).alias("score_recorded"))
    ann = read_kind(root, "annotation", card)
    ann = _one(ann.select(attempt_id="target_attempt_id", ts="ts", label="label"), "attempt_id", "last").drop("ts") if ann.height \
        else pl.DataFrame({"attempt_id": [], "label": []}, schema={"attempt_id": pl.Utf8, "label": pl.Utf8})
    v = {}
    for scope in ("pair", "attempt"):
        s = ver.filter(pl.col("scope") == scope) if ver.height else ver
        s = _one(s, "attempt_id", "last") if s.height else s
        cols = ("passed", "speedup", "kernel_sha256", "score_recorded")
        v[scope] = (s.select("attempt_id", **{f"{scope}_{c}": c for c in cols}) if s.height else
                    pl.DataFrame(schema={"attempt_id": pl.Utf8, f"{scope}_passed": pl.Boolean, f"{scope}_speedup": pl.Float64,
                                         f"{scope}_kernel_sha256": pl.Utf8, f"{scope}_score_recorded": pl.Float64}))
    a = (st.drop("ts").join(fin, on="attempt_id", how="left").join(v["pair"], on="attempt_id", how="left")
         .join(v["attempt"], on="attempt_id", how="left").join(ann, on="attempt_id", how="left"))
    pair = pl.col("pair_passed").is_not_null()
    att = pl.col("attempt_passed").is_not_null()
    pick = lambda c: pl.when(pair).then(pl.col(f"pair_{c}")).otherwise(pl.col(f"attempt_{c}"))  # noqa: E731
    a = a.with_columns(source=pl.when(pair).then(pl.lit("pair")).when(att).then(pl.lit("attempt")).otherwise(pl.lit("none")),
                       vp=pick("passed"), vs=pick("speedup"), vk=pick("kernel_sha256"), vr=pick("score_recorded"))
    kernel = pl.col("final_kernel_sha256").is_not_null() | pl.col("vk").is_not_null()
    a = a.with_columns(family=pl.col("family").fill_null("unknown"), status=pl.col("status").fill_null("unfinished"),
                       passed=pl.col("vp").fill_null(False) & kernel, kernel=kernel)
    a = a.with_columns(S=20.0 * pl.sum_horizontal([(pl.col("passed") & (pl.col("vs") >= t).fill_null(False)).cast(pl.Int32)
                                                  for t in THRESHOLDS]))
    a = a.with_columns(excluded=pl.when(pl.col("status") == "unfinished").then(pl.lit("unfinished"))
                       .when(pl.col("status") == "infra_error").then(pl.lit("infra_error"))
                       .when(pl.col("label").is_not_null() & (pl.col("label") != "clean")).then(pl.lit("annotated"))
                       .when(pl.col("kernel") & (pl.col("source") == "none")).then(pl.lit("ungraded"))
                       .when(~pl.col("status").is_in(["finished", "budget_exhausted"])).then(pl.lit("unknown_status")))
    missing = a.filter(pl.col("excluded").is_null() & (pl.col("source") != "none") & pl.col("vr").is_null()).height
    if missing:
        raise SystemExit(f"error: {missing} counted verdicts have no {s_col} column (graded before the verdict recorded it)\n"
                         "hint: rebuild with --score s")
    return a.select("attempt_id", "model", "problem", "family", "target_dsl", "source_dsl", "arm_kind", "replicate",
                    "skill_source_attempt", "passed", "S", "excluded")


def pairs(a: pl.DataFrame) -> pl.DataFrame:
    """Each non-solo arm with the solo of its target DSL (same model, problem, replicate), its source and standing.

    Standing: the source's solo S against the mean S of the target's solo replicates other than the subtracted one
    (and other than the source or pseudo-arm when they are target solos). Noise floor (solo_noise): in block
    (model, problem, r, target) the target's solo at r+1 against its solo at r, the source the source DSL's solo at
    r+2 (R >= 3). A placebo without source_dsl takes its block's transfer source.
    """
    key = ["model", "problem", "replicate", "target_dsl"]
    grp = ["model", "problem", "target_dsl"]
    inc = a.filter(pl.col("excluded").is_null())
    solos = inc.filter(pl.col("arm_kind") == "solo")
    base = solos.select(*key, base_attempt="attempt_id", S_solo="S", passed_solo="passed")
    arms = inc.filter(pl.col("arm_kind") != "solo").select(*key, "family", "arm_kind", "source_dsl", "attempt_id",
                                                           "skill_source_attempt", "S", "passed")
    tsrc = arms.filter(pl.col("arm_kind") == "transfer").group_by(key).agg(tsrc=pl.col("source_dsl").drop_nulls().first())
    arms = arms.join(tsrc, on=key, how="left").with_columns(
        source_dsl=pl.when(pl.col("arm_kind") == "placebo").then(pl.coalesce("source_dsl", "tsrc")).otherwise(pl.col("source_dsl")))
    solo_of = solos.select("model", "problem", "replicate", dsl="target_dsl", solo_id="attempt_id")
    arms = arms.join(solo_of, left_on=["model", "problem", "replicate", "source_dsl"], right_on=["model", "problem", "replicate", "dsl"],
                     how="left")
    arms = arms.with_columns(source_attempt=pl.coalesce("skill_source_attempt", pl.when(pl.col("arm_kind") == "placebo")
                                                        .then(pl.col("solo_id")))).drop("tsrc", "solo_id", "skill_source_attempt")
    R = solos.group_by(grp).agg(R=pl.col("replicate").max() + 1)
    noise = solos.join(R, on=grp).filter(pl.col("R") >= 3).select(
        "model", "problem", "target_dsl", "family", "attempt_id", "S", "passed", "R",
        replicate=(pl.col("replicate") - 1) % pl.col("R"), arm_kind=pl.lit(NOISE_ARM))
    noise = noise.join(tsrc.rename({"tsrc": "source_dsl"}), on=key, how="left")
    noise = noise.with_columns(src_rep=(pl.col("replicate") + 2) % pl.col("R")).join(
        solo_of, left_on=["model", "problem", "src_rep", "source_dsl"], right_on=["model", "problem", "replicate", "dsl"], how="left")
    noise = noise.rename({"solo_id": "source_attempt"}).select(arms.columns)
    p = pl.concat([arms, noise], how="vertical_relaxed").join(base, on=key, how="inner")
    src = a.select(source_attempt="attempt_id", S_source="S", src_ex="excluded", s_model="model", s_problem="problem",
                   s_tgt="target_dsl", s_kind="arm_kind", s_rep="replicate")
    p = p.join(src, on="source_attempt", how="left").join(solos.group_by(grp).agg(sum_S=pl.col("S").sum(), n_solo=pl.len()),
                                                          on=grp, how="left")
    in_grp = ((pl.col("s_kind") == "solo") & (pl.col("s_model") == pl.col("model")) & (pl.col("s_problem") == pl.col("problem"))
              & (pl.col("s_tgt") == pl.col("target_dsl")) & (pl.col("s_rep") != pl.col("replicate"))).fill_null(False)
    is_noise = pl.col("arm_kind") == NOISE_ARM
    num = pl.col("sum_S") - pl.col("S_solo") - pl.when(in_grp).then(pl.col("S_source")).otherwise(0.0) \
        - pl.when(is_noise).then(pl.col("S")).otherwise(0.0)
    den = pl.col("n_solo") - 1 - in_grp.cast(pl.Int64) - is_noise.cast(pl.Int64)
    p = p.with_columns(ref=pl.when(den > 0).then(num / den.cast(pl.Float64)), lift=pl.col("S") - pl.col("S_solo"))
    diff = pl.col("S_source") - pl.col("ref")
    ok = pl.col("S_source").is_not_null() & pl.col("src_ex").is_null() & pl.col("ref").is_not_null()
    return p.with_columns(
        standing=pl.when(~ok).then(None).when(diff > EPS).then(pl.lit("above")).when(diff < -EPS).then(pl.lit("below"))
        .otherwise(pl.lit("tie")),
        outcome=pl.when(pl.col("lift") > EPS).then(pl.lit("improve")).when(pl.col("lift") < -EPS).then(pl.lit("regress"))
        .otherwise(pl.lit("tie")),
        direction=pl.format("{}->{}", pl.col("source_dsl").fill_null("-"), pl.col("target_dsl")))


# ----------------------------------------------------------------------------------------------- statistics


def bootstrap(sums: dict[str, np.ndarray], stats: dict, *, seed: int, resamples: int, level: float = 0.95):
    """Problem-clustered percentile bootstrap: cells with the same present problems share resamples, drawn in the
    order of their presence pattern's bytes from one generator seeded with `seed` (how mkb draws them)."""
    C = sums["n"].shape[0]
    present = sums["n"] > 0
    est = {k: f(**{n: v.sum(1) for n, v in sums.items()}) for k, f in stats.items()}
    lo = {k: np.full(C, np.nan) for k in stats}
    hi = {k: np.full(C, np.nan) for k in stats}
    groups: dict[bytes, list[int]] = {}
    for c in range(C):
        groups.setdefault(present[c].tobytes(), []).append(c)
    rng = np.random.default_rng(seed)
    q = [(1 - level) / 2, 1 - (1 - level) / 2]
    for k in sorted(groups):
        cs = groups[k]
        cols = np.flatnonzero(present[cs[0]])
        if len(cols) < 2:
            continue
        n = len(cols)
        idx = rng.integers(0, n, size=(resamples, n))
        w = np.bincount((idx + np.arange(resamples)[:, None] * n).ravel(), minlength=resamples * n).reshape(resamples, n).astype(float)
        parts = {name: (w @ v[np.ix_(cs, cols)].T) for name, v in sums.items()}  # [resamples, cells]
        for name, f in stats.items():
            b = np.asarray(f(**parts))
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                qq = np.quantile(b, q, axis=0) if not np.isnan(b).any() else np.nanquantile(b, q, axis=0)
            lo[name][cs], hi[name][cs] = qq[0], qq[1]
    return {k: (est[k], lo[k], hi[k]) for k in stats}


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), np.nan)


def _dense(agg: pl.DataFrame, cell: list[str], names: list[str]):
    cells = agg.select(cell).unique().sort(cell).with_row_index("_c")
    problems = np.sort(agg["problem"].unique().to_numpy())
    agg = agg.join(cells, on=cell, how="left", nulls_equal=True)
    ci, pi = agg["_c"].to_numpy(), np.searchsorted(problems, agg["problem"].to_numpy())
    out = {}
    for n in names:
        m = np.zeros((cells.height, len(problems)))
        m[ci, pi] = agg[n].to_numpy().astype(float)
        out[n] = m
    return cells.drop("_c"), out


def _floor(lifts: list[float]) -> float:
    """The regression rate if arm and solo were exchangeable in each pair: (1 - P(sum of sign-flipped lifts = 0)) / 2."""
    dist = np.array([1.0])
    for d in lifts:
        k = int(round(abs(d) / 20.0))
        step = np.zeros(2 * k + 1)
        step[0] += 0.5
        step[-1] += 0.5
        dist = np.convolve(dist, step)
    return (1 - float(dist[(len(dist) - 1) // 2])) / 2


def lift(p: pl.DataFrame, *, seed: int, resamples: int) -> pl.DataFrame:
    """Per model x arm x direction, plus a row per model x arm pooled over directions."""
    p = p.filter(pl.col("arm_kind") != NOISE_ARM)
    pooled = p.with_columns(direction=pl.lit("pooled"), source_dsl=pl.lit("*"), target_dsl=pl.lit("*"))
    out = pl.concat([_lift(p, seed, resamples), _lift(pooled, seed, resamples)], how="vertical_relaxed")
    order = {k: i for i, k in enumerate(ARM_ORDER)}
    return out.with_columns(_o=pl.col("arm_kind").replace_strict(order, default=99), _p=pl.col("direction") == "pooled") \
        .sort("_o", "_p", "model", "arm_kind", "direction", "source_dsl", "target_dsl").drop("_o", "_p")


def _lift(p: pl.DataFrame, seed: int, resamples: int) -> pl.DataFrame:
    cell = ["model", "arm_kind", "direction", "source_dsl", "target_dsl"]
    pp = p.group_by(*cell, "problem").agg(SA=pl.col("S").sum(), SB=pl.col("S_solo").sum(), n=pl.len(), m=pl.col("lift").mean(),
                                          lifts=pl.col("lift"))
    pp = pp.with_columns(reg=(pl.col("m") < -EPS).cast(pl.Float64), imp=(pl.col("m") > EPS).cast(pl.Float64),
                         tie=(pl.col("m").abs() <= EPS).cast(pl.Float64), one=pl.lit(1.0))
    cells, m = _dense(pp, cell, ["SA", "SB", "n", "reg", "imp", "tie", "one"])
    b = bootstrap(m, {"lift": lambda SA, SB, n, **_: _div(SA - SB, n), "rel_lift": lambda SA, SB, **_: _div(SA - SB, SB),
                      "regression_rate": lambda reg, one, **_: _div(reg, one), "improvement_rate": lambda imp, one, **_: _div(imp, one),
                      "tie_rate": lambda tie, one, **_: _div(tie, one)}, seed=seed, resamples=resamples)
    cols = {}
    for name, (e, lo, hi) in b.items():
        stem = "rel" if name == "rel_lift" else name
        cols.update({name: pl.Series(e), f"{stem}_lo": pl.Series(lo), f"{stem}_hi": pl.Series(hi)})
    out = cells.with_columns(**cols).with_columns(pl.col(pl.Float64).fill_nan(None))
    info = p.group_by(cell).agg(n_pairs=pl.len(), S_arm=pl.col("S").mean(), S_solo=pl.col("S_solo").mean(),
                                pair_regress=(pl.col("lift") < -EPS).mean())
    fl = pp.group_by(cell).agg(n_problems=pl.len(), lifts=pl.col("lifts"))
    fl = fl.with_columns(regression_noise_floor=pl.col("lifts").map_elements(
        lambda ls: float(np.mean([_floor(list(x)) for x in ls])), return_dtype=pl.Float64)).drop("lifts")
    return out.join(info, on=cell, how="left", nulls_equal=True).join(fl, on=cell, how="left", nulls_equal=True)


def standing(p: pl.DataFrame, *, seed: int, resamples: int) -> pl.DataFrame:
    """Per arm x direction pooled over models (plus a row pooled over directions): class shares and the standing effect."""
    p = p.filter(pl.col("standing").is_not_null())
    out = pl.concat([_standing(p, seed, resamples), _standing(p.with_columns(direction=pl.lit("pooled")), seed, resamples)],
                    how="vertical_relaxed")
    order = {k: i for i, k in enumerate(ARM_ORDER)}
    return out.with_columns(_o=pl.col("arm_kind").replace_strict(order, default=99), _p=pl.col("direction") == "pooled") \
        .sort("_o", "_p", "arm_kind", "direction").drop("_o", "_p")


def _standing(p: pl.DataFrame, seed: int, resamples: int) -> pl.DataFrame:
    cell = ["arm_kind", "direction"]
    v = {"n": pl.len()}
    for c in ("above", "tie", "below"):
        inc = pl.col("standing") == c
        v |= {f"n_{c}": inc.sum(), f"imp_{c}": (inc & (pl.col("outcome") == "improve")).sum(),
              f"reg_{c}": (inc & (pl.col("outcome") == "regress")).sum(), f"lift_{c}": pl.col("lift").filter(inc).sum()}
    cells, m = _dense(p.group_by(*cell, "problem").agg(**v), cell, list(v))
    b = bootstrap(m, {"effect": lambda imp_above, reg_above, n_above, imp_below, reg_below, n_below, **_:
                      _div(imp_above - reg_above, n_above) - _div(imp_below - reg_below, n_below),
                      "effect_S": lambda lift_above, n_above, lift_below, n_below, **_: _div(lift_above, n_above) - _div(lift_below, n_below)},
                  seed=seed, resamples=resamples)
    tot = {k: x.sum(1) for k, x in m.items()}
    out = cells.with_columns(n_pairs=pl.Series(tot["n"].astype(int)))
    for c in ("above", "tie", "below"):
        out = out.with_columns(**{f"n_{c}": pl.Series(tot[f"n_{c}"].astype(int)), f"improve_{c}": pl.Series(_div(tot[f"imp_{c}"], tot[f"n_{c}"])),
                                  f"regress_{c}": pl.Series(_div(tot[f"reg_{c}"], tot[f"n_{c}"]))})
    for name, (e, lo, hi) in b.items():
        out = out.with_columns(**{name: pl.Series(e), f"{name}_lo": pl.Series(lo), f"{name}_hi": pl.Series(hi)})
    return out.with_columns(pl.col(pl.Float64).fill_nan(None))


def regression(lt: pl.DataFrame) -> pl.DataFrame:
    """The regression table: share of problems whose replicate-mean lift < 0, its CI and its noise floor."""
    return lt.select("model", "arm_kind", "direction", "n_problems", "regression_rate", "regression_rate_lo", "regression_rate_hi",
                     "regression_noise_floor", "pair_regress")


def rebuild(dataset: str | Path, *, card: str | Path | None = None, seed: int = 20261129, resamples: int = 10_000,
            score: str | None = None) -> dict[str, pl.DataFrame]:
    """{"lift", "standing", "regression"} for one dataset with one version stratum, under `score` (None: the plan's)."""
    root = Path(dataset)
    card_path = Path(card) if card else root / "README.md"
    if not card_path.exists():
        raise SystemExit(f"error: no schema card at {card_path}\nhint: export the dataset with `mkb-analyze export` or pass --card")
    c = read_card(card_path)
    if score is not None and score not in SCORES:
        raise SystemExit(f"error: unknown score {score!r}\nhint: s or s_upstream")
    a = attempts(root, c, score=score or plan_score(root, c))
    p = pairs(a)
    lt = lift(p, seed=seed, resamples=resamples)
    return {"lift": lt, "standing": standing(p, seed=seed, resamples=resamples), "regression": regression(lt)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--card", default=None)
    ap.add_argument("--out", default=None, help="Write lift.csv, standing.csv and regression.csv here.")
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--score", choices=tuple(SCORES), default=None, help="s or s_upstream (default: the one the plan names).")
    args = ap.parse_args()
    tables = rebuild(args.dataset, card=args.card, seed=args.seed, resamples=args.resamples, score=args.score)
    pl.Config.set_tbl_rows(60)
    pl.Config.set_tbl_cols(20)
    for name, df in tables.items():
        print(f"== {name}")
        print(df)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            df.write_csv(Path(args.out) / f"{name}.csv")


if __name__ == "__main__":
    sys.exit(main())
