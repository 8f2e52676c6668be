"""Merges a kind's small event files into larger ones without changing what readers see.

Order of steps, each safe to be killed after: (1) the merged file is published atomically (its
footer lists the sources in `mkb.compacted_from`); readers from then on skip those sources, and
row-level de-duplication on event_id would hide them anyway; (2) the sources are deleted one by
one. A compaction killed after (1) leaves sources that readers ignore and the next compaction
deletes; killed before (1), it changed nothing. Two compactions at once produce two merged copies,
hidden by de-duplication and merged by the next run. Files of a newer minor schema are left alone:
rewriting them on this mkb's schema would drop their newer columns.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from mkb.events._commit import _fsync_dir
from mkb.events._reader import FileInfo, ScanReport, _check
from mkb.events._schema import META_COMPACTED_FROM, KindSchema, parse_version, schema_for
from mkb.events._store import Store, resolve_store
from mkb.events._writer import write_table

DEFAULT_TARGET_ROWS = 250_000
DEFAULT_TARGET_BYTES = 256 * 2**20


@dataclass
class CompactResult:
    """What one kind's compaction did."""

    kind: str
    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


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
        table = pq.read_table(fh)
    arrow = schema.arrow()
    cols = []
    for f in arrow:
        if f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        else:  # an older minor version: the newer column is null, as a reader would see it
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=arrow)


def _dedupe(table: pa.Table) -> pa.Table:
    ids = table.column("event_id").combine_chunks()
    if len(ids) == len(ids.unique()):
        return table
    import pyarrow.compute as pc

    idx = table.append_column("_i", pa.array(range(table.num_rows), pa.int64())).group_by("event_id", use_threads=False).aggregate([("_i", "min")])
    keep = pc.sort_indices(idx.column("_i_min"))
    return table.take(pc.take(idx.column("_i_min"), keep))


def _delete(store: Store, path: str) -> None:
    if store.is_local:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return  # another compaction got there first
        _fsync_dir(os.path.dirname(path))
    else:
        try:
            store.fs.rm_file(path)
        except FileNotFoundError:
            pass


def compact_kind(
    kind: str, store: str | Store | None = None, *, target_rows: int = DEFAULT_TARGET_ROWS,
    target_bytes: int = DEFAULT_TARGET_BYTES, on_step: Callable[[str, str], None] | None = None,
) -> CompactResult:
    """Compact one kind. `on_step(step, path)` is called after each durable step ("written", "deleted")."""
    store = resolve_store(store, for_writing=True)
    schema = schema_for(kind)
    report = ScanReport()
    live = _check(store, kind, report, warn=False)
    result = CompactResult(kind=kind, skipped=dict(report.skipped))
    result.files_before = len(live) + len(report.superseded)
    # sources already merged (an earlier compaction was interrupted before deleting them): just finish the job
    for path in report.superseded:
        _delete(store, path)
        result.deleted.append(path)
        if on_step:
            on_step("deleted", path)
    same_minor = [f for f in live if parse_version(f.version)[1] <= schema.minor]
    for f in live:
        if f not in same_minor:
            result.skipped[f.path] = f"newer minor schema {f.version}: left as is so its newer columns survive"
    for group in plan_groups(same_minor, target_rows=target_rows, target_bytes=target_bytes):
        table = _dedupe(pa.concat_tables([_read_canonical(store, schema, f) for f in group]))
        meta = dict(table.schema.metadata or {})
        meta[META_COMPACTED_FROM] = json.dumps([f.name for f in group]).encode()
        merged = write_table(store, kind, table.replace_schema_metadata(meta))
        result.written.append(merged)
        result.rows += table.num_rows
        if on_step:
            on_step("written", merged)
        for f in group:
            _delete(store, f.path)
            result.deleted.append(f.path)
            if on_step:
                on_step("deleted", f.path)
    result.files_after = result.files_before - len(result.deleted) + len(result.written)
    return result


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
    on_step: Callable[[str, str], None] | None = None,
) -> list[CompactResult]:
    """Compact every kind present in the store (or only `kinds`)."""
    from mkb.events._schema import schemas

    store = resolve_store(store, for_writing=True)
    out = []
    for k in kinds or store.kinds():
        if k not in schemas():
            out.append(CompactResult(kind=k, skipped={store.kind_dir(k): "unknown kind: no schema in this mkb, left as is"}))
            continue
        out.append(compact_kind(k, store, target_rows=target_rows, on_step=on_step))
    return out
