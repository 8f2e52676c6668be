"""Reads every committed H200 timing event's clock warm-up record and says how often the SM clock already read
boosted (>= 95% of its maximum) before any work, by the device's idle time since its previous grading.

Why: grader 2.23 ends the warm-up after one round when the clock reads boosted before and after it, instead of
running at least 30 ms; this is the record that decision was read from (DESIGN, Throughput), kept as a command so the
figure can be printed again as datasets are added. `--before 2.23` reads only gradings of earlier graders (the data
the decision had).

    python3 benchmarks/clock_warm_readings.py [--events events] [--before 2.23]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json


def _version(v: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (v or "").split("."))
    except ValueError:
        return ()


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq

    ap = argparse.ArgumentParser()
    ap.add_argument("--events", default="events", help="the folder of committed datasets")
    ap.add_argument("--before", default=None, help="only gradings whose verdict names a grader older than this")
    a = ap.parse_args(argv)
    verdicts: dict[str, dict] = {}
    for f in glob.glob(f"{a.events}/h200-*/kind=verdict/*.parquet"):
        t = pq.read_table(f, columns=["evaluation_id", "details"])
        for e, d in zip(t.column("evaluation_id").to_pylist(), t.column("details").to_pylist()):
            verdicts[e] = json.loads(d) if d else {}
    buckets: collections.Counter = collections.Counter()
    n = boosted = 0
    files = sorted(glob.glob(f"{a.events}/h200-*/kind=timing/*.parquet"))
    if not files:
        raise SystemExit(f"--events {a.events}: no H200 timing events there; hint: pass the folder of committed "
                         "datasets (events/, holding h200-*/kind=timing)")
    for f in files:
        t = pq.read_table(f, columns=["evaluation_id", "details"])
        for e, d in zip(t.column("evaluation_id").to_pylist(), t.column("details").to_pylist()):
            cw = (json.loads(d) if d else {}).get("clock_warm") or {}
            first, top = cw.get("first_mhz"), cw.get("max_mhz")
            v = verdicts.get(e, {})
            if first is None or not top:
                continue
            if a.before and not (() < _version(v.get("grader_version")) < _version(a.before)):
                continue
            idle = v.get("device_idle_s")
            band = ("not recorded" if idle is None else "< 0.1 s" if idle < 0.1 else "0.1-1 s" if idle < 1
                    else "1-5 s" if idle < 5 else ">= 5 s")
            n += 1
            hot = first >= 0.95 * top
            boosted += hot
            buckets[(band, hot)] += 1
    print(f"FIGURE clock read boosted before any work: {boosted} of {n} gradings"
          + (f" (graders before {a.before})" if a.before else ""))
    for band in ("< 0.1 s", "0.1-1 s", "1-5 s", ">= 5 s", "not recorded"):
        print(f"    device idle {band:12s}: boosted {buckets[(band, True)]:5d}, not {buckets[(band, False)]:5d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
