"""Benchmark: `mkb-analyze lift` end to end on a synthetic store of about 1,000,000 events (target < 5 s).

Usage: python benchmarks/analyze_bench.py [--store DIR] [--events N] [--runs K] [--keep]
The dataset is generated once (not timed) into DIR (default: a fixed folder under the temp dir) and reused
by later runs while its `.complete` marker is there. The machine may be shared: K runs, min and median reported.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default=None)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    from mkb.analysis.synthetic import SynthSpec, write_synthetic

    per_model = 74 * args.replicates * 10 * 5  # attempts x events per attempt (started, skill, finished, 2 verdicts)
    n_models = max(1, round(args.events / per_model))
    store = args.store or os.path.join(tempfile.gettempdir(), f"mkb-bench-{n_models}m-r{args.replicates}")
    marker = Path(store) / ".complete"
    if not marker.exists():
        shutil.rmtree(store, ignore_errors=True)
        spec = SynthSpec(models=tuple(f"bench/model-{i:03d}" for i in range(n_models)), replicates=args.replicates,
                         model_means=tuple(0.4 + 0.6 * i / max(1, n_models - 1) for i in range(n_models)),
                         p_infra=0.005, p_unfinished=0.002, n_annotated=50, seed=1)
        t0 = time.perf_counter()
        res = write_synthetic(spec, store, chunk=250_000)
        marker.write_text(str(res.events))
        print(f"generated {res.events:,} events ({n_models} models) in {len(res.files)} files, {time.perf_counter() - t0:.1f} s (not timed)")
    events = int(marker.read_text())
    size = sum(f.stat().st_size for f in Path(store).rglob("*.parquet"))
    print(f"store {store}: {events:,} events, {size / 2**20:.1f} MiB; cpus {os.cpu_count()}")

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "mkb.cli.analyze", "lift", "--store", store]
    times = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t0)
        if out.returncode != 0:
            print(out.stdout[-3000:], out.stderr[-3000:])
            raise SystemExit("mkb-analyze lift failed")
    lines = out.stdout.splitlines()
    print("\n".join(lines[:3]))
    print(next((ln for ln in lines if ln.startswith("95% CIs")), ""))
    print(f"`mkb-analyze lift` end to end (process start to exit, 10,000 resamples): "
          f"runs {', '.join(f'{t:.2f}' for t in times)} s; min {min(times):.2f} s, median {statistics.median(times):.2f} s; target < 5 s: "
          f"{'MET' if min(times) < 5 else 'MISSED'}")

    # where the time goes, in-process
    from mkb.analysis import BootstrapSpec, lift_table, load_tables

    loads, lifts = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        t = load_tables(store)
        t1 = time.perf_counter()
        lt = lift_table(t.pairs, spec=BootstrapSpec())
        loads.append(t1 - t0)
        lifts.append(time.perf_counter() - t1)
    print(f"in-process (min / median of {args.runs}): load + attempts/pairs tables {min(loads):.2f} / {statistics.median(loads):.2f} s "
          f"({t.attempts.height:,} attempts, {t.pairs.height:,} pairs); lift table with bootstrap and tests "
          f"{min(lifts):.2f} / {statistics.median(lifts):.2f} s ({lt.height} cells)")
    if not args.keep and args.store is None:
        print(f"(dataset kept for re-runs at {store}; delete it when done)")


if __name__ == "__main__":
    main()
