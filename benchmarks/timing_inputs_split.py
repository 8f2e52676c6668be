"""Reads problem 1's `timing_inputs` from the committed grader-bench datasets against what the record says of its sets.

Why: DESIGN once put problem 1's 1.8 s `timing_inputs` down to allocating a whole loop's sets afresh. Every dataset
since grader 2.14 records the segments the first pass created (`input_sets_first_pass_segments`), and in them fresh
allocation shows in fast gradings as well as slow ones; this prints the split so the claim is read from the events.

    .venv/bin/python benchmarks/timing_inputs_split.py [events/h200-grader-bench-*]
"""

from __future__ import annotations

import glob
import json
import statistics
import sys

import polars as pl

from mkb.events import read


def _details(x):
    return json.loads(x) if isinstance(x, str) else (x or {})


def rows(datasets: list[str], problem: int = 1) -> list[dict]:
    out = []
    for ds in datasets:
        timing = {r["evaluation_id"]: {**_details(r["details"]), "n_warmup": r["n_warmup"]}
                  for r in read("timing", ds).iter_rows(named=True)}
        for r in read("verdict", ds).filter(pl.col("problem") == problem).iter_rows(named=True):
            t = timing.get(r["evaluation_id"]) or {}
            if t.get("input_sets_first_pass_segments") is None:
                continue  # before grader 2.14: no segment figures
            out.append({"dataset": ds.rstrip("/").rsplit("/", 1)[-1], "dsl": r["dsl"],
                        "timing_inputs_s": _details(r["details"]).get("phases_s", {}).get("worker.run.timing_inputs"),
                        "premade": t.get("input_sets_alive") == (t.get("n_warmup") or 0) + (t.get("n_timed_planned") or 0),
                        "alive": t.get("input_sets_alive"), "first_pass_segments": t["input_sets_first_pass_segments"],
                        "made": t.get("input_sets_made")})
    return out


def main(argv: list[str]) -> int:
    datasets = sorted(argv or glob.glob("events/h200-grader-bench-2-1[4-9]*"))
    rs = [r for r in rows(datasets) if r["timing_inputs_s"] is not None]
    print(f"problem 1 gradings with segment figures: {len(rs)} in {len(datasets)} datasets")
    groups = {"sets premade, first pass created segments": [r for r in rs if r["premade"] and r["first_pass_segments"] > 0],
              "sets premade, every block cached": [r for r in rs if r["premade"] and r["first_pass_segments"] == 0],
              "ring (sets made in the loop)": [r for r in rs if not r["premade"]]}
    for name, g in groups.items():
        xs = sorted(r["timing_inputs_s"] for r in g)
        if not xs:
            print(f"  {name}: none")
            continue
        segs = sorted(r["first_pass_segments"] for r in g)
        print(f"  {name}: {len(xs)} gradings; timing_inputs median {statistics.median(xs):.3f} s, range {xs[0]:.3f}-{xs[-1]:.3f} s; "
              f"under 0.5 s: {sum(x < 0.5 for x in xs)}, over 1.5 s: {sum(x > 1.5 for x in xs)}; first-pass segments {segs[0]}-{segs[-1]}")
    made = [r for r in rs if r["made"]]
    for r in made:
        print(f"  {r['dataset']} {r['dsl']}: timing_inputs {r['timing_inputs_s']:.3f} s, made {r['made']}")
    if not made:
        print("  no grading records where the phase went (input_sets_made, grader 2.19)")
        return 0
    slow = [r["made"] for r in made if r["timing_inputs_s"] > 1.0]
    fast = [r["made"] for r in made if r["timing_inputs_s"] <= 1.0]
    for name, g in (("over 1 s", slow), ("1 s or less", fast)):
        if g:
            cpu = sorted(m["cpu_s"] for m in g)
            print(f"FIGURE problem 1 timing_inputs {name}: {len(g)} of {len(made)} gradings that record input_sets_made; "
                  f"CPU seconds {cpu[0]:.2f}-{cpu[-1]:.2f}; device frees {sum(m['device_frees'] or 0 for m in g)}, "
                  f"retried mallocs {sum(m['alloc_retries'] or 0 for m in g)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
