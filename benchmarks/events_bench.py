"""Benchmarks the event store: append throughput (one writer, eight processes) and scan-and-aggregate over 1M events.

Run: `python benchmarks/events_bench.py [--events 1000000] [--dir /tmp/x]`. Prints one table.
Targets (issue 2): >= 50,000 events/s for one local writer in batches; aggregate over 1M events < 2 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from mkb.events import EventWriter, ScanReport, scan, schema_for, write_table  # noqa: E402
from mkb.events._reader import _cache, _check  # noqa: E402
from mkb.events._store import resolve_store  # noqa: E402

PAYLOAD = dict(scope="attempt", problem=28, dsl="cute", passed=True, s=60.0, gpu="NVIDIA H200", speedup=1.7,
               eager_median_us=120.0, candidate_median_us=70.0, r_at_0=True, r_at_0_5=True, r_at_1=True, r_at_2=False, r_at_4=False)


def bench_emit(root: str, n: int, *, batch: int | None, flush_every: int) -> float:
    t = time.perf_counter()
    with EventWriter(root, flush_every=flush_every) as w:
        if batch is None:
            for i in range(n):
                w.emit("verdict", attempt_id=f"a{i % 500}", **PAYLOAD)
        else:
            rows = [dict(PAYLOAD, attempt_id=f"a{i % 500}") for i in range(batch)]
            for _ in range(n // batch):
                w.emit_many("verdict", rows)
    return n / (time.perf_counter() - t)


def bench_processes(root: str, n_proc: int, per_proc: int, flush_every: int) -> tuple[float, float]:
    code = textwrap.dedent(
        """
        import sys, time
        from mkb.events import EventWriter
        root, n, fe, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        payload = dict(scope="attempt", problem=28, dsl="cute", passed=True, s=60.0, gpu="NVIDIA H200", speedup=1.7)
        while time.time() < go:
            time.sleep(0.001)
        t0 = time.time()
        with EventWriter(root, flush_every=fe) as w:
            for i in range(n):
                w.emit("verdict", attempt_id=f"a{i % 500}", **payload)
        print(t0, time.time())
        """
    )
    go = time.time() + 3.0  # every child imported before the clock starts
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", code, root, str(per_proc), str(flush_every), str(go)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(n_proc)]
    spans = [tuple(map(float, p.communicate()[0].split())) for p in procs]
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return n_proc * per_proc / wall, wall


def make_synthetic(root: str, n: int, files: int, seed: int = 0, *, interleaved: bool = False) -> None:
    """`n` verdict rows in `files` files, written column-wise (fast) but through the store's own write_table.

    interleaved: every file's event_id range overlaps every other's, as when many writers run at
    once, so the reader must de-duplicate row by row.
    """
    schema = schema_for("verdict")
    rng = np.random.default_rng(seed)
    per = n // files
    for f in range(files):
        m = per if f < files - 1 else n - per * (files - 1)
        speed = rng.lognormal(0, 1, m)
        passed = rng.random(m) < 0.6
        cols = {
            "event_id": pa.array([f"{i:012d}-{f:08d}" if interleaved else f"{f:08d}-{i:012d}" for i in range(m)]),
            "kind": pa.array(["verdict"] * m), "schema_version": pa.array([schema.version] * m),
            "ts": pa.array(np.full(m, 1_780_000_000_000_000) + np.arange(m), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "run_id": pa.array(["run"] * m), "attempt_id": pa.array([f"a{i % 5000}" for i in range(m)]),
            "seq": pa.array(np.arange(m)), "writer": pa.array(["bench"] * m), "mkb_version": pa.array(["0.1.0"] * m),
            "scope": pa.array(rng.choice(["attempt", "pair"], m)), "problem": pa.array(rng.integers(1, 75, m)),
            "dsl": pa.array(rng.choice(["cute", "tirx"], m)), "passed": pa.array(passed),
            "speedup": pa.array(speed), "s": pa.array(np.where(passed, 100 * (speed >= 1), 0.0)),
            "gpu": pa.array(rng.choice(["NVIDIA H200", "NVIDIA B200"], m)),
        }
        arrays = [cols.get(fld.name, pa.nulls(m, fld.type)) for fld in schema.arrow()]
        write_table(root, "verdict", pa.Table.from_arrays(arrays, schema=schema.arrow()))


def aggregate(root: str, *, dedupe: bool = True):
    import polars as pl

    return (
        scan("verdict", root, dedupe=dedupe)
        .group_by("dsl", "gpu", "scope", "problem")
        .agg(pl.len().alias("n"), pl.col("passed").mean().alias("pass_rate"), pl.col("speedup").median().alias("median_speedup"), pl.col("s").mean().alias("S"))
        .collect()
    )


def timed(fn, *a, **k):
    t = time.perf_counter()
    out = fn(*a, **k)
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="mkb-bench-"))
    rows: list[tuple[str, str, str]] = []
    try:
        eps = bench_emit(str(base / "w1"), 200_000, batch=None, flush_every=10_000)
        rows.append(("append, 1 local writer, emit() one at a time, flush every 10k", f"{eps:,.0f} events/s", ">= 50,000"))
        eps = bench_emit(str(base / "w2"), 200_000, batch=1_000, flush_every=10_000)
        rows.append(("append, 1 local writer, emit_many() batches of 1k, flush every 10k", f"{eps:,.0f} events/s", ">= 50,000"))
        eps = bench_emit(str(base / "w3"), 20_000, batch=None, flush_every=100)
        rows.append(("append, 1 local writer, emit(), flush every 100 (small files)", f"{eps:,.0f} events/s", ""))
        eps, wall = bench_processes(str(base / "w8"), 8, 25_000, 5_000)
        rows.append(("append, 8 local writer processes x 25k, flush every 5k", f"{eps:,.0f} events/s ({wall:.1f} s)", ""))

        root = str(base / "agg")
        t, _ = timed(make_synthetic, root, args.events, 100)
        rows.append((f"write {args.events:,} synthetic events as 100 files (column-wise)", f"{t:.2f} s", ""))
        _cache.clear()
        t, out = timed(aggregate, root)
        assert out["n"].sum() == args.events
        rows.append((f"scan + group_by(dsl, gpu, scope, problem) over {args.events:,}, cold footer cache", f"{t:.2f} s", "< 2 s"))
        t, _ = timed(aggregate, root)
        rows.append(("same, warm footer cache", f"{t:.2f} s", "< 2 s"))
        t, _ = timed(aggregate, root, dedupe=False)
        rows.append(("same, without event_id de-duplication", f"{t:.2f} s", ""))
        inter = str(base / "agg-interleaved")
        make_synthetic(inter, args.events, 100, interleaved=True)
        timed(aggregate, inter)
        t, out = timed(aggregate, inter)
        assert out["n"].sum() == args.events
        rows.append(("same, files' event_id ranges all overlap (row-level de-duplication), warm", f"{t:.2f} s", "< 2 s"))

        many = str(base / "many")
        store = resolve_store(many)
        small = pa.Table.from_pylist([dict(PAYLOAD, event_id="e", kind="verdict", schema_version="1.0", ts=0, run_id="r", seq=0, writer="w", mkb_version="0")], schema=schema_for("verdict").arrow())
        for _ in range(2_000):
            write_table(store, "verdict", small)
        _cache.clear()
        t, _ = timed(_check, store, "verdict", ScanReport(), warn=False)
        rows.append(("footer checks of 2,000 small files, cold", f"{t * 1000:.0f} ms", ""))
        t, _ = timed(_check, store, "verdict", ScanReport(), warn=False)
        rows.append(("footer checks of 2,000 small files, warm (cached by path+size)", f"{t * 1000:.0f} ms", ""))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  {'result':>28}  target")
    print("-" * (width + 40))
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>28}  {target}")
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end (other processes share this machine)")


if __name__ == "__main__":
    main()
