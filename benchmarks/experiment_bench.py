"""Benchmarks the experiment executor: orchestration overhead per attempt, kill-and-resume cycles, dry-run estimate vs measured.

Run: `python benchmarks/experiment_bench.py [--cycles 50] [--compare STORE CONFIG]`.
- overhead: the demo plan (2 problems x 5 arms x 2 DSLs x 2 replicates = 40 attempts) with the model-free runner, so
  every second measured is orchestration (claims, store reads, events), not model or grading time.
- kill cycles: an executor process SIGKILLed at a seeded random moment, `--cycles` times, then run to the end; prints
  whether anything was lost or duplicated (the CI test does 5 cycles).
- `--compare STORE CONFIG`: the dry-run estimate of CONFIG against what the run in STORE measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mkb.experiment import build_plan, estimate, load_config  # noqa: E402
from mkb.experiment._executor import Executor  # noqa: E402
from mkb.experiment._fake import FakeRunner, demo_config  # noqa: E402
from mkb.experiment._killtest import check, finish, kill_cycles  # noqa: E402


def overhead(tmp: Path, repeats: int) -> None:
    print("== orchestration overhead per attempt (model-free runner, local store, pair re-grade off)")
    per, wall = [], []
    for i in range(repeats):
        plan = build_plan(demo_config())
        ex = Executor(plan, store=str(tmp / f"ovh{i}"), runner=FakeRunner(), versions={"bench": 1}, poll_s=0.05,
                      pair_regrade=False)
        t = time.perf_counter()
        rep = ex.run()
        wall.append((time.perf_counter() - t) / rep.ran)
        per.append(rep.overhead_s / rep.ran)
    print(f"  {rep.ran} attempts x {repeats} runs: claim+state+events per attempt median {statistics.median(per) * 1000:.0f} ms "
          f"(min {min(per) * 1000:.0f}); run wall per attempt median {statistics.median(wall) * 1000:.0f} ms at concurrency 4")


def cycles(tmp: Path, n: int) -> None:
    print(f"== {n} SIGKILL-and-resume cycles (runner sleeps 0.3 s per attempt, lease ttl 1 s)")
    store = str(tmp / "kill")
    t = time.perf_counter()
    delays = kill_cycles(store, cycles=n, seed=0, sleep_s=0.3, ttl_s=1.0, kill_after=(1.0, 4.0), log=lambda s: None)
    mid = check(store)
    finish(store, ttl_s=1.0)
    c = check(store)
    print(f"  kills at {min(delays):.2f}-{max(delays):.2f} s; before the final run: {mid.scored}/{mid.coordinates} scored, "
          f"{mid.claimed - mid.finished} attempt(s) cut short")
    print(f"  after: {c.scored}/{c.coordinates} scored, duplicates {c.duplicates}, superseded {c.superseded}, "
          f"claimed {c.claimed}, finished {c.finished}, abandoned {c.abandoned}, unaccounted {c.unaccounted} "
          f"-> {'OK: nothing lost or duplicated' if c.ok else 'FAILED'}  ({time.perf_counter() - t:.0f} s)")


def state_read(tmp: Path, n: int) -> None:
    """What one look at the store costs as it grows: n attempts written as a live run writes them (a file per kind per flush)."""
    from mkb.events import EventWriter
    from mkb.experiment._state import read_state

    print(f"== reading the experiment's state from a store of {n} attempts (4 small files each, as flushed live)")
    store = str(tmp / "big")
    w = EventWriter(store)
    for i in range(n):
        aid = f"a{i:06d}"
        w.emit("claim", attempt_id=aid, coordinate=f"big|m|{i}", experiment="big", plan_sha256="x", model="m", problem=1,
               problem_hash="h", target_dsl="cute", arm_kind="solo", replicate=0, action="claimed", token=1, holder="h", try_index=0)
        w.emit("attempt_started", attempt_id=aid, experiment="big", model="m", problem=1, problem_hash="h", target_dsl="cute",
               arm_kind="solo", replicate=0, gpu="g", budget_submissions=1, budget_turns=1, budget_output_tokens=1, budget_wall_s=1.0,
               grader_version="g", dsl_version="d", doc_pack_version="p")
        w.emit("skill", attempt_id=aid, text="t", sha256="s", source_attempt=aid)
        w.emit("attempt_finished", attempt_id=aid, status="finished", cost_usd=0.0, output_tokens=1)
        w.flush()
    w.close()
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        st = read_state(store, "big")
        ts.append(time.perf_counter() - t)
    assert sum(1 for c in st.coords.values() if c.scored) == n
    print(f"  {len(w.files_written)} files: read_state median {statistics.median(ts):.2f} s (the executor reads it once per "
          "loop turn and once per claim); `mkb-run compact` merges the files")


def compare(store: str, config: str) -> None:
    import polars as pl

    from mkb.events import read

    plan = build_plan(load_config(config))
    print(f"== dry-run estimate vs measured ({store})")
    started = read("attempt_started", store).filter(pl.col("experiment") == plan.config.name)
    ids = started["attempt_id"].to_list()
    fin = read("attempt_finished", store).filter(pl.col("attempt_id").is_in(ids))
    ver = read("verdict", store)
    walls = [w for d in ver["details"].drop_nulls() if (w := json.loads(d).get("wall_s")) is not None]  # real gradings only
    gpu_s = sum(walls)
    span = (fin["ts"].max() - started["ts"].min()).total_seconds() if fin.height else None
    measured = {"attempts": started.height, "gradings": ver.height, "output tokens": fin["output_tokens"].fill_null(0).sum(),
                "input tokens": fin["input_tokens"].fill_null(0).sum(), "cost USD": fin["cost_usd"].fill_null(0).sum(),
                "GPU-hours": gpu_s / 3600 if walls else None, "wall-clock hours": span / 3600 if span else None}
    for e in estimate(plan):
        key = next((k for k in measured if e.name.startswith(k)), None)
        got = f"{measured[key]:,.2f}" if key and measured[key] is not None else "n/a (not in the events)"
        print(f"  {e.name:28s} estimate {e.value:>14,.2f}   measured {got}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compare", nargs=2, metavar=("STORE", "CONFIG"))
    ap.add_argument("--state-attempts", type=int, default=1000, help="attempts in the store-size section (0: skip)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mkb-exp-bench-") as d:
        if a.compare:
            compare(*a.compare)
            return
        overhead(Path(d), a.repeats)
        if a.state_attempts:
            state_read(Path(d), a.state_attempts)
        if a.cycles:
            cycles(Path(d), a.cycles)


if __name__ == "__main__":
    main()
