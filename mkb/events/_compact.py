"""Merges a kind's small event files into larger ones without changing what readers see.

One compaction per kind at a time, from any number of hosts: each holds the lease `compact/<kind>`
(mkb.events.Lease, on the store's exclusive create; it expires when its holder dies) and renews it
before every step, so a compaction that lost its lease stops before it writes or deletes again; the
merged file records the lease's fencing token (`mkb.compaction_token`).

Order of steps, each safe to be killed after: (1) the merged file is published atomically (its
footer lists the sources in `mkb.compacted_from`); readers from then on skip those sources;
(2) the sources are deleted once the merged file is older than `grace_s`, by this run (grace 0) or a
later one. The grace period keeps a source in place while a reader that listed it before the merge
may still be reading it (readers that find a file gone list again and start over, so grace only
spares them the restart). A compaction killed after (1) leaves sources that readers ignore and the
next compaction deletes; killed before (1), it changed nothing.

Healing: files that share event_ids (left by two compactions of an older mkb racing, or by a file
copied in twice) are found by reading the event_id column of files whose id ranges overlap, and
merged into one de-duplicated file whatever their size, so raw row counts equal unique ones again.
Files of a newer minor schema are left alone (rewriting them on this mkb's schema would drop their
newer columns), and so are files of an older major (published originals stay as written; readers
upcast them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from mkb.events._commit import _fsync_dir
from mkb.events._ids import uuid7_time
from mkb.events._lease import Lease, LeaseInfo
from mkb.events._reader import FileInfo, ScanReport, _check, overlap_groups
from mkb.events._schema import META_COMPACTED_FROM, KindSchema, parse_version, schema_for
from mkb.events._store import Store, resolve_store
from mkb.events._writer import write_table

DEFAULT_TARGET_ROWS = 250_000
DEFAULT_TARGET_BYTES = 256 * 2**20
DEFAULT_GRACE_S = 300.0  # sources outlive their merged file this long, so readers that listed them finish without a restart
LEASE_TTL_S = 120.0
META_COMPACTION_TOKEN = b"mkb.compaction_token"


@dataclass
class CompactResult:
    """What one kind's compaction did (or, with `held_by`, that another host was compacting it)."""

    kind: str
    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    awaiting_grace: list[str] = field(default_factory=list)  # superseded sources kept until their merged file is older than grace_s
    healed: int = 0  # duplicate rows removed
    held_by: LeaseInfo | None = None


def plan_groups(files: list[FileInfo], *, target_rows: int, target_bytes: int = DEFAULT_TARGET_BYTES) -> list[list[FileInfo]]:
    """Small files in name (so time) order, cut into groups whose rows and bytes fit the target; files already at the target stay, and only groups of 2 or more are merged."""
    groups: list[list[FileInfo]] = []
    cur: list[FileInfo] = []
    rows = size = 0
    for f in files:
        if f.rows >= target_rows:
            continue  # already large enough
        if cur and (rows + f.rows > target_rows or size + f.size > target_bytes):
            groups.append(cur)
            cur, rows, size = [], 0, 0
        cur.append(f)
        rows += f.rows
        size += f.size
    groups.append(cur)
    return [g for g in groups if len(g) >= 2]


def _read_canonical(store: Store, schema: KindSchema, info: FileInfo) -> pa.Table:
    with store.fs.open(info.path, "rb") as fh:
        table = pq.read_table(fh, use_threads=False)
    arrow = schema.arrow()
    cols = []
    for f in arrow:
        if f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        else:  # an older minor version: the newer column is null, as a reader would see it
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=arrow)


def _read_group(store: Store, schema: KindSchema, group: list[FileInfo]) -> pa.Table:
    """The group's rows on the canonical schema, in file order; one native polars scan (per-file pyarrow reads cost ~2 ms a file)."""
    from mkb.events._reader import _scan_paths

    paths = [f.path for f in group]
    if not store.is_local:
        return pa.concat_tables([_read_canonical(store, schema, f) for f in group])
    try:
        import polars as pl

        # one chunk per column before Arrow: a table of 2,500 chunks (a chunk per file) took pyarrow ~10x longer to cast and write
        table = _scan_paths(store, schema, paths).collect().rechunk().to_arrow(compat_level=pl.CompatLevel.oldest())
    except Exception:
        missing = next((p for p in paths if not os.path.exists(p)), None)
        if missing:
            raise FileNotFoundError(2, "No such file or directory", missing) from None
        raise
    arrow = schema.arrow()
    return pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in arrow], schema=arrow)


def _dedupe(table: pa.Table) -> pa.Table:
    ids = table.column("event_id").combine_chunks()
    if len(ids) == len(ids.unique()):
        return table
    import pyarrow.compute as pc

    idx = table.append_column("_i", pa.array(range(table.num_rows), pa.int64())).group_by("event_id", use_threads=False).aggregate([("_i", "min")])
    keep = pc.sort_indices(idx.column("_i_min"))
    return table.take(pc.take(idx.column("_i_min"), keep))


def _delete(store: Store, path: str, *, sync: bool = True) -> None:
    if store.is_local:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return  # another compaction got there first
        if sync:
            _fsync_dir(os.path.dirname(path))
    else:
        try:
            store.fs.rm_file(path)
        except FileNotFoundError:
            pass


def _holder() -> str:
    import socket

    from mkb.events._ids import uuid7

    return f"{socket.gethostname()}:{os.getpid()}:{uuid7()[-8:]}"


def _shared_id_groups(store: Store, files: list[FileInfo]) -> list[list[FileInfo]]:
    """Groups of files that hold a common event_id (read from the event_id column of overlapping files only)."""
    import pyarrow.compute as pc

    out: list[list[FileInfo]] = []
    for group in overlap_groups(files):
        if len(group) < 2:
            continue
        ids, owner = [], []
        for n, f in enumerate(group):
            with store.fs.open(f.path, "rb") as fh:
                col = pq.read_table(fh, columns=["event_id"], use_threads=False).column("event_id").combine_chunks()
            ids.append(col)
            owner.append(pa.array([n] * len(col), pa.int32()))
        t = pa.table({"id": pa.concat_arrays(ids), "f": pa.concat_arrays(owner)})
        per = t.group_by("id").aggregate([("f", "count_distinct"), ("f", "distinct")])
        dup = per.filter(pc.greater(per.column("f_count_distinct"), 1))
        if dup.num_rows == 0:
            continue
        parent = list(range(len(group)))  # union-find over files sharing an id

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for fs_ in dup.column("f_distinct").to_pylist():
            for other in fs_[1:]:
                parent[find(other)] = find(fs_[0])
        comps: dict[int, list[FileInfo]] = {}
        for n, f in enumerate(group):
            comps.setdefault(find(n), []).append(f)
        out.extend(sorted(c, key=lambda f: f.name) for c in comps.values() if len(c) > 1)
    return out


def compact_kind(
    kind: str, store: str | Store | None = None, *, target_rows: int = DEFAULT_TARGET_ROWS,
    target_bytes: int = DEFAULT_TARGET_BYTES, grace_s: float = DEFAULT_GRACE_S, holder: str | None = None,
    lease_ttl_s: float = LEASE_TTL_S, on_step: Callable[[str, str], None] | None = None,
) -> CompactResult:
    """Compact one kind under its lease; returns at once (with `held_by`) when another compaction holds it.

    `on_step(step, path)` is called after each durable step ("written", "deleted").
    """
    store = resolve_store(store, for_writing=True)
    schema = schema_for(kind)
    import time

    for attempt in range(3):
        lease = Lease.acquire(store, f"compact/{kind}", holder=holder or _holder(), ttl_s=lease_ttl_s)
        if lease is not None:
            break
        held = Lease.peek(store, f"compact/{kind}")
        if held is not None:
            return CompactResult(kind=kind, held_by=held)
        time.sleep(0.05 * (attempt + 1))  # lost a race to an acquirer that backed off, or the holder just released: free again
    else:
        return CompactResult(kind=kind, held_by=LeaseInfo(f"compact/{kind}", "(contended)", 0, time.time()))
    try:
        return _compact_held(store, schema, lease, target_rows=target_rows, target_bytes=target_bytes, grace_s=grace_s, on_step=on_step)
    finally:
        lease.release()


def _compact_held(store: Store, schema: KindSchema, lease: Lease, *, target_rows: int, target_bytes: int, grace_s: float,
                  on_step: Callable[[str, str], None] | None) -> CompactResult:
    import time

    kind = schema.kind
    report = ScanReport()
    live = _check(store, kind, report, warn=False)
    result = CompactResult(kind=kind, skipped=dict(report.skipped))
    result.files_before = len(live) + len(report.superseded) + len(report.skipped)
    now = time.time()

    def deleted(path: str) -> None:
        # one directory fsync per batch, not per file: a deletion that is lost in a crash leaves a superseded file the next run deletes
        _delete(store, path, sync=on_step is not None)
        result.deleted.append(path)
        if on_step:
            on_step("deleted", path)

    from concurrent.futures import ThreadPoolExecutor

    unlinking: list = []  # deletions still running: the next group is read and written meanwhile

    def deleted_all(paths: list[str]) -> None:
        if on_step is not None or len(paths) < 16:
            for p in paths:
                deleted(p)
            return
        step = -(-len(paths) // 8)  # a slice per worker: a future per file cost more than the unlink
        unlinking.extend(deleter.submit(lambda k: [_delete(store, p, sync=False) for p in paths[k:k + step]], k) for k in range(0, len(paths), step))
        result.deleted.extend(paths)

    def synced() -> None:
        for f in unlinking:
            f.result()
        unlinking.clear()
        if store.is_local and result.deleted:
            _fsync_dir(store.kind_dir(kind))

    # sources already merged: delete those whose merged file is past the grace period
    merged_at = {}
    for info in live:
        for name in info.compacted_from:
            t = uuid7_time(info.name)
            merged_at[name] = min(merged_at.get(name, t or 0.0), t or 0.0)
    lease.renew()
    due = []
    for path in report.superseded:
        if now - merged_at.get(path.rsplit("/", 1)[-1], 0.0) >= grace_s:
            due.append(path)
        else:
            result.awaiting_grace.append(path)
    deleter = ThreadPoolExecutor(8, thread_name_prefix="mkb-compact-unlink")  # unlink waits on the filesystem's journal; a few at once hide that
    try:
        deleted_all(due)
        synced()
        return _merge(store, schema, lease, live, report, result, deleted_all, synced, target_rows=target_rows, target_bytes=target_bytes,
                      grace_s=grace_s, on_step=on_step)
    finally:
        deleter.shutdown(wait=True)


def _merge(store: Store, schema: KindSchema, lease: Lease, live: list[FileInfo], report: ScanReport, result: CompactResult, deleted_all, synced,
           *, target_rows: int, target_bytes: int, grace_s: float, on_step) -> CompactResult:
    """Merge the kind's small files group by group (the sources of a group are deleted now with grace 0, else by a later run)."""
    kind = schema.kind
    ours = []
    for f in live:
        major, minor = parse_version(f.version)
        if major < schema.major:
            result.skipped[f.path] = f"older major schema {f.version}: left as written (readers upcast it)"
        elif minor > schema.minor:
            result.skipped[f.path] = f"newer minor schema {f.version}: left as is so its newer columns survive"
        else:
            ours.append(f)
    heal = _shared_id_groups(store, ours)
    in_heal = {f.path for g in heal for f in g}
    groups = heal + plan_groups([f for f in ours if f.path not in in_heal], target_rows=target_rows, target_bytes=target_bytes)
    from concurrent.futures import ThreadPoolExecutor

    # the next group is read while this one is de-duplicated, written and its sources deleted: polars' read and
    # pyarrow's compression both run outside the GIL, so on two cores they overlap
    with ThreadPoolExecutor(1, thread_name_prefix="mkb-compact-read") as ahead:
        nxt = ahead.submit(_read_group, store, schema, groups[0]) if groups else None
        for i, group in enumerate(groups):
            current, nxt = nxt, (ahead.submit(_read_group, store, schema, groups[i + 1]) if i + 1 < len(groups) else None)
            try:
                raw = current.result()
            except FileNotFoundError as exc:  # a compaction of an older mkb (no lease) deleted it: leave the group for the next run
                result.skipped[str(exc.filename or group[0].path)] = "vanished while compacting (another compaction without a lease?); left for the next run"
                continue
            # rows of files whose event_id ranges do not overlap cannot repeat across them: de-duplicating is for overlapping ones
            table = _dedupe(raw) if any(len(g) > 1 for g in overlap_groups(group)) else raw
            result.healed += raw.num_rows - table.num_rows
            raw = current = None  # the future holds the rows too: let them go once merged
            meta = dict(table.schema.metadata or {})
            meta[META_COMPACTED_FROM] = json.dumps([f.name for f in group]).encode()
            meta[META_COMPACTION_TOKEN] = str(lease.token).encode()
            lease.renew()  # raises LeaseLost: a compaction that lost its lease writes nothing more
            merged = write_table(store, kind, table.replace_schema_metadata(meta))
            result.written.append(merged)
            result.rows += table.num_rows
            if on_step:
                on_step("written", merged)
            if grace_s <= 0:
                lease.renew()
                deleted_all([f.path for f in group])
            else:
                result.awaiting_grace.extend(f.path for f in group)
    synced()
    result.files_after = result.files_before - len(result.deleted) + len(result.written)
    _reindex(store, kind, result)
    return result


def _reindex(store: Store, kind: str, result: CompactResult) -> None:
    """Rewrite the kind's footer index for the files the compaction left (only the merged files' footers are parsed anew)."""
    from mkb.events import _index
    from mkb.events._reader import good_files

    try:
        _index.rewrite(store, kind, good_files(store, kind, ScanReport(), use_index=True))
    except Exception as exc:  # the index only spares readers footer reads; a compaction that merged files has done its job
        result.skipped.setdefault(_index.index_dir(store, kind), f"footer index not rewritten ({type(exc).__name__}: {exc})")


def clean_staging(store: str | Store | None = None, *, older_than_s: float = 3600.0) -> list[str]:
    """Remove staging files a killed writer left behind (local stores only); young ones may belong to a live writer."""
    import time

    store = resolve_store(store, for_writing=True)
    if not store.is_local or not os.path.isdir(store.staging_dir()):
        return []
    removed = []
    cutoff = time.time() - older_than_s
    for entry in os.scandir(store.staging_dir()):
        if entry.name.endswith(".partial") and entry.is_file() and entry.stat().st_mtime < cutoff:
            try:
                os.unlink(entry.path)
                removed.append(entry.path)
            except FileNotFoundError:
                pass
    return removed


def compact(
    store: str | Store | None = None, *, kinds: list[str] | None = None, target_rows: int = DEFAULT_TARGET_ROWS,
    grace_s: float = DEFAULT_GRACE_S, on_step: Callable[[str, str], None] | None = None,
) -> list[CompactResult]:
    """Compact every kind present in the store (or only `kinds`)."""
    from mkb.events._schema import schemas

    store = resolve_store(store, for_writing=True)
    out = []
    for k in kinds or store.kinds():
        if k not in schemas():
            out.append(CompactResult(kind=k, skipped={store.kind_dir(k): "unknown kind: no schema in this mkb, left as is"}))
            continue
        out.append(compact_kind(k, store, target_rows=target_rows, grace_s=grace_s, on_step=on_step))
    return out
