"""Benchmarks the event store against plain pyarrow and polars measured in the same run: append, read, compaction.

Run: `python benchmarks/events_bench.py [--events 1000000] [--many-files 10000] [--rounds 7] [--dir /tmp/x]`.
Prints one table. Each mkb figure is printed next to its plain counterpart, timed in the same run in
alternating rounds (plain first in even rounds, mkb first in odd ones, after an untimed warm-up of
both), and the ratio is the median of the rounds' ratios with their range: a machine shared with other
work slows both sides of a round alike, and the median drops the rounds that a burst hit on one side.
- append: EventWriter.emit (envelope, schema check, seq, atomic fsynced publish) against a plain loop
  that builds the same rows as dicts (the same envelope columns, an id per row from `mkb.events.uuid7`,
  the same integer-microsecond timestamp) and writes each 10k with `pa.Table.from_pylist` +
  `pq.write_table`, with the same schema, compression (zstd) and row-group size; the plain loop does
  no validation, no seq and no fsync, and pyarrow's default encodings. Target >= 0.9x. Where mkb's
  writer differs by design, not by skipping work: it takes event ids from blocks (`uuid7_block`,
  ~0.2 us an id against ~0.9 us for a `uuid7()` call per row), buffers a checked payload's values in
  one flat list and converts them column by column (plain's `from_pylist` of dicts costs more), writes
  event_id and ts without a dictionary page, and encodes, fsyncs and publishes a full batch in a
  publisher thread while the caller goes on emitting, so it can use a second core where plain's loop
  uses one: the CPU seconds of both (all threads) are printed beside the rates.
- read: `mkb.events.read` (footer checks, schema conformance, de-duplication) against
  `polars.scan_parquet(files).collect()` of the same files (the file list given to polars; mkb lists
  the folder itself); cold = every in-process cache of mkb cleared first (footers, verdicts, footer
  index segments), the OS page cache warm for both. The first read of a store of >= 1,000 files
  parses every footer and leaves a footer index segment in the store (`_index/`); it is timed once
  and printed on its own row; the cold rounds after it are fresh-process reads of an indexed store.
- compaction: `compact_kind` of N events in many small files (a fresh copy each round, with the footer
  index the reads left, synced to disk before the clock starts: otherwise compaction's first fsync
  would write the copy's data back, work plain never pays for its originals; grace 0, so the sources
  are deleted too) against polars reading them and writing one file (`scan_parquet(files).sink_parquet`,
  no fsync).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
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

from mkb.events import EventWriter, _index, scan, schema_for, uuid7, write_table  # noqa: E402
from mkb.events._reader import clear_caches  # noqa: E402
from mkb.events._store import resolve_store  # noqa: E402
from mkb.events._writer import COMPRESSION, ROW_GROUP_SIZE  # noqa: E402

PAYLOAD = dict(scope="attempt", problem=28, dsl="cute", passed=True, s=60.0, gpu="NVIDIA H200", speedup=1.7,
               eager_median_us=120.0, candidate_median_us=70.0, r_at_0=True, r_at_0_5=True, r_at_1=True, r_at_2=False, r_at_4=False)


def bench_plain_append(root: str, n: int, *, flush_every: int) -> float:
    """The baseline: what a project without mkb writes: the same rows as dicts, one pyarrow file per flush, no checks, no fsync."""
    import mkb
    import pyarrow.parquet as pq

    schema = schema_for("verdict").arrow()
    version = schema_for("verdict").version
    os.makedirs(root, exist_ok=True)
    t = time.perf_counter()
    rows, k = [], 0
    for i in range(n):
        rows.append({**PAYLOAD, "event_id": uuid7(), "kind": "verdict", "schema_version": version,
                     "ts": time.time_ns() // 1000, "run_id": "run", "attempt_id": f"a{i % 500}", "seq": i,
                     "writer": "w", "mkb_version": mkb.__version__})
        if len(rows) >= flush_every:
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), f"{root}/{k}.parquet", compression=COMPRESSION, row_group_size=ROW_GROUP_SIZE)
            rows, k = [], k + 1
    if rows:
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), f"{root}/{k}.parquet", compression=COMPRESSION, row_group_size=ROW_GROUP_SIZE)
    return n / (time.perf_counter() - t)


def bench_emit(root: str, n: int, *, batch: int | None, flush_every: int) -> float:
    """mkb's writer: one emit() per event (batch None) or emit_many() of `batch` fresh dicts; the close publishes the last batch."""
    t = time.perf_counter()
    with EventWriter(root, flush_every=flush_every) as w:
        if batch is None:
            for i in range(n):
                w.emit("verdict", attempt_id=f"a{i % 500}", **PAYLOAD)
        else:
            for _ in range(n // batch):  # fresh dicts each batch, as a caller would build them (plain builds one per event too)
                w.emit_many("verdict", [dict(PAYLOAD, attempt_id=f"a{i % 500}") for i in range(batch)])
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


def rounds(n: int, plain, mkb, cpu: list | None = None) -> tuple[list[float], list[float]]:
    """Time `plain()` and `mkb()` (each returns seconds or a rate) in `n` rounds, alternating which goes first.

    With `cpu`, each round appends (plain's, mkb's) process CPU seconds (every thread) to it.
    """
    p, m = [], []

    def one(fn, out):
        c = time.process_time()
        out.append(fn())
        return time.process_time() - c

    for r in range(n):
        order = ((plain, p), (mkb, m)) if r % 2 == 0 else ((mkb, m), (plain, p))
        spent = {id(out): one(fn, out) for fn, out in order}
        if cpu is not None:
            cpu.append((spent[id(p)], spent[id(m)]))
    return p, m


def cpu_cell(cpu: list, n: int) -> str:
    """Median CPU microseconds per event, plain and mkb, over the rounds."""
    return f"CPU {statistics.median(c[1] for c in cpu) / n * 1e6:.1f} vs {statistics.median(c[0] for c in cpu) / n * 1e6:.1f} us/event"


def ratio_cell(ratios: list[float], target: str = "") -> str:
    """Median of the rounds' ratios, with their range."""
    med = statistics.median(ratios)
    spread = f" [{min(ratios):.2f}-{max(ratios):.2f}]" if len(ratios) > 1 else ""
    return f"{med:.2f}x{spread}" + (f" ({target})" if target else "")


def main() -> None:
    import polars as pl

    from mkb.events._compact import compact_kind
    from mkb.events._reader import list_files

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--many-files", type=int, default=10_000)
    ap.add_argument("--append-events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds of emit() append (emit_many and reads: 3 at most, compaction: 2 at most)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="mkb-bench-"))
    load0 = os.getloadavg()[0]
    started = time.time()
    rows: list[tuple[str, str, str, str]] = []  # (measurement, mkb, plain, ratio)
    try:
        n = args.append_events
        k = iter(range(10**6))
        bench_plain_append(str(base / "warm-p"), n // 10, flush_every=10_000)  # warm-up: imports, allocator, page cache
        bench_emit(str(base / "warm-w"), n // 10, batch=None, flush_every=10_000)
        cpu: list = []
        plain, mkb_eps = rounds(args.rounds, lambda: bench_plain_append(str(base / f"p{next(k)}"), n, flush_every=10_000),
                                lambda: bench_emit(str(base / f"w{next(k)}"), n, batch=None, flush_every=10_000), cpu)
        ratios = [m / p for m, p in zip(mkb_eps, plain)]
        p_med = statistics.median(plain)
        rows.append((f"append {n:,} events, emit() one at a time, a file per 10k", f"{statistics.median(mkb_eps):,.0f}/s", f"{p_med:,.0f}/s",
                     ratio_cell(ratios, ">= 0.90x") + "; " + cpu_cell(cpu, n)))
        cpu = []
        plain_b, mkb_b = rounds(min(args.rounds, 3), lambda: bench_plain_append(str(base / f"p{next(k)}"), n, flush_every=10_000),
                                lambda: bench_emit(str(base / f"w{next(k)}"), n, batch=1_000, flush_every=10_000), cpu)
        rows.append((f"append {n:,} events, emit_many() batches of 1k", f"{statistics.median(mkb_b):,.0f}/s", f"{statistics.median(plain_b):,.0f}/s",
                     ratio_cell([m / p for m, p in zip(mkb_b, plain_b)]) + "; " + cpu_cell(cpu, n)))
        eps, wall = bench_processes(str(base / "w8"), 8, 25_000, 5_000)
        rows.append(("append, 8 writer processes x 25k, a file per 5k", f"{eps:,.0f}/s", "", f"{wall:.1f} s wall"))

        read_rounds = min(args.rounds, 3)
        for label, files in (("100 files", 100), (f"{args.many_files:,} files", args.many_files)):
            root = str(base / f"read-{files}")
            make_synthetic(root, args.events, files)
            paths = [p_ for p_, _ in list_files(resolve_store(root), "verdict")]
            pl.scan_parquet(paths[:1]).collect()  # polars' own start-up is not part of either figure

            def cold():
                clear_caches()
                t, out = timed(lambda: scan("verdict", root).collect())
                assert out.height == args.events
                return t

            if files >= _index.MIN_FILES:  # the first read parses every footer and leaves the footer index behind
                t_pl0, t_first = rounds(1, lambda: timed(lambda: pl.scan_parquet(paths).collect())[0], cold)
                assert _index._list(resolve_store(root), "verdict"), "the first read left no footer index"
                rows.append((f"read {args.events:,} events in {label}, first read (parses every footer, writes the index)", f"{t_first[0]:.2f} s",
                             f"{t_pl0[0]:.2f} s", ratio_cell([t_pl0[0] / t_first[0]], "speed, one round")))
            t_pl, t_mkb = rounds(read_rounds, lambda: timed(lambda: pl.scan_parquet(paths).collect())[0], cold)
            t_warm = [timed(lambda: scan("verdict", root).collect())[0] for _ in range(read_rounds)]
            rows.append((f"read {args.events:,} events in {label}, cold" + (" (fresh process, footer index present)" if files >= _index.MIN_FILES else ""),
                         f"{statistics.median(t_mkb):.2f} s", f"{statistics.median(t_pl):.2f} s",
                         ratio_cell([p / m for p, m in zip(t_pl, t_mkb)], "speed, 1x = as fast")))
            rows.append((f"read {args.events:,} events in {label}, warm footer cache", f"{statistics.median(t_warm):.2f} s", f"{statistics.median(t_pl):.2f} s",
                         ratio_cell([p / m for p, m in zip(t_pl, t_warm)], "speed")))
            group = lambda lf: lf.group_by("dsl", "gpu", "scope", "problem").agg(pl.len(), pl.col("passed").mean(), pl.col("speedup").median(), pl.col("s").mean())  # noqa: E731
            t_pagg, t_agg = rounds(read_rounds, lambda: timed(lambda: group(pl.scan_parquet(paths)).collect())[0],
                                   lambda: timed(lambda: group(scan("verdict", root)).collect())[0])
            rows.append((f"scan + group_by over {label}, warm", f"{statistics.median(t_agg):.2f} s", f"{statistics.median(t_pagg):.2f} s",
                         ratio_cell([p / m for p, m in zip(t_pagg, t_agg)], "speed")))
            if files == args.many_files:
                left = []

                def plain_compact():
                    return timed(lambda: pl.scan_parquet(paths).sink_parquet(str(base / "plain-compacted.parquet")))[0]

                def mkb_compact():
                    copy = str(base / f"compact-{next(k)}")
                    shutil.copytree(root, copy)
                    os.sync()  # untimed: the copy's files are durable, as the originals plain reads are (each was fsynced when written)
                    clear_caches()
                    t, res = timed(compact_kind, "verdict", copy, grace_s=0)
                    assert res.rows == args.events
                    left.append((copy, len(list_files(resolve_store(copy), "verdict"))))
                    return t

                t_psink, t_c = rounds(min(args.rounds, 2), plain_compact, mkb_compact)
                rows.append((f"compact {args.events:,} events in {label} (to {left[0][1]} files)", f"{statistics.median(t_c):.2f} s",
                             f"{statistics.median(t_psink):.2f} s", ratio_cell([p / m for p, m in zip(t_psink, t_c)], "speed")))
                clear_caches()
                t_after, _ = timed(lambda: scan("verdict", left[0][0]).collect())
                rows.append(("read them after compaction, cold", f"{t_after:.2f} s", "", ""))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  {'mkb':>12}  {'plain':>12}  mkb vs plain: median of rounds [range]")
    print("-" * (width + 64))
    for name, mv, pv, ratio in rows:
        print(f"{name:<{width}}  {mv:>12}  {pv:>12}  {ratio}")
    print("\nplain = pyarrow write_table (append) / polars.scan_parquet (read, aggregate, compaction) on the same files, same run;"
          " append: mkb events/s over plain's; the rest: 'speed' = plain's time over mkb's (above 1: mkb was faster)")
    print(f"rounds: append {args.rounds}, reads {min(args.rounds, 3)}, compaction {min(args.rounds, 2)}; {os.cpu_count()} CPUs;"
          f" load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end ({time.time() - started:.0f} s; other processes share this machine)")
    print(f"command: python benchmarks/events_bench.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
