"""Benchmark: `mkb-analyze lift` end to end (every figure it prints, 10,000 resamples) on a synthetic store.

Targets (issue #11 item 8): as a whole process, 1M events <= 1.5 s and 10M events <= 10 s, peak memory
under 1 GiB. Prints wall time and peak RSS of each whole-process run, then where the time goes in-process:
reading the store into the attempts/pairs tables, the bootstrap (every resample of every CI), and the rest.

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
    print(f"store {store}: {events:,} events, {size / 2**20:.1f} MiB; cpus {os.cpu_count()}, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (the machine's other work slows every figure below)")

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "mkb.cli.analyze", "lift", "--store", store, "--json", os.devnull]
    times, peaks, cpus = [], [], []
    for i in range(args.runs):
        # output to files, not pipes: the tables outgrow a pipe's buffer and the child would block writing them
        with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, env=env)
            _, status, usage = os.wait4(proc.pid, 0)
            times.append(time.perf_counter() - t0)
            peaks.append(usage.ru_maxrss / 1024)  # KiB -> MiB (Linux)
            cpus.append(usage.ru_utime + usage.ru_stime)  # CPU seconds: on a shared machine steadier than the wall time
            fo.seek(0), fe.seek(0)
            out, err = fo.read(), fe.read()
        if os.waitstatus_to_exitcode(status) != 0:
            print(out[-3000:], err[-3000:])
            raise SystemExit("mkb-analyze lift failed")
    lines = out.splitlines()
    print("\n".join(lines[:3]))
    print(next((ln for ln in lines if ln.startswith("95% CIs")), ""))
    target_s = 1.5 if events <= 1_500_000 else 10.0
    print(f"`mkb-analyze lift` whole process (start to exit, 10,000 resamples, every figure): runs {', '.join(f'{t:.2f}' for t in times)} s; "
          f"min {min(times):.2f} s, median {statistics.median(times):.2f} s; CPU (user + sys, all threads) min {min(cpus):.2f} s, "
          f"median {statistics.median(cpus):.2f} s; peak RSS max {max(peaks):.0f} MiB; "
          f"target <= {target_s:g} s: {'MET' if min(times) <= target_s else 'MISSED'}, < 1024 MiB: {'MET' if max(peaks) < 1024 else 'MISSED'}")

    # where the time goes, in-process: reading + tables, the bootstrap (timed inside), the rest of each table
    import mkb.analysis._stats as st
    from mkb.analysis import BootstrapSpec, contrast_table, lift_table, load_tables

    boot_s = [0.0]
    inner = st.cluster_bootstrap_many

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            boot_s[0] += time.perf_counter() - t

    st.cluster_bootstrap_many = timed
    loads, boots, rests = [], [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        t = load_tables(store, columns="lift")  # what `mkb-analyze lift` reads
        t1 = time.perf_counter()
        boot_s[0] = 0.0
        lt = lift_table(t.pairs, spec=BootstrapSpec(), pooled=True)
        contrast_table(t.pairs, spec=BootstrapSpec())
        total = time.perf_counter() - t1
        loads.append(t1 - t0)
        boots.append(boot_s[0])
        rests.append(total - boot_s[0])
    st.cluster_bootstrap_many = inner
    print(f"in-process (min / median of {args.runs}): reading the store into attempts/pairs tables {min(loads):.2f} / "
          f"{statistics.median(loads):.2f} s ({t.attempts.height:,} attempts, {t.pairs.height:,} pairs); bootstrap (10,000 "
          f"resamples, every CI) {min(boots):.2f} / {statistics.median(boots):.2f} s; rest of the lift and contrast tables "
          f"{min(rests):.2f} / {statistics.median(rests):.2f} s ({lt.height} cells); load average now "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if not args.keep and args.store is None:
        print(f"(dataset kept for re-runs at {store}; delete it when done)")


if __name__ == "__main__":
    main()
