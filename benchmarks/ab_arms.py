"""Reads two arms of committed grader-bench datasets and prints, per problem and DSL, what the arm moved: the
candidate's median (is it within 0.5%?), the `timing_inputs` and trusted-plan seconds, and the rate of each dataset.

Why: an A/B arm of the grader (a prefetch gate, a read guard) must show its throughput and also that the neighbours'
timing figures did not move; the rates alone, from ~60 s arms on a host that drifts, cannot show the second.

    .venv/bin/python benchmarks/ab_arms.py --a 'events/h200-grader-bench-2-19-prefetch-*-default' \\
        --b 'events/h200-grader-bench-2-19-prefetch-*-0.125'
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path

from mkb.events import read

TOL = 0.005


def _d(x):
    return json.loads(x) if isinstance(x, str) else (x or {})


def arm(pattern: str) -> tuple[list[str], dict[tuple[int, str], dict[str, list[float]]]]:
    datasets = sorted(glob.glob(pattern))
    if not datasets:
        raise SystemExit(f"no dataset matches {pattern!r}; hint: quote the glob, run from the checkout's root")
    cells: dict[tuple[int, str], dict[str, list[float]]] = {}
    for ds in datasets:
        bench = json.loads((Path(ds) / "logs" / "grader_bench.json").read_text())["throughput"]
        print(f"  {ds}: {bench.get('gradings')} gradings, {bench.get('gradings_per_gpu_hour'):.0f} per GPU-hour, "
              f"overhead median {bench.get('overhead_s_median'):.3f} s")
        for r in read("verdict", ds).iter_rows(named=True):
            if not r["passed"]:
                continue
            d = _d(r["details"])
            ph = d.get("phases_s") or {}
            c = cells.setdefault((r["problem"], r["dsl"]), {"median": [], "timing_inputs": [], "draws": []})
            c["median"].append(r["candidate_median_us"])
            c["timing_inputs"].append(ph.get("worker.run.timing_inputs", 0.0))
            c["draws"].append(ph.get("worker.trusted.draws_and_recheck_sets", 0.0))
    return datasets, cells


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="glob of arm A's dataset folders")
    ap.add_argument("--b", required=True, help="glob of arm B's dataset folders")
    a = ap.parse_args(argv)
    print(f"arm A: {a.a}")
    _, ca = arm(a.a)
    print(f"arm B: {a.b}")
    _, cb = arm(a.b)
    rels: list[float] = []
    print(f"{'problem/dsl':14s} {'n A':>4s} {'n B':>4s} {'median A us':>12s} {'median B us':>12s} {'B/A-1':>8s} "
          f"{'se':>6s} {'inputs A s':>10s} {'inputs B s':>10s} {'plan A s':>9s} {'plan B s':>9s}")
    for key in sorted(set(ca) & set(cb)):
        x, y = ca[key], cb[key]
        ma, mb = statistics.fmean(x["median"]), statistics.fmean(y["median"])
        rel = mb / ma - 1
        rels.append(rel)
        se = (statistics.variance(x["median"]) / len(x["median"]) + statistics.variance(y["median"]) / len(y["median"])) ** 0.5 / ma \
            if min(len(x["median"]), len(y["median"])) > 1 else float("nan")
        print(f"{key[0]:>3d}/{key[1]:10s} {len(x['median']):4d} {len(y['median']):4d} {ma:12.2f} {mb:12.2f} "
              f"{100 * rel:+7.2f}% {100 * se:5.2f}% {statistics.fmean(x['timing_inputs']):10.3f} {statistics.fmean(y['timing_inputs']):10.3f} "
              f"{statistics.fmean(x['draws']):9.3f} {statistics.fmean(y['draws']):9.3f}")
    if rels:
        within = sum(abs(r) <= TOL for r in rels)
        print(f"FIGURE {within} of {len(rels)} problem/DSL cells have B's mean median within {100 * TOL:.1f}% of A's; "
              f"mean of B/A-1 {100 * statistics.fmean(rels):+.2f}%, largest |B/A-1| {100 * max(map(abs, rels)):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
