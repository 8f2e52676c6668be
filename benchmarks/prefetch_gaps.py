"""Reads, from committed grader-bench datasets, which gradings had their trusted plan made ahead (the prefetch) and
what the others paid for it inside their own wall time, per problem.

Why: the throughput target is missed on the slower H200 hosts by ~10%, and a plan not made ahead costs its grading
`worker.trusted.draws_and_recheck_sets` (problem 1: ~2.2 s). A queue prefetches a problem's plan only once a grading
of it has reported its footprint, and only when that footprint is at most PREFETCH_FREE_FRACTION of the free memory;
this prints how many gradings each rule left without a plan and the seconds they spent making it.

    .venv/bin/python benchmarks/prefetch_gaps.py [events/h200-grader-bench-2-18-pause-*]
"""

from __future__ import annotations

import glob
import json
import statistics
import sys

from mkb.events import read
from mkb.grader._prefetch import PREFETCH_FREE_FRACTION, prefetch_fits


def _d(x):
    return json.loads(x) if isinstance(x, str) else (x or {})


def main(argv: list[str]) -> int:
    datasets = sorted(argv or glob.glob("events/h200-grader-bench-2-18-pause-*"))
    cells: dict[tuple[int, str], list[float]] = {}
    fits: dict[int, bool] = {}
    n_all, wall_all = 0, 0.0
    for ds in datasets:
        for r in read("verdict", ds).iter_rows(named=True):
            d = _d(r["details"])
            state = (d.get("prefetch") or {}).get("state") or "none"
            draws = (d.get("phases_s") or {}).get("worker.trusted.draws_and_recheck_sets", 0.0)
            cells.setdefault((r["problem"], state), []).append(draws)
            n_all, wall_all = n_all + 1, wall_all + (d.get("wall_s") or 0.0)
            e = d.get("expectations") or {}
            if e.get("expectations_kept_bytes") is not None:  # the footprint the queue would have gated on (inputs not counted)
                fits[r["problem"]] = prefetch_fits(plan_bytes=e["expectations_kept_bytes"],
                                                   working_bytes=e.get("expectation_working_bytes"),
                                                   free_bytes=e.get("device_free_bytes"))
    print(f"{n_all} gradings in {len(datasets)} datasets, mean wall {wall_all / max(1, n_all):.3f} s; "
          f"prefetch gate: plan + working <= {PREFETCH_FREE_FRACTION:.4f} of the free memory")
    spent = 0.0
    for (prob, state), xs in sorted(cells.items()):
        spent += sum(xs) if state == "none" else 0.0
        print(f"  problem {prob:3d} {state:8s}: {len(xs):3d} gradings, draws_and_recheck_sets median {statistics.median(xs):.3f} s, "
              f"sum {sum(xs):.1f} s; footprint fits the gate: {fits.get(prob)}")
    print(f"plans made inside the gradings: {spent:.1f} s in all, {spent / max(1, n_all):.3f} s per grading")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
