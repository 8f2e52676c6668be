"""Reads every committed H200 timing event and says how many passing gradings the side-work check would have failed
had it used one of its two floors (the empty calls before the loop, or after it) instead of the larger of both.

Why: the floor's 60 held empty calls are ~0.075 s of every grading (issue #10's overhead); dropping one half would
save about half of that, but the check takes `tail - max(floor before, floor after)` so that a floor read low on one
side does not turn an honest kernel's tail into `integrity_stream`. This prints what either single floor would have
done on the recorded gradings (the shipped 1 ms floor hold only).

    python3 benchmarks/side_work_floors.py [--events events]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq

    from mkb.grader._harness import SIDE_WORK_FRACTION, SIDE_WORK_MIN_US

    ap = argparse.ArgumentParser()
    ap.add_argument("--events", default="events", help="the folder of committed datasets")
    a = ap.parse_args(argv)
    n, fail = 0, {"before": [], "after": [], "both": []}
    files = sorted(glob.glob(f"{a.events}/h200-*/kind=timing/*.parquet"))
    if not files:
        raise SystemExit(f"--events {a.events}: no H200 timing events there; hint: pass the folder of committed "
                         "datasets (events/, holding h200-*/kind=timing)")
    for f in files:
        cols = ["ok", "median_us", "details", "problem", "dsl"]
        t = pq.read_table(f, columns=cols)
        for ok, med, d, prob, dsl in zip(*(t.column(c).to_pylist() for c in cols)):
            d = json.loads(d) if d else {}
            tail, before, after = d.get("tail_us_median"), d.get("floor_tail_us_median"), d.get("floor_tail_after_us_median")
            if not ok or None in (tail, before, after, med) or d.get("floor_hold_us") not in (None, 1000.0):
                continue
            n += 1
            thr = max(SIDE_WORK_MIN_US, SIDE_WORK_FRACTION * med)
            for side, floor in (("before", before), ("after", after), ("both", max(before, after))):
                if tail - floor > thr:
                    fail[side].append(f"{Path(f).parts[-3]} {prob}/{dsl} {tail - floor:.1f} us > {thr:.1f}")
    print(f"passing gradings with both floors recorded (1 ms hold): {n}")
    for side in ("before", "after", "both"):
        print(f"FIGURE side-work floor from {side:6s}: {len(fail[side])} of {n} would fail as integrity_stream")
        for line in fail[side][:5]:
            print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
