"""Coverage simulation: over many synthetic datasets with planted truth, how often each reported CI covers it.

Usage: python benchmarks/analysis_coverage.py [--datasets N] [--problems P] [--resamples B] [--seed S]
Each dataset is written as events through the project's writer (`write_synthetic`) and read back by
`mkb.analysis` exactly as `mkb-analyze` reads a store; the truth is computed from the simulation (closed
form or a large Monte Carlo over the same problems). Nominal coverage is the CI level (95%); a figure whose
coverage falls well below it has a CI that is too narrow or biased. Also prints the solo noise floor's
standing effect with nothing planted under a replicate shock (issue #14 defect 1: it must centre on zero).
The CI test `tests/analysis/test_coverage.py` runs a small version of `coverage()`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mkb.analysis import BootstrapSpec, contrast_table, lift_table, load_tables, standing_table  # noqa: E402
from mkb.analysis.synthetic import SynthSpec, true_contrast, true_rates, true_relative_lift, write_synthetic  # noqa: E402

FIGURES = ("rel_lift", "regression_rate", "improvement_rate", "tie_rate", "transfer - placebo")


def one_dataset(seed: int, *, problems: int, resamples: int, root: str, replicate_shock: float = 0.0) -> dict[str, list[bool]]:
    """Whether each transfer cell's CI covers the planted truth, per figure, for one simulated dataset."""
    spec = SynthSpec(seed=seed, models=("m",), model_means=(0.6,), n_problems=problems, replicates=3, noise=0.7,
                     effects={"transfer": 0.4, "placebo": 0.0, "same": 0.2, "wrong": 0.0}, harmed_share=0.25,
                     replicate_shock=replicate_shock, block_shock=0.2 if replicate_shock else 0.0)
    res = write_synthetic(spec, f"{root}/d{seed}")
    t = load_tables(res.store)
    bs = BootstrapSpec(seed=seed, resamples=resamples)
    lt = lift_table(t.pairs, spec=bs, tests=False).filter(pl.col("arm_kind") == "transfer")
    rel = true_relative_lift(res.simulation)
    rates = true_rates(res.simulation, n_mc=200)
    con = true_contrast(res.simulation)
    out: dict[str, list[bool]] = {f: [] for f in FIGURES}
    for r in lt.iter_rows(named=True):
        out["rel_lift"].append(r["rel_lo"] <= rel[(r["model"], r["source_dsl"], r["target_dsl"])] <= r["rel_hi"])
        truth = rates[(r["model"], r["target_dsl"])]
        for i, f in enumerate(("regression_rate", "improvement_rate", "tie_rate")):
            out[f].append(r[f"{f}_lo"] <= truth[i] <= r[f"{f}_hi"])
    ct = contrast_table(t.pairs, spec=bs, against=("placebo",), pooled=False)
    for r in ct.iter_rows(named=True):
        out["transfer - placebo"].append(r["rel_lo"] <= con[(r["model"], r["target_dsl"])] <= r["rel_hi"])
    return out


def coverage(datasets: int, *, problems: int = 74, resamples: int = 2000, seed: int = 0) -> dict[str, tuple[float, int]]:
    """{figure: (coverage, number of intervals)} over `datasets` simulated datasets."""
    hits: dict[str, list[bool]] = {f: [] for f in FIGURES}
    with tempfile.TemporaryDirectory() as root:
        for i in range(datasets):
            for f, v in one_dataset(seed + i, problems=problems, resamples=resamples, root=root).items():
                hits[f] += v
    return {f: (float(np.mean(v)), len(v)) for f, v in hits.items()}


def noise_floor_centre(datasets: int, *, problems: int = 74, seed: int = 1000) -> list[float]:
    """The solo noise floor's standing effect with nothing planted, a replicate shock and a block shock."""
    out = []
    with tempfile.TemporaryDirectory() as root:
        for i in range(datasets):
            spec = SynthSpec(seed=seed + i, models=("m",), model_means=(0.5,), n_problems=problems, replicates=3, noise=0.5,
                             replicate_shock=0.8, block_shock=0.3, effects={k: 0.0 for k in ("transfer", "placebo", "same", "wrong")})
            write_synthetic(spec, f"{root}/n{i}")
            st = standing_table(load_tables(f"{root}/n{i}").pairs, spec=BootstrapSpec(resamples=50))
            out += st.filter(pl.col("arm_kind") == "solo_noise")["effect"].to_list()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--problems", type=int, default=74)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    cov = coverage(args.datasets, problems=args.problems, resamples=args.resamples, seed=args.seed)
    print(f"coverage of 95% problem-clustered bootstrap CIs over {args.datasets} datasets x {args.problems} problems "
          f"(planted transfer lift, 25% harmed problems), {time.perf_counter() - t0:.0f} s:")
    for f, (c, n) in cov.items():
        se = (0.95 * 0.05 / max(n, 1)) ** 0.5
        print(f"  {f:20s} {100 * c:5.1f}%  ({n} intervals; nominal 95%, +-{200 * se:.1f} points at 2 SE)")
    eff = noise_floor_centre(max(4, args.datasets // 10), problems=args.problems)
    print(f"solo noise floor standing effect, nothing planted, replicate + block shock: mean {np.mean(eff):+.3f} "
          f"(SE {np.std(eff, ddof=1) / len(eff) ** 0.5:.3f}, {len(eff)} cells); the former construction gave about -0.45 here")


if __name__ == "__main__":
    main()
