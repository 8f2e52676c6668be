"""Appends validated events to a store as immutable Parquet files, one per flush."""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

import mkb
from mkb.events._ids import uuid7
from mkb.events._schema import KindSchema, SchemaError, schema_for
from mkb.events._store import Store, resolve_store

_ENVELOPE_AUTO = ("event_id", "kind", "schema_version", "ts", "run_id", "seq", "writer", "mkb_version")


def _validate(schema: KindSchema, row: dict[str, Any]) -> None:
    unknown = set(row) - set(schema.names)
    if unknown:
        raise SchemaError(
            f"{schema.kind} event has unknown columns {sorted(unknown)}\n"
            f"hint: add them to schemas/{schema.kind}.json (a minor version bump) or drop them"
        )
    missing = [c.name for c in schema.columns if not c.nullable and row.get(c.name) is None]
    if missing:
        raise SchemaError(f"{schema.kind} event lacks required columns {missing}")


def rows_to_table(schema: KindSchema, rows: list[dict[str, Any]]) -> pa.Table:
    """Validate rows and convert them to a table of the canonical schema, or raise naming the bad row."""
    for i, row in enumerate(rows):
        _validate(schema, row)
    cols = {}
    arrow = schema.arrow()
    for field in arrow:
        values = [row.get(field.name) for row in rows]
        try:
            cols[field.name] = pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            bad = next((i for i, v in enumerate(values) if not _fits(v, field.type)), None)
            raise SchemaError(
                f"{schema.kind}.{field.name} expects {field.type}; row {bad} has {values[bad]!r}" if bad is not None
                else f"{schema.kind}.{field.name} expects {field.type}: {exc}"
            ) from None
    return pa.table(cols, schema=arrow)


def _fits(value, typ) -> bool:
    try:
        pa.array([value], type=typ)
        return True
    except Exception:
        return False


class EventWriter:
    """Buffers events of one writer session and flushes each kind to its own immutable file.

    Rows are validated when emitted, so a bad row raises at its call site and nothing of it is
    written; a flush writes every buffered kind or raises with the buffer intact.
    """

    def __init__(self, store: str | Store | None = None, *, run_id: str | None = None, flush_every: int = 10_000) -> None:
        self.store = store if isinstance(store, Store) else resolve_store(store, for_writing=True)
        self.run_id = run_id or uuid7()
        self.writer_id = f"{socket.gethostname()}:{os.getpid()}:{uuid7()[-8:]}"
        self.flush_every = flush_every
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._seq: dict[str | None, int] = {}
        self._lock = threading.Lock()
        self.files_written: list[str] = []

    def emit(self, kind: str, *, attempt_id: str | None = None, **payload: Any) -> str:
        """Buffer one event; returns its event_id."""
        schema = schema_for(kind)
        clash = set(payload) & set(_ENVELOPE_AUTO)
        if clash:
            raise SchemaError(f"envelope columns {sorted(clash)} are filled in by the writer; do not pass them")
        with self._lock:
            seq = self._seq.get(attempt_id, 0)
            row = {
                "event_id": uuid7(), "kind": kind, "schema_version": schema.version,
                "ts": dt.datetime.now(dt.timezone.utc), "run_id": self.run_id, "attempt_id": attempt_id,
                "seq": seq, "writer": self.writer_id, "mkb_version": mkb.__version__, **payload,
            }
            _validate(schema, row)
            rows_to_table(schema, [row])  # type-check now, so a bad value fails here and not at flush
            self._seq[attempt_id] = seq + 1
            self._buffers.setdefault(kind, []).append(row)
            full = sum(len(b) for b in self._buffers.values()) >= self.flush_every
        if full:
            self.flush()
        return row["event_id"]

    def emit_many(self, kind: str, rows: Iterable[dict[str, Any]]) -> int:
        """Buffer many events of one kind (each row's attempt_id may be given in it)."""
        n = 0
        for row in rows:
            row = dict(row)
            self.emit(kind, attempt_id=row.pop("attempt_id", None), **row)
            n += 1
        return n

    def flush(self) -> list[str]:
        """Write each buffered kind as one new file; returns the paths written."""
        with self._lock:
            buffers, self._buffers = self._buffers, {}
        written = []
        try:
            while buffers:
                kind, rows = next(iter(buffers.items()))
                table = rows_to_table(schema_for(kind), rows)
                written.append(write_table(self.store, kind, table))
                del buffers[kind]
        finally:
            if buffers:  # put back what was not written, ahead of anything emitted meanwhile
                with self._lock:
                    for kind, rows in buffers.items():
                        self._buffers[kind] = rows + self._buffers.get(kind, [])
        self.files_written += written
        return written

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_table(store: Store, kind: str, table: pa.Table, *, name: str | None = None) -> str:
    """Write `table` as one new immutable file under kind=<kind>/; never overwrites.

    Local disk: written in a staging folder beside the dataset, fsynced, then renamed into place
    (rename is atomic on one filesystem), and the folder fsynced. Object stores: one exclusive PUT.
    """
    name = name or f"{uuid7()}.parquet"
    target = f"{store.kind_dir(kind)}/{name}"
    if store.is_local:
        staging = store.staging_dir()
        os.makedirs(staging, exist_ok=True)
        os.makedirs(store.kind_dir(kind), exist_ok=True)
        tmp = os.path.join(staging, name)
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(target):
            os.unlink(tmp)
            raise FileExistsError(f"event file {target} already exists; mkb never overwrites")
        os.link(tmp, target)  # fails if target exists: an exclusive create
        os.unlink(tmp)
        dfd = os.open(store.kind_dir(kind), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    else:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue().to_pybytes()
        store.fs.makedirs(store.kind_dir(kind), exist_ok=True)
        with store.fs.open(target, "xb") as f:
            f.write(data)
    return target
