"""Benchmarks the event store against plain pyarrow and polars measured in the same run: append, read, compaction.

Run: `python benchmarks/events_bench.py [--events 1000000] [--many-files 10000] [--dir /tmp/x]`. Prints one table.
Each mkb figure is printed next to its plain counterpart timed on the same machine moments apart, and
as a ratio (machines' noise cancels in it):
- append: EventWriter.emit (envelope, schema check, atomic fsynced publish) against a plain loop that
  builds the same rows as dicts (envelope included: uuid4, timestamp) and writes each 10k with
  `pa.Table.from_pylist` + `pq.write_table`; target >= 0.9x.
- read: `mkb.events.read` (footer checks, schema conformance, de-duplication) against
  `polars.scan_parquet(files).collect()` of the same files, with a cold footer cache.
- compaction: `compact_kind` of N events in many small files against polars reading them and
  writing one file (`scan_parquet(files).sink_parquet`).
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


def bench_plain_append(root: str, n: int, *, flush_every: int) -> float:
    """The baseline: what a project without mkb writes: dict rows with an envelope, one pyarrow file per flush."""
    import datetime as dt
    import uuid

    import pyarrow.parquet as pq

    schema = schema_for("verdict").arrow()
    os.makedirs(root, exist_ok=True)
    t = time.perf_counter()
    rows, k = [], 0
    for i in range(n):
        rows.append({**PAYLOAD, "event_id": str(uuid.uuid4()), "kind": "verdict", "schema_version": "1.0",
                     "ts": dt.datetime.now(dt.timezone.utc), "run_id": "run", "attempt_id": f"a{i % 500}", "seq": i,
                     "writer": "w", "mkb_version": "0"})
        if len(rows) >= flush_every:
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), f"{root}/{k}.parquet", compression="zstd")
            rows, k = [], k + 1
    if rows:
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), f"{root}/{k}.parquet", compression="zstd")
    return n / (time.perf_counter() - t)


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


def _ratio(mkb_value: float, plain_value: float) -> str:
    return f"{mkb_value / plain_value:.2f}x"


def main() -> None:
    import polars as pl

    from mkb.events._compact import compact_kind
    from mkb.events._reader import list_files

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--many-files", type=int, default=10_000)
    ap.add_argument("--append-events", type=int, default=200_000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="mkb-bench-"))
    rows: list[tuple[str, str, str, str]] = []  # (measurement, mkb, plain, ratio/target)
    try:
        n = args.append_events
        plain, mkb_eps = [], []
        for rep in range(3):  # interleaved, so both see the same machine load
            plain.append(bench_plain_append(str(base / f"p{rep}"), n, flush_every=10_000))
            mkb_eps.append(bench_emit(str(base / f"w{rep}"), n, batch=None, flush_every=10_000))
        p, m = sorted(plain)[1], sorted(mkb_eps)[1]
        rows.append((f"append {n:,} events, emit() one at a time, a file per 10k (median of 3)", f"{m:,.0f}/s", f"{p:,.0f}/s", f"{_ratio(m, p)} (>= 0.90x)"))
        m = bench_emit(str(base / "wb"), n, batch=1_000, flush_every=10_000)
        rows.append((f"append {n:,} events, emit_many() batches of 1k", f"{m:,.0f}/s", f"{p:,.0f}/s", _ratio(m, p)))
        eps, wall = bench_processes(str(base / "w8"), 8, 25_000, 5_000)
        rows.append(("append, 8 writer processes x 25k, a file per 5k", f"{eps:,.0f}/s", "", f"{wall:.1f} s wall"))

        for label, files in (("100 files", 100), (f"{args.many_files:,} files", args.many_files)):
            root = str(base / f"read-{files}")
            make_synthetic(root, args.events, files)
            paths = [p_ for p_, _ in list_files(resolve_store(root), "verdict")]
            pl.scan_parquet(paths[:1]).collect()  # polars' own start-up is not part of either figure
            t_pl, _ = timed(lambda: pl.scan_parquet(paths).collect())
            _cache.clear()
            t_mkb, out = timed(lambda: scan("verdict", root).collect())
            assert out.height == args.events
            t_warm, _ = timed(lambda: scan("verdict", root).collect())
            rows.append((f"read {args.events:,} events in {label}, cold footer cache", f"{t_mkb:.2f} s", f"{t_pl:.2f} s", f"{t_pl / t_mkb:.2f}x speed"))
            rows.append((f"read {args.events:,} events in {label}, warm footer cache", f"{t_warm:.2f} s", f"{t_pl:.2f} s", f"{t_pl / t_warm:.2f}x speed"))
            t_agg, _ = timed(aggregate, root)
            t_pagg, _ = timed(lambda: pl.scan_parquet(paths).group_by("dsl", "gpu", "scope", "problem").agg(pl.len(), pl.col("passed").mean(), pl.col("speedup").median(), pl.col("s").mean()).collect())
            rows.append((f"scan + group_by over {label}, warm", f"{t_agg:.2f} s", f"{t_pagg:.2f} s", f"{t_pagg / t_agg:.2f}x speed"))
            if files == args.many_files:
                t_psink, _ = timed(lambda: pl.scan_parquet(paths).sink_parquet(str(base / "plain-compacted.parquet")))
                t_c, res = timed(compact_kind, "verdict", root, grace_s=0)
                assert res.rows == args.events
                left = len(list_files(resolve_store(root), "verdict"))
                rows.append((f"compact {args.events:,} events in {label} (to {left} files)", f"{t_c:.2f} s", f"{t_psink:.2f} s", f"{t_psink / t_c:.2f}x speed"))
                _cache.clear()
                t_after, _ = timed(lambda: scan("verdict", root).collect())
                rows.append((f"read them after compaction, cold", f"{t_after:.2f} s", "", ""))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  {'mkb':>12}  {'plain':>12}  mkb vs plain")
    print("-" * (width + 48))
    for name, mv, pv, ratio in rows:
        print(f"{name:<{width}}  {mv:>12}  {pv:>12}  {ratio}")
    print("\nplain = pyarrow write_table (append) / polars.scan_parquet (read, aggregate, compaction) on the same files, same run;"
          " 'x speed' above 1 means mkb was faster")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end (other processes share this machine)")


if __name__ == "__main__":
    main()
