"""Why one short kernel's median differs between gradings (issues #9, #10): every figure of docs/timing-repeatability.md.

Two modes.

Datasets (default, CPU): reads the committed H200 timing events graded under the SM-hold window
(`stream-window/flush-read-6xL2/sm-hold-1ms/premade-sets/v3`: h200-checks-ab, h200-checks-ab-2, h200-grader-2-2,
h200-grader-2-3) and, for contrast, the same kernels under the earlier windows (v2: flush only; v3 with a one-thread
sleep), and prints, per section:

- `levels`: per kernel (problem, DSL, kernel file hash; >= 4 gradings): the spread of the gradings' medians against
  each grading's own bootstrap standard error of the median, the between-grading component tau, how often two
  gradings differ by more than 0.5%, and whether the whole distribution moves (slopes of q10 / q90 / min on the median);
- `abba`: h200-checks-ab-2's A1, B1, B2, A2 per baseline, each with its 95% bootstrap CI, and each pair's difference in
  units of its standard error;
- `sets`: the per-call times against the input set (call index): do the same sets run slow in every grading?
- `covariates`: the grading's level (median / mean of its kernel in its dataset) against the clock, temperature and
  power readings, the hold, host dispatch, tail, warm-ups, input sets, time since the previous grading, order, queue;
- `cupti`: the kernel's own duration (the profiled calls' CUPTI kernel time, same process) against the window's median;
- `policies`: the same kernels' spread under the earlier windows (flush only; one-thread sleep);
- `eager`: the eager baseline's spread between sessions (it divides every speedup);
- `implications`: the 0.5% criterion and R@t under the measured tau.

    python benchmarks/timing_repeatability.py                     # every section
    python benchmarks/timing_repeatability.py --section levels abba

GPU experiment (`--gpu`, stdlib + torch only: runs on the GPU host): the test of the finding. Each of several fresh
processes times the same kernels (01 cute, 25 cute, 28 cute, 28's eager) in repeated "gradings" (fresh pre-made input
sets, the read flush, `stream_window`, 10 + 100 calls) behind each of these holds: `hold` (the grader's jiterator SM
hold, which reads and writes an 8.6 MB buffer just before every window), `quiet` (the same occupancy, every thread slot
spinning, but a raw NVRTC kernel that touches no memory), `sleep` (a one-thread GPU sleep), and on request `none` (the
flush only: the v2 window). Writes `$OUT/levels.json`, prints the table (`--summary FILE` prints it again from the
JSON). The doc gives the command and what each outcome means.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HOLD_POLICY = "stream-window/flush-read-6xL2/sm-hold-1ms/premade-sets/v3"
HOLD_DATASETS = ("h200-checks-ab", "h200-checks-ab-2", "h200-grader-2-2", "h200-grader-2-3")
# the same kernels under the windows before the SM hold: v2 (flush only) and v3's first form (one-thread sleep)
EARLIER_DATASETS = ("h200-experiment-demo", "h200-grading-queue", "h200-grader-bench", "h200-baselines-2-1")
SHORT_US = 400.0  # "short kernel": median below this
MIN_GRADINGS = 4
TOL = 0.005  # the grader's promise: a kernel's median repeats within 0.5%
BOOT = 2000
SEED = 20261201


# ----------------------------------------------------------------------------------------------------------------
# statistics (stdlib, so that the GPU host can summarise its own run)
# ----------------------------------------------------------------------------------------------------------------

def boot_se(xs: list[float], *, resamples: int = BOOT, seed: int = SEED) -> float:
    """Bootstrap standard error of the median of `xs` (the within-grading noise a median carries)."""
    try:
        import numpy as np
    except ImportError:  # the GPU host: the same estimate, slower
        rng = random.Random(seed)
        n = len(xs)
        meds = [statistics.median(rng.choices(xs, k=n)) for _ in range(min(resamples, 400))]
        return statistics.stdev(meds)
    a = np.asarray(xs, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(a), (resamples, len(a)))
    return float(np.median(a[idx], axis=1).std(ddof=1))


def boot_ci(xs: list[float], *, resamples: int = BOOT, seed: int = SEED) -> tuple[float, float]:
    """95% percentile bootstrap interval of the median."""
    import numpy as np

    a = np.asarray(xs, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(a), (resamples, len(a)))
    lo, hi = np.percentile(np.median(a[idx], axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def tau(medians: list[float], ses: list[float]) -> float:
    """Between-grading standard deviation beyond what each grading's own noise explains (method of moments, >= 0)."""
    if len(medians) < 2:
        return math.nan
    return math.sqrt(max(0.0, statistics.variance(medians) - statistics.fmean(s * s for s in ses)))


def tau_within(rr: list) -> float:
    """`tau` from the spread within each dataset (one GPU session) only: pooled variance of the medians about their
    dataset's mean, less the gradings' own noise. What two gradings of one session differ by."""
    groups: dict[str, list] = {}
    for g in rr:
        groups.setdefault(g.ds, []).append(g)
    ss, dof = 0.0, 0
    for sub in groups.values():
        if len(sub) > 1:
            mu = statistics.fmean(g.median for g in sub)
            ss += sum((g.median - mu) ** 2 for g in sub)
            dof += len(sub) - 1
    if not dof:
        return math.nan
    return math.sqrt(max(0.0, ss / dof - statistics.fmean(g.se ** 2 for g in rr)))


def pct(x: float, ref: float) -> float:
    return 100.0 * x / ref


@dataclass(frozen=True)
class Spread:
    """Where a kernel's gradings spread (the GPU experiments' tables), in % of their mean: all of them, beyond each
    grading's own noise (tau), between the processes' means, and between the reps of one process (pooled)."""

    n: int
    processes: int
    mean_us: float
    sd_pct: float
    tau_pct: float
    sd_process_pct: float
    sd_reps_pct: float
    se_within_pct: float
    min_us: float
    max_us: float


def spread(gradings: list[dict]) -> Spread:
    """`Spread` of gradings that each carry `median_us`, `times_us` and `process`."""
    meds = [g["median_us"] for g in gradings]
    ses = [boot_se(g["times_us"], resamples=400) for g in gradings]
    m = statistics.fmean(meds)
    per_proc: dict[int, list[float]] = {}
    for g in gradings:
        per_proc.setdefault(g["process"], []).append(g["median_us"])
    pm = [statistics.fmean(v) for v in per_proc.values()]
    within = [statistics.variance(v) for v in per_proc.values() if len(v) > 1]
    return Spread(
        n=len(gradings), processes=len(per_proc), mean_us=m,
        sd_pct=pct(statistics.stdev(meds), m) if len(meds) > 1 else math.nan, tau_pct=pct(tau(meds, ses), m),
        sd_process_pct=pct(statistics.stdev(pm), m) if len(pm) > 1 else math.nan,
        sd_reps_pct=pct(math.sqrt(statistics.fmean(within)), m) if within else math.nan,
        se_within_pct=pct(math.sqrt(statistics.fmean(s * s for s in ses)), m), min_us=min(meds), max_us=max(meds))


def spearman(x: list[float], y: list[float]) -> tuple[float, float]:
    from scipy import stats

    r = stats.spearmanr(x, y)
    return float(r.statistic), float(r.pvalue)


def p_exceed(tau_rel: float, tol: float = TOL) -> float:
    """P(two gradings' medians differ by more than `tol`) when each carries an independent level of sd `tau_rel`."""
    if tau_rel <= 0:
        return 0.0
    return math.erfc(tol / (2.0 * tau_rel))  # |d| ~ half-normal with sd sqrt(2) tau: P(|d| > tol) = erfc(tol / (2 tau))


# ----------------------------------------------------------------------------------------------------------------
# the committed datasets
# ----------------------------------------------------------------------------------------------------------------

class Grading:
    """One timing event: the per-call times in call order and what the event says about the grading."""

    def __init__(self, ds: str, row: dict, label: tuple[str | None, str | None], profiled: list[dict]) -> None:
        d = json.loads(row["details"])
        self.ds, self.ts, self.eid = ds, row["ts"], row["evaluation_id"]
        self.problem, self.dsl, self.sha = int(row["problem"]), row["dsl"], row["kernel_sha256"]
        self.policy = row.get("timing_policy")
        self.times = [float(t) for t in d["times_us"]]
        self.median = statistics.median(self.times)
        self.n_warm = int(row["n_warmup"])
        self.details = d
        self.clocks = json.loads(row["clocks"]) if row.get("clocks") else {}
        self.eager_us = row.get("eager_median_us")
        self.key, self.arm = label
        self.profiled = profiled
        self._se: float | None = None

    @property
    def kernel(self) -> tuple[int, str, str]:
        return (self.problem, self.dsl, self.sha[:8])

    @property
    def se(self) -> float:
        if self._se is None:
            self._se = boot_se(self.times)
        return self._se

    def clock(self, when: str, what: str) -> float | None:
        v = (self.clocks.get(when) or {}).get(what)
        return float(v) if v is not None else None

    def quantile(self, q: float) -> float:
        import numpy as np

        return float(np.percentile(self.times, q))

    def cupti_us(self) -> float | None:
        """Mean CUPTI duration of the call's kernels over the grading's profiled calls (same process, no hold)."""
        xs = [p["dsl_device_us"] + (p.get("allowlisted_device_us") or 0) for p in self.profiled if p.get("dsl_device_us") is not None]
        return statistics.fmean(xs) if xs else None


def _labels(events: Path) -> dict[str, tuple[str, str]]:
    """evaluation id -> (what was graded, which pass/arm), from each run's logs/summary.json."""
    out: dict[str, tuple[str, str]] = {}
    for ds in HOLD_DATASETS:
        s = json.loads((events / ds / "logs" / "summary.json").read_text())
        for arm in ("serial", "queue"):
            for k, v in (s.get(arm) or {}).items():
                key, _, rnd = k.partition("#")
                out[v["evaluation_id"]] = (key, arm + (f"#{rnd}" if rnd else ""))
        for v in s.get("pair") or []:
            out[v["evaluation_id"]] = (v["key"], "pair")
        for key, arms in (s.get("rows") or {}).items():
            for tag, v in arms.items():
                out[v["evaluation_id"]] = (f"baseline/{key}", "B1" if tag == "B" else tag)
    return out


def load(events: Path, datasets: tuple[str, ...], *, policy: str | None) -> list[Grading]:
    """Every passed timing event of `datasets` (timing policy `policy`, or any when None), oldest first."""
    import polars as pl

    labels = _labels(events)
    out: list[Grading] = []
    for ds in datasets:
        timing = pl.concat([pl.read_parquet(f) for f in sorted((events / ds / "kind=timing").glob("*.parquet"))], how="diagonal_relaxed")
        prof: dict[str, list[dict]] = {}
        for f in sorted((events / ds / "kind=integrity").glob("*.parquet")):
            for r in pl.read_parquet(f).select("evaluation_id", "details").iter_rows(named=True):
                if r["details"]:
                    prof[r["evaluation_id"]] = json.loads(r["details"]).get("profiled") or []
        for r in timing.iter_rows(named=True):
            if not r["ok"] or (policy is not None and r.get("timing_policy") != policy):
                continue
            out.append(Grading(ds, r, labels.get(r["evaluation_id"], (None, None)), prof.get(r["evaluation_id"], [])))
    out.sort(key=lambda g: g.ts)
    return out


def by_kernel(gs: list[Grading], *, min_n: int = MIN_GRADINGS) -> dict[tuple[int, str, str], list[Grading]]:
    out: dict[tuple[int, str, str], list[Grading]] = {}
    for g in gs:
        out.setdefault(g.kernel, []).append(g)
    return {k: v for k, v in sorted(out.items()) if len(v) >= min_n}


def slope(x: list[float], y: list[float]) -> float:
    import numpy as np

    return float(np.polyfit(x, y, 1)[0])


def section_levels(gs: list[Grading]) -> dict[tuple, float]:
    print("\n## levels: the spread of gradings' medians against each grading's own noise (timing policy v3, SM hold)")
    print("(sd_between: sd of the gradings' medians; se_within: rms of each grading's bootstrap se of its median; tau: the")
    print("between-grading component, all sessions; tau_ds: the same within one dataset (one GPU session), pooled)")
    print("kernel            n   mean us   sd_between  se_within  tau     tau_ds  range   >0.5%  |z| med  slope q10/q90/min   medians (sorted)")
    taus: dict[tuple, float] = {}
    for k, rr in by_kernel(gs).items():
        meds = [g.median for g in rr]
        ses = [g.se for g in rr]
        m = statistics.fmean(meds)
        t = tau(meds, ses)
        t_ds = tau_within(rr)
        taus[k] = t_ds / m
        pairs = [(abs(a.median - b.median) / min(a.median, b.median), abs(a.median - b.median) / math.hypot(a.se, b.se))
                 for i, a in enumerate(rr) for b in rr[i + 1:]]
        over = sum(p[0] > TOL for p in pairs) / len(pairs)
        zmed = statistics.median(p[1] for p in pairs)
        sl = "/".join(f"{slope(meds, [g.quantile(q) if q else min(g.times) for g in rr]):.2f}" for q in (10, 90, 0))
        print(f"{k[0]:>3} {k[1]:4s} {k[2]}  {len(rr):2d} {m:9.2f}  {pct(statistics.stdev(meds), m):8.2f}%  "
              f"{pct(math.sqrt(statistics.fmean(s * s for s in ses)), m):7.2f}%  {pct(t, m):5.2f}%  {pct(t_ds, m):5.2f}%  "
              f"{pct(max(meds) - min(meds), m):5.2f}%  "
              f"{100 * over:4.0f}%  {zmed:6.1f}   {sl:16s}  {' '.join(f'{x:.2f}' for x in sorted(meds))}")
    return taus


def section_abba(gs: list[Grading]) -> None:
    print("\n## abba: h200-checks-ab-2, each baseline graded A1 B1 ... B2 A2 on one warm pool (A: as shipped; B: no early stop, no profiled calls)")
    print("baseline     arm  median us  95% CI of the median      | A2-A1 (z)         B2-B1 (z)         mean B - mean A (z)")
    rows: dict[str, dict[str, Grading]] = {}
    for g in gs:
        if g.ds == "h200-checks-ab-2" and g.key:
            rows.setdefault(g.key.removeprefix("baseline/"), {})[g.arm] = g
    for key, arms in rows.items():
        if not all(a in arms for a in ("A1", "A2", "B1", "B2")):
            continue

        def z(a: Grading, b: Grading) -> str:
            return f"{pct(b.median - a.median, a.median):+6.2f}% ({(b.median - a.median) / math.hypot(a.se, b.se):+5.1f})"

        a_mean = (arms["A1"].median + arms["A2"].median) / 2
        b_mean = (arms["B1"].median + arms["B2"].median) / 2
        se_ab = 0.5 * math.sqrt(sum(arms[t].se ** 2 for t in ("A1", "A2", "B1", "B2")))
        for i, tag in enumerate(("A1", "B1", "B2", "A2")):
            g = arms[tag]
            lo, hi = boot_ci(g.times)
            tail = ""
            if i == 0:
                tail = f"| {z(arms['A1'], arms['A2'])}  {z(arms['B1'], arms['B2'])}  {pct(b_mean - a_mean, a_mean):+6.2f}% ({(b_mean - a_mean) / se_ab:+5.1f})"
            print(f"{key:11s}  {tag}  {g.median:9.3f}  [{pct(lo - g.median, g.median):+5.2f}%, {pct(hi - g.median, g.median):+5.2f}%]"
                  f"  ({g.ts:%H:%M:%S})  {tail}")
    print("\nB against A with the between-grading level as the noise (issue #9's 'unchanged median'): per short kernel and ABBA run,")
    print("z = (mean B - mean A) / (tau_ds x sqrt(1/nA + 1/nB)); h200-checks-ab (A, B once each) and h200-checks-ab-2 (ABBA); 23 left out")
    zs = []
    for k, rr in by_kernel(gs).items():
        m = statistics.fmean(g.median for g in rr)
        if m > SHORT_US or k[0] == 23:
            continue
        t = tau_within(rr) / m
        for ds in ("h200-checks-ab", "h200-checks-ab-2"):
            arms = {g.arm: g.median for g in rr if g.ds == ds and g.arm}
            a = [arms[x] for x in ("A1", "A2") if x in arms]
            b = [arms[x] for x in ("B1", "B2") if x in arms]
            if a and b and t > 0:
                d = (statistics.fmean(b) - statistics.fmean(a)) / statistics.fmean(a)
                zs.append(d / (t * math.sqrt(1 / len(a) + 1 / len(b))))
                print(f"  {k[0]:>3} {k[1]:4s} {ds:17s} A {len(a)} B {len(b)}  B - A {100 * d:+6.2f}%  tau_ds {100 * t:.2f}%  z {zs[-1]:+5.2f}")
    zz = sum(zs) / math.sqrt(len(zs))
    print(f"  pooled (Stouffer) Z = {zz:+.2f} over {len(zs)} comparisons ({sum(z > 0 for z in zs)} with B slower); "
          f"two-sided p = {math.erfc(abs(zz) / math.sqrt(2)):.3f}")


def _resid(g: Grading) -> list[float]:
    return [t / g.median - 1.0 for t in g.times]


def _mean_pair_corr(rows: list[list[float | None]]) -> float:
    import numpy as np

    cs = []
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            a = np.array([x if x is not None else np.nan for x in rows[i]])
            b = np.array([x if x is not None else np.nan for x in rows[j]])
            m = ~np.isnan(a) & ~np.isnan(b)
            if m.sum() > 10:
                cs.append(np.corrcoef(a[m], b[m])[0, 1])
    return float(np.mean(cs))


def section_sets(gs: list[Grading]) -> None:
    import numpy as np

    print("\n## sets: per-call time (relative to the grading's median) against the input set it ran on")
    print("Call i of a grading runs on pre-made set i (set index = warm-ups + timed index; the sets are made in that order).")
    print("corr = mean over pairs of gradings of the correlation of their per-call residuals aligned by set index / by timed")
    print("index; null = the same with each grading's residuals rotated at random (40 draws).")
    print("kernel            n   corr(set)  corr(k)   null (sd)        lag-1 autocorr  last20 vs first20")
    rng = random.Random(SEED)
    for k, rr in by_kernel(gs).items():
        if statistics.fmean(g.median for g in rr) > SHORT_US:
            continue
        width = max(g.n_warm + len(g.times) for g in rr)

        def aligned(by_set: bool, rot: bool = False) -> list[list[float | None]]:
            out = []
            for g in rr:
                e = _resid(g)
                if rot:
                    s = rng.randrange(len(e))
                    e = e[s:] + e[:s]
                off = g.n_warm if by_set else 0
                row: list[float | None] = [None] * width
                row[off:off + len(e)] = e
                out.append(row)
            return out

        null = [_mean_pair_corr(aligned(False, rot=True)) for _ in range(40)]
        lag = statistics.fmean(float(np.corrcoef(_resid(g)[:-1], _resid(g)[1:])[0, 1]) for g in rr)
        trend = statistics.fmean(pct(statistics.median(g.times[-20:]) - statistics.median(g.times[:20]), g.median) for g in rr)
        print(f"{k[0]:>3} {k[1]:4s} {k[2]}  {len(rr):2d}   {_mean_pair_corr(aligned(True)):+.3f}    {_mean_pair_corr(aligned(False)):+.3f}   "
              f"{statistics.fmean(null):+.3f} ({statistics.stdev(null):.3f})    {lag:+.3f}          {trend:+.2f}%")


def section_covariates(gs: list[Grading]) -> None:
    print("\n## covariates: a grading's level (its median against its kernel's mean in the same dataset, %) against what the")
    print(f"event records; short kernels (median < {SHORT_US:.0f} us), kernels with >= {MIN_GRADINGS} gradings, datasets with >= 2 of them")
    print("(Spearman rank correlation, pooled; dt_prev: seconds since the dataset's previous timing event; order: rank in the dataset;")
    print("queue: graded by the queue pass; cupti: the same process's profiled-call kernel time against its kernel's mean)")
    by_ds: dict[str, list[Grading]] = {}
    for g in gs:
        by_ds.setdefault(g.ds, []).append(g)
    prev: dict[str, float] = {}
    order: dict[str, float] = {}
    for ds, rr in by_ds.items():
        rr.sort(key=lambda g: g.ts)
        for i, g in enumerate(rr):
            prev[g.eid] = (g.ts - rr[i - 1].ts).total_seconds() if i else math.nan
            order[g.eid] = i / len(rr)
    level: dict[str, float] = {}
    klevel: dict[str, float] = {}
    for k, rr in by_kernel(gs).items():
        if statistics.fmean(g.median for g in rr) > SHORT_US:
            continue
        for ds in {g.ds for g in rr}:
            sub = [g for g in rr if g.ds == ds]
            if len(sub) < 2:
                continue
            m = statistics.fmean(g.median for g in sub)
            cs = [g.cupti_us() for g in sub]
            cm = statistics.fmean(c for c in cs if c is not None) if any(c is not None for c in cs) else None
            for g, c in zip(sub, cs):
                level[g.eid] = pct(g.median - m, m)
                if c is not None and cm:
                    klevel[g.eid] = pct(c - cm, cm)
    rr = [g for g in gs if g.eid in level]
    cov = {
        "sm_clock_before": lambda g: g.clock("before", "sm_clock_mhz"), "sm_clock_after": lambda g: g.clock("after", "sm_clock_mhz"),
        "temp_before": lambda g: g.clock("before", "temperature_c"), "temp_after": lambda g: g.clock("after", "temperature_c"),
        "power_before": lambda g: g.clock("before", "power_w"), "power_after": lambda g: g.clock("after", "power_w"),
        "hold_us": lambda g: g.details.get("hold_us"), "host_us_median": lambda g: g.details.get("host_us_median"),
        "tail_us_median": lambda g: g.details.get("tail_us_median"), "floor_tail_us": lambda g: g.details.get("floor_tail_us_median"),
        "n_warmup": lambda g: g.n_warm, "input_sets_alive": lambda g: g.details.get("input_sets_alive"),
        "dt_prev_s": lambda g: prev.get(g.eid), "order": lambda g: order.get(g.eid),
        "queue": lambda g: float("queue" in (g.arm or "")), "arm_B": lambda g: float((g.arm or "").startswith("B")),
        "cupti_kernel": lambda g: klevel.get(g.eid),
        # the worker timed the eager itself (the problem's first grading in a session) rather than reading the cache
        "eager_timed_here": lambda g: None if "eager_cached" not in g.details else float(not g.details["eager_cached"]),
    }
    print(f"{len(rr)} gradings")
    for name, f in cov.items():
        pts = [(float(f(g)), level[g.eid]) for g in rr if f(g) is not None and not (isinstance(f(g), float) and math.isnan(f(g)))]
        rho, p = spearman([a for a, _ in pts], [b for _, b in pts])
        print(f"  {name:18s} n={len(pts):3d}  rho={rho:+.2f}  p={p:.3f}")
    print("consecutive gradings of different kernels (same dataset): Spearman of level[i] vs level[i+1]")
    pairs = []
    for ds, sub in by_ds.items():
        sub = [g for g in sub if g.eid in level]
        pairs += [(level[a.eid], level[b.eid]) for a, b in zip(sub, sub[1:])]
    rho, p = spearman([a for a, _ in pairs], [b for _, b in pairs])
    print(f"  n={len(pairs)}  rho={rho:+.2f}  p={p:.3f}")


def section_cupti(gs: list[Grading]) -> None:
    import numpy as np

    print("\n## cupti: where the level lives. Gradings with >= 3 profiled calls (config A), as deviations from their dataset's mean")
    print("(one GPU session; datasets with >= 2 such gradings): the window's median against the mean CUPTI duration of the call's")
    print("kernels in the same process (the profiled calls: flush, no hold, untimed). sd(kernel) no larger than its sampling se:")
    print("the kernel itself did not move; sd(window - kernel) near sd(window): the level is outside the kernel")
    print("kernel            n   sd(window)  sd(kernel)  sampling se(kernel)  sd(window - kernel)  corr")
    for k, rr in by_kernel(gs).items():
        rr = [g for g in rr if len(g.profiled) >= 3]
        if not rr or statistics.fmean(g.median for g in rr) > SHORT_US:
            continue
        w: list[float] = []
        c: list[float] = []
        used: list[Grading] = []
        for ds in sorted({g.ds for g in rr}):
            sub = [g for g in rr if g.ds == ds]
            if len(sub) < 2:
                continue
            mw = statistics.fmean(g.median for g in sub)
            mc = statistics.fmean(g.cupti_us() for g in sub)
            w += [g.median - mw for g in sub]
            c += [g.cupti_us() - mc for g in sub]
            used += sub
        if len(w) < MIN_GRADINGS:
            continue
        se_c = statistics.fmean(statistics.stdev([p["dsl_device_us"] for p in g.profiled]) / math.sqrt(len(g.profiled)) for g in used)
        gap = [a - b for a, b in zip(w, c)]
        print(f"{k[0]:>3} {k[1]:4s} {k[2]}  {len(w):2d}   {statistics.stdev(w):7.3f} us  {statistics.stdev(c):7.3f} us   {se_c:7.3f} us"
              f"           {statistics.stdev(gap):7.3f} us         {float(np.corrcoef(w, c)[0, 1]):+.2f}")
    print("mean window - kernel (us), all gradings above: the window's fixed part beside the kernel (launch, events)")
    for k, rr in by_kernel(gs).items():
        rr = [g for g in rr if len(g.profiled) >= 3]
        if len(rr) >= MIN_GRADINGS and statistics.fmean(g.median for g in rr) <= SHORT_US:
            print(f"  {k[0]:>3} {k[1]:4s} {k[2]}  {statistics.fmean(g.median - g.cupti_us() for g in rr):6.2f} us of "
                  f"{statistics.fmean(g.median for g in rr):7.2f} us")


def section_policies(events: Path, hold_gs: list[Grading]) -> None:
    print("\n## policies: the same kernel files under the windows before the SM hold, against the SM-hold gradings")
    earlier = load(events, EARLIER_DATASETS, policy=None)
    hold = by_kernel(hold_gs)
    print("kernel            window                                              n   medians (sorted)                       sd_between  se_within")
    for k, rr in by_kernel(earlier, min_n=1).items():
        if k not in hold or statistics.fmean(g.median for g in rr) > SHORT_US:
            continue
        for pol in sorted({g.policy or "(no policy column: v2, logs/README.md)" for g in rr}):
            sub = [g for g in rr if (g.policy or "(no policy column: v2, logs/README.md)") == pol]
            meds = sorted(g.median for g in sub)
            m = statistics.fmean(meds)
            sd = f"{pct(statistics.stdev(meds), m):6.2f}%" if len(meds) > 2 else "      -"
            shown = " ".join(f"{x:.2f}" for x in meds[:12]) + (" ..." if len(meds) > 12 else "")
            print(f"{k[0]:>3} {k[1]:4s} {k[2]}  {pol[:50]:50s}  {len(sub):2d}  {shown:38s}  {sd}     "
                  f"{pct(math.sqrt(statistics.fmean(g.se ** 2 for g in sub)), m):5.2f}%")
        meds = sorted(g.median for g in hold[k])
        m = statistics.fmean(meds)
        print(f"{'':18s}{'(sm-hold v3, this study)':50s}  {len(meds):2d}  {' '.join(f'{x:.2f}' for x in meds[:12]) + (' ...' if len(meds) > 12 else ''):38s}  "
              f"{pct(statistics.stdev(meds), m):6.2f}%     {pct(math.sqrt(statistics.fmean(g.se ** 2 for g in hold[k])), m):5.2f}%")
    log = events / "h200-baselines-2-1" / "logs" / "timing_repro_v2.log"
    print(f"\nin one process (benchmarks/timing_repro.py, v2 window, fresh pre-made sets per 'grading'; {log.relative_to(events.parent)}):")
    for line in log.read_text().splitlines():
        if " meds [" in line and " policy " in line:
            print("  " + line.split(" ", 1)[1].split(" clocks")[0])


def section_eager(gs: list[Grading]) -> None:
    print("\n## eager: the eager baseline's median where a grading measured it (not from the session cache), per problem")
    print("problem  n   sd        range     host dispatch median (us)   medians (us)")
    out: dict[int, list[Grading]] = {}
    for g in gs:
        if g.details.get("eager_cached") is False:
            out.setdefault(g.problem, []).append(g)
    for p, rr in sorted(out.items()):
        if len(rr) < 3:
            continue
        e = [float(g.eager_us) for g in rr]
        m = statistics.fmean(e)
        host = [g.details.get("eager_host_us_median") for g in rr]
        print(f"  {p:>3}   {len(rr)}  {pct(statistics.stdev(e), m):5.2f}%  {pct(max(e) - min(e), m):6.2f}%   "
              f"{min(h for h in host if h):7.0f}-{max(h for h in host if h):<7.0f}            {' '.join(f'{x:.1f}' for x in e)}")


def section_implications(taus: dict[tuple, float]) -> None:
    print("\n## implications: under the measured tau_ds (between-grading sd of the median within one GPU session)")
    print("kernel            tau_ds  P(|A1-A2| > 0.5%)  gradings per arm to see a 0.5% change (80% power, 5%)   R@t band (2 gradings disagree > 5%)")
    for k, t in taus.items():
        if t != t:
            continue
        n_arm = math.ceil(2 * (1.96 + 0.8416) ** 2 * (t / TOL) ** 2) if t > 0 else 1
        # two gradings of one kernel at speedup s = thr * exp(d) disagree on R@thr with probability 2 Phi(-|d|/tau) (1 - Phi(-|d|/tau))
        # (each grading's log-median ~ N(log s, tau^2), eager fixed within a session); > 5% while |d| < d5
        d5 = _band(t)
        print(f"{k[0]:>3} {k[1]:4s} {k[2]}  {100 * t:5.2f}%      {100 * p_exceed(t):5.1f}%            {n_arm:6d}"
              f"                                          speedups within +-{100 * d5:.1f}% of a threshold")


def _band(t: float) -> float:
    """The |log(speedup / threshold)| below which two gradings disagree on R@threshold with probability > 5%."""
    if t <= 0:
        return 0.0
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    lo, hi = 0.0, 10 * t
    for _ in range(60):
        mid = (lo + hi) / 2
        p = phi(-mid / t)
        if 2 * p * (1 - p) > 0.05:
            lo = mid
        else:
            hi = mid
    return lo


def section_repeat(events: Path) -> None:
    """Every committed shipped-config grading of today's baseline files, by timing policy: how far the gradings of one
    kernel lie apart (the repeat the grader promises, DESIGN: 0.5% for calls that only work on the device)."""
    import polars as pl

    from mkb.problems import baselines
    from mkb.problems._speed import _read, default_stores, kernel_sha256, shipped_only

    shas = {kernel_sha256(b.path): (b.problem, b.dsl) for b in baselines()}
    stores = [s for s in default_stores(events) if (Path(s) / "kind=timing").is_dir() and (Path(s) / "kind=verdict").is_dir()]
    t = _read("timing", stores, ["ok", "kernel_sha256", "evaluation_id", "timing_policy", "median_us"])
    v = _read("verdict", stores, ["evaluation_id", "details"])
    if t is None or v is None:
        print(f"\n## repeat: no h200-* dataset with timing and verdict events under {events}")
        return
    t = t.filter(pl.col("ok") & pl.col("kernel_sha256").is_in(list(shas))).join(
        shipped_only(v).select("evaluation_id", "dataset"), on=["evaluation_id", "dataset"])
    rows = [(shas[sha], pol, us) for sha, pol, us in t.select("kernel_sha256", "timing_policy", "median_us").iter_rows()]
    print("\n## repeat: every shipped-config grading of today's baseline files, per timing policy (committed h200-* datasets)")
    print("policy  kernel     n   median us   sd       range            within 0.5% of the median")
    by: dict[tuple, list[float]] = {}
    for (p, dsl), pol, us in rows:
        if us is not None and pol:
            by.setdefault((pol.rsplit("/", 1)[-1], p, dsl), []).append(float(us))
    for (pol, p, dsl), xs in sorted(by.items()):
        if len(xs) < 2:
            continue
        xs.sort()
        med = statistics.median(xs)
        near = sum(abs(x / med - 1) <= TOL for x in xs)
        print(f"{pol:6s}  {p:>3} {dsl:4s}  {len(xs):3d}  {med:10.2f}  {pct(statistics.stdev(xs), statistics.fmean(xs)):5.2f}%  "
              f"{xs[0]:.2f}-{xs[-1]:.2f}   {near}/{len(xs)}")


SECTIONS = ("levels", "abba", "sets", "covariates", "cupti", "policies", "eager", "implications", "repeat")


def datasets_main(events: Path, sections: list[str]) -> None:
    if sections == ["repeat"]:  # reads every dataset itself: no need for the v3 study's gradings
        section_repeat(events)
        return
    gs = load(events, HOLD_DATASETS, policy=HOLD_POLICY)
    print(f"{len(gs)} passed timing events under {HOLD_POLICY} in {', '.join(HOLD_DATASETS)}; "
          f"bootstrap: {BOOT} resamples, seed {SEED}")
    taus: dict[tuple, float] | None = None
    for s in sections:
        if s == "levels":
            taus = section_levels(gs)
        elif s == "abba":
            section_abba(gs)
        elif s == "sets":
            section_sets(gs)
        elif s == "covariates":
            section_covariates(gs)
        elif s == "cupti":
            section_cupti(gs)
        elif s == "policies":
            section_policies(events, gs)
        elif s == "eager":
            section_eager(gs)
        elif s == "implications":
            section_implications(taus if taus is not None else section_levels(gs))
        elif s == "repeat":
            section_repeat(events)


# ----------------------------------------------------------------------------------------------------------------
# the GPU experiment: is the per-grading level the SM hold's?
# ----------------------------------------------------------------------------------------------------------------

KERNELS = ("28/cute", "28/eager", "25/cute", "1/cute")
HOLDS = ("hold", "quiet", "sleep", "none")
# Since grader 2.4 `hold` is the grader's own (v4: the quiet spin), so `quiet` is the same kernel launched by this script;
# the v3 jiterator hold these arms were first compared with is recorded in `events/h200-timing-levels`.
DEFAULT_HOLDS = ("hold",)
# Where the call's memory lands (the second experiment, issues #9/#10: under v4 a short kernel still has a level per
# process): `fixed` as graded (every call of a process gets the same output block from the caching allocator), `pad`
# (a fresh random pad allocated before the grading's input sets and held through it: every rep lands elsewhere),
# `jitter` (a fresh random pad before every call, freed after it: the call's own allocations move from call to call).
# `recycle` (the third experiment, after `h200-eager-level`: a worker that timed the eager first is 1-4% faster): the
# grading's input sets are made once, dropped to the caching allocator (no empty_cache), and made again, so the timed
# sets lie in recycled blocks, as a candidate's do after the eager's sets were freed in its worker.
# `eager` (with `recycle`, it tells allocation history from prior GPU work): the problem's eager is timed first on its own
# fresh sets through the same windows, its sets dropped to the caching allocator, then the kernel's sets are made: the
# state of a grading worker that timed the eager (arm B of `h200-eager-level`), in a bare process.
# `reserve` / `touch` (after v5 cost the grader a second `make` per set): the first pass allocates the sets' tensors with
# `empty_like` (no values; `touch` also zero-fills them on the GPU) and drops them, so the sets are made once, into blocks
# that were allocated (and, for `touch`, written) before: which property of the recycled blocks sets the level.
PLACEMENTS = ("fixed", "pad", "jitter", "recycle", "eager", "reserve", "touch")
# the placements that are the grader's own first passes (mkb.measure.InputStream): recycle = timing policy v5's, reserve =
# v6's. (h200-recycle-levels and h200-reserve-levels ran them as this script's own copies: sets of other seeds made and
# dropped; as many blanks as fit a quarter of free memory. InputStream makes or allocates the stream's own capacity.)
# Every grading records its `first_pass` (None: this script's own placement), so a run says which definition it used.
FIRST_PASS = {"recycle": "make", "reserve": "allocate"}
PAD_STEP = 1 << 21  # 2 MiB: the caching allocator's large-block granularity
HOLD_US = 300.0  # the grader sets 150-500 us for these kernels (twice the warm-ups' longest dispatch): one value for all
_QUIET_SRC = r"""
extern "C" __global__ void mkb_quiet_hold(int cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < (long long)cycles) { }
}
"""


def _child(a: argparse.Namespace) -> None:
    """One fresh process: every kernel x hold x rep, each a 'grading' of `a.n` timed calls on fresh pre-made sets."""
    import gc

    import torch

    from mkb.dsl import get_backend
    from mkb.measure import InputStream, L2Flusher, SmClock, gpu_state, sm_hold, stream_window, tensor_bytes
    from mkb.problems import baselines, find_problem, load_problem

    dev = torch.device("cuda")
    t_start = time.monotonic()
    fns, makes, eagers = {}, {}, {}
    for spec in a.kernels:
        p, name = spec.split("/")
        mod = load_problem(find_problem(int(p)))
        eagers[spec] = getattr(mod, "eager", None) or mod.reference
        makes[spec] = make = (lambda s, mod=mod: tuple(mod.make_inputs(s, device=dev, size="full")))
        if name == "eager":
            fns[spec] = getattr(mod, "eager", None) or mod.reference
        else:
            b = next(b for b in baselines([int(p)]) if b.dsl == name)
            backend = get_backend(name)
            os.environ.update(backend.environment(a.arch))
            fns[spec] = backend.load(b.path).solve
        x = make(1)
        fns[spec](*x)  # compile outside every timing
        if "eager" in a.placements:
            eagers[spec](*x)
        torch.cuda.synchronize()
        del x
    mhz = SmClock(dev).max_mhz or 1980.0
    grader_hold = sm_hold(dev)  # the grader's own hold (v4 since grader 2.4)
    grader_hold.set_us(a.hold_us[0])
    sleep_us = [a.hold_us[0]]  # the length every hold runs for in the arm being timed (set per arm below)
    holds: dict[str, object] = {"hold": grader_hold, "sleep": lambda: torch.cuda._sleep(int(sleep_us[0] * mhz)), "none": None}
    quiet_error = None
    try:
        props = torch.cuda.get_device_properties(dev)
        per_sm = int(getattr(props, "max_threads_per_multi_processor", 2048))
        block = 1024 if per_sm % 1024 == 0 else per_sm
        grid = int(props.multi_processor_count) * (per_sm // block)
        qfn = torch.cuda._compile_kernel(_QUIET_SRC, "mkb_quiet_hold")
        cycles = int(a.hold_us[0] * mhz)
        holds["quiet"] = lambda: qfn(grid=(grid, 1, 1), block=(block, 1, 1), args=[cycles])
        holds["quiet"]()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the other holds still answer most of the question
        quiet_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        holds.pop("quiet", None)
        print(f"[proc {a.child}] quiet hold unavailable: {quiet_error}", flush=True)
    flusher = L2Flusher(dev)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)  # clocks up, as the grader's clock warm-up does
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        w = (w @ w).clamp_(-1, 1)
    torch.cuda.synchronize()
    del w
    state = {"process": a.child, "pid": os.getpid(), "sm_max_mhz": mhz,
             "grader_hold": {"grid": grader_hold.grid, "block": grader_hold.block, "cycles": grader_hold.cycles},
             "quiet_error": quiet_error, "gpu_after": None, "wall_s": None, "gradings": []}
    order = [h for h in a.holds if h in holds]
    order = order[a.child % len(order):] + order[:a.child % len(order)]  # each process starts on another hold
    gradings = state["gradings"]
    seed = 10_000_000 * (a.child + 1)
    rng = random.Random(seed)
    arms = [(h, pl, us) for h in order for pl in a.placements for us in a.hold_us]
    for spec in a.kernels:
        for h, placement, hold_us in arms:
            grader_hold.set_us(hold_us)
            sleep_us[0] = hold_us
            for rep in range(a.reps):
                seed += 1000
                pad = torch.empty(rng.randrange(1, 257) * PAD_STEP, dtype=torch.uint8, device=dev) if placement == "pad" else None
                # touch: as many blank sets as fit a quarter of free memory, zero-filled and dropped, then fresh sets (the
                # h200-reserve-levels definition, which its `reserve` then shared; InputStream has no written form, so
                # touch against today's reserve differs in the count of blocks as well as in the writing)
                if placement == "touch":
                    shape = makes[spec](seed + 900)
                    n_sets = min(a.warm + a.n, max(1, (torch.cuda.mem_get_info(dev)[0] // 4) // max(1, tensor_bytes(shape))))
                    blanks = [tuple(torch.empty_like(t) if isinstance(t, torch.Tensor) else t for t in shape) for _ in range(n_sets)]
                    for b in blanks:
                        for t in b:
                            if isinstance(t, torch.Tensor):
                                t.zero_()
                    torch.cuda.synchronize()
                    del shape, blanks  # back to the caching allocator
                    gc.collect()
                if placement == "eager":
                    e_sets = InputStream(makes[spec], n_calls=a.warm + a.n, base_seed=seed + 700,
                                         max_bytes=torch.cuda.mem_get_info(dev)[0] // 4, first_pass=None)
                    for i in range(a.warm + a.n):
                        e_args = e_sets(i)
                        e_out, _, _ = stream_window(lambda: eagers[spec](*e_args), flush=flusher.flush, device=dev, hold=holds[h])
                        del e_out, e_args
                    torch.cuda.synchronize()
                    del e_sets  # as the grader drops the eager's stream before the candidate's is made
                    gc.collect()
                stream = InputStream(makes[spec], n_calls=a.warm + a.n, base_seed=seed, max_bytes=torch.cuda.mem_get_info(dev)[0] // 4,
                                     first_pass=FIRST_PASS.get(placement))  # recycle / reserve: the grader's own first passes
                out_addrs: set[int] = set()
                times, tails = [], []
                for i in range(a.warm + a.n):
                    args = stream(i)
                    jit_pad = (torch.empty(rng.randrange(1, 65) * PAD_STEP + rng.randrange(0, PAD_STEP, 512), dtype=torch.uint8,
                                           device=dev) if placement == "jitter" else None)
                    out, us, tail = stream_window(lambda: fns[spec](*args), flush=flusher.flush, device=dev, hold=holds[h])
                    first = out if isinstance(out, torch.Tensor) else next((t for t in (out or ()) if isinstance(t, torch.Tensor)), None)
                    if first is not None:
                        out_addrs.add(first.data_ptr())
                    del out, first, jit_pad
                    if i >= a.warm:
                        times.append(round(us, 3))
                        tails.append(round(tail, 3))
                sets = stream.capacity
                del stream, args, pad
                gc.collect()
                torch.cuda.empty_cache()
                g = {"kernel": spec, "hold": h, "placement": placement, "first_pass": FIRST_PASS.get(placement),
                     "hold_us": hold_us, "rep": rep, "median_us": statistics.median(times),
                     "times_us": times, "tail_us_median": statistics.median(tails), "input_sets": sets,
                     "out_addrs": len(out_addrs)}
                gradings.append(g)
                state["wall_s"] = time.monotonic() - t_start
                Path(a.child_out).write_text(json.dumps(state))  # after every grading: a process cut short keeps what it made
                print(f"[proc {a.child}] {spec:9s} {h:5s} {placement:6s} {hold_us:5.0f} us rep {rep}  median {g['median_us']:9.3f} us "
                      f"({len(out_addrs)} output addresses)", flush=True)
    state["gpu_after"] = gpu_state(dev).as_dict()
    state["wall_s"] = time.monotonic() - t_start
    Path(a.child_out).write_text(json.dumps(state))


def gpu_main(a: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("error: --gpu needs a CUDA device and this process sees none\nhint: run it on the GPU host (docs/timing-repeatability.md "
              "gives the command); the datasets mode runs here", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    procs, errors = [], []
    for i in range(a.processes):
        if time.monotonic() - t0 > a.budget_s:
            errors.append(f"process {i} not started: --budget-s {a.budget_s:.0f} spent")
            break
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--gpu", "--child", str(i), "--child-out", path,
               "--kernels", *a.kernels, "--holds", *a.holds, "--placements", *a.placements, "--reps", str(a.reps), "--n", str(a.n), "--warm", str(a.warm),
               "--hold-us", *map(str, a.hold_us), "--arch", a.arch]
        try:
            rc = subprocess.run(cmd, timeout=a.child_timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {a.child_timeout_s:.0f} s"
        text = Path(path).read_text() if Path(path).stat().st_size else ""
        if text:
            procs.append(json.loads(text))  # a process cut short still brings the gradings it finished
        if rc != 0:
            errors.append(f"process {i} exited {rc}" + ("" if text else " before its first grading"))
        Path(path).unlink(missing_ok=True)
    res = {"args": {k: v for k, v in vars(a).items() if k not in ("out",)}, "processes": procs, "errors": errors,
           "elapsed_s": time.monotonic() - t0}
    (out / "levels.json").write_text(json.dumps(res))
    summarise(res)
    return 0 if procs else 1


def summarise(res: dict) -> None:
    """The experiment's table: per kernel and hold, the spread between gradings and where it sits (process or rep)."""
    print(f"\n# timing levels: {len(res['processes'])} fresh processes, {res['elapsed_s']:.0f} s; errors: {res['errors'] or 'none'}")
    for p in res["processes"]:
        hold = p.get("grader_hold") or {"jiterator": p.get("jiterator_hold")}  # a levels.json from before grader 2.4
        print(f"  process {p['process']}: hold {hold}, quiet hold "
              f"{'ok' if not p['quiet_error'] else p['quiet_error']}, {p['wall_s']:.0f} s")
    lengths = res["args"].get("hold_us")
    several_lengths = isinstance(lengths, list) and len(lengths) > 1  # a levels.json from before --hold-us took a list
    rows: dict[tuple[str, str], list[dict]] = {}
    for p in res["processes"]:
        for g in p["gradings"]:
            g = dict(g, process=p["process"])
            arm = g["hold"] if g.get("placement", "fixed") == "fixed" else f"{g['hold']}+{g['placement']}"
            if several_lengths:
                arm += f"@{g['hold_us']:.0f}"
            rows.setdefault((g["kernel"], arm), []).append(g)
    print("\nkernel     hold    n   mean us    sd(all)  tau     sd(process means)  sd(reps in a process)  se_within  min..max us")
    def arm_order(arm: str) -> tuple[int, int, float]:
        arm, _, us = arm.partition("@")
        h, _, pl = arm.partition("+")
        return (HOLDS.index(h) if h in HOLDS else 9, PLACEMENTS.index(pl or "fixed") if (pl or "fixed") in PLACEMENTS else 9,
                float(us or 0))

    for (k, h), gs in sorted(rows.items(), key=lambda kv: (kv[0][0], arm_order(kv[0][1]))):
        s = spread(gs)
        print(f"{k:10s} {h:12s}  {s.n:2d}  {s.mean_us:9.3f}  {s.sd_pct:6.2f}%  {s.tau_pct:5.2f}%   {s.sd_process_pct:6.2f}%            "
              f"{s.sd_reps_pct:6.2f}%                {s.se_within_pct:5.2f}%   {s.min_us:.2f}..{s.max_us:.2f}")
    # the in-process ratio: does the eager baseline timed in the same process carry the same level?
    for h in HOLDS:
        cand = {(g["process"], g["rep"]): g["median_us"] for g in rows.get(("28/cute", h), [])}
        eag = {(g["process"], g["rep"]): g["median_us"] for g in rows.get(("28/eager", h), [])}
        both = sorted(set(cand) & set(eag))
        if len(both) > 2:
            r = [eag[k] / cand[k] for k in both]
            c = [cand[k] for k in both]
            print(f"28 speedup eager/cute in the same process and rep, hold {h:5s}: sd {pct(statistics.stdev(r), statistics.fmean(r)):5.2f}% "
                  f"(the cute median alone: {pct(statistics.stdev(c), statistics.fmean(c)):5.2f}%)")
    print("\nReading (docs/timing-repeatability.md): tau under `hold` near the grader's (0.4-2%) and near 0 under `quiet`, `sleep`"
          "\nand `none`: the hold's memory traffic makes the level; near 0 under `sleep`/`none` only: a full-GPU spin before the"
          "\nwindow does; large under all four: the level is the process's, not the window's (time in several processes).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", default=str(REPO / "events"), help="the committed datasets (datasets mode)")
    ap.add_argument("--section", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    ap.add_argument("--gpu", action="store_true", help="run the GPU experiment (see the module docstring)")
    ap.add_argument("--summary", default=None, help="print the GPU experiment's table again from its levels.json")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-timing-levels"))
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=135.0, help="start no new process after this many seconds")
    ap.add_argument("--child-timeout-s", type=float, default=60.0, help="a process is stopped after this (expected ~30 s)")
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), help="PROBLEM/DSL or PROBLEM/eager")
    ap.add_argument("--holds", nargs="+", default=list(DEFAULT_HOLDS), choices=HOLDS)
    ap.add_argument("--placements", nargs="+", default=list(PLACEMENTS), choices=PLACEMENTS)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--hold-us", type=float, nargs="+", default=[HOLD_US],
                    help="hold lengths (the grader sets 150-2000 us per grading from the warm-ups' dispatch): one arm each")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.summary:
        summarise(json.loads(Path(a.summary).read_text()))
    elif a.gpu and a.child is not None:
        _child(a)
    elif a.gpu:
        return gpu_main(a)
    else:
        events = Path(a.events)
        missing = [ds for ds in HOLD_DATASETS if not (events / ds / "kind=timing").is_dir()]
        if missing:
            print(f"error: no timing events for {', '.join(missing)} under {events}\nhint: --events points at the repository's "
                  f"events/ folder", file=sys.stderr)
            return 2
        datasets_main(events, a.section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
