"""Appends validated events to a store as immutable Parquet files, one per flush.

Imports only pyarrow and fsspec (no polars): the GPU host that grades kernels writes events too and has no polars.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from mkb.events._commit import commit
from mkb.events._envelope import DEFAULT_BLOCK, Envelope, SeqBlock
from mkb.events._ids import uuid7
from mkb.events._schema import META_KIND, KindSchema, SchemaError, schema_for
from mkb.events._store import Store, resolve_store
from mkb.events._validate import check_row, remember_shape, seen_shape



def rows_to_table(schema: KindSchema, rows: list[dict[str, Any]]) -> pa.Table:
    """Checked rows as a table of the canonical schema: pyarrow's from_pylist (C++), column by column only to name a bad column."""
    arrow = schema.arrow()
    try:
        return pa.Table.from_pylist(rows, schema=arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass  # find and name the column below
    cols = []
    for field in arrow:
        name = field.name
        try:
            values = [row.get(name) for row in rows]
            if name == "ts" and type(values[0]) is int:  # the writer's own stamp: int microseconds, 50x cheaper than datetimes
                cols.append(pa.array(values, type=pa.int64()).cast(field.type))
            else:
                cols.append(pa.array(values, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise SchemaError(f"{schema.kind}.{name} expects {field.type}: {exc}") from None
    return pa.Table.from_arrays(cols, schema=arrow)


ROW_GROUP_SIZE = 1 << 20
COMPRESSION = "zstd"


# A buffered event is a row dict, or, for a payload of a shape already checked (the per-event path of
# emit), the flat tuple (payload keys, event_id, ts, seq, *payload values), the keys one tuple shared by
# the shape: building no dict per event, holding one object per event (the garbage collector walks what
# is held: two objects per event cost emit a quarter more) and converting column by column at flush
# cost less than the dict rows a plain loop hands to from_pylist.
_Entry = dict[str, Any] | tuple[Any, ...]


def _entries_to_table(schema: KindSchema, entries: list[_Entry], env: Envelope) -> pa.Table:
    """Buffered entries (see _Entry) as one table of the canonical schema, in the order they were buffered."""
    if all(type(e) is dict for e in entries):
        return rows_to_table(schema, entries)
    groups: dict[tuple[str, ...] | None, list[int]] = {}
    for i, e in enumerate(entries):
        groups.setdefault(None if type(e) is dict else e[0], []).append(i)
    arrow = schema.arrow()
    const = env.constants(schema.kind, schema.version)
    tables, order = [], []
    for keys, idx in groups.items():
        if keys is None:
            tables.append(rows_to_table(schema, [entries[i] for i in idx]))
        else:
            tables.append(_tuples_to_table(arrow, keys, [entries[i] for i in idx], const))
        order.extend(idx)
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if len(tables) > 1:
        import pyarrow.compute as pc

        table = table.take(pc.sort_indices(pa.array(order, pa.int64())))
    return table


def _tuples_to_table(arrow: pa.Schema, keys: tuple[str, ...], entries: list[_Entry], const: dict[str, Any]) -> pa.Table:
    """Entries of one payload shape, column by column; the envelope's constant columns are one value repeated."""
    n = len(entries)
    _, event_ids, ts, seqs, *values = zip(*entries)
    by_key = dict(zip(keys, values))
    cols = []
    for field in arrow:
        name = field.name
        if name in by_key:
            col = pa.array(by_key[name], type=field.type)
        elif name in const:
            col = pa.array([const[name]] * n, type=field.type)
        elif name == "event_id":
            col = pa.array(event_ids, type=field.type)
        elif name == "ts":
            col = pa.array(ts, type=pa.int64()).cast(field.type)
        elif name == "seq":
            col = pa.array(seqs, type=field.type)
        else:
            col = pa.nulls(n, field.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=arrow)


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=COMPRESSION, row_group_size=ROW_GROUP_SIZE)
    return sink.getvalue().to_pybytes()


def write_table(store: str | Store | None, kind: str, table: pa.Table, *, name: str | None = None) -> str:
    """Write `table` as one new immutable file `kind=<kind>/<uuid7>.parquet`; never overwrites.

    The table's schema metadata must name `kind` (mkb.kind): the reader trusts the footer, not the folder.
    """
    store = resolve_store(store, for_writing=True)
    meta = table.schema.metadata or {}
    if meta.get(META_KIND, b"").decode() != kind:
        raise SchemaError(f"table metadata names kind {meta.get(META_KIND)!r}, not {kind!r}\nhint: build it with rows_to_table or schema_for(kind).arrow()")
    name = name or f"{uuid7()}.parquet"
    target = f"{store.kind_dir(kind)}/{name}"
    commit(store, target, table_bytes(table))
    return target


_open_writers: "weakref.WeakSet[EventWriter]" = weakref.WeakSet()


@atexit.register
def _flush_open_writers() -> None:
    # a normal interpreter exit must not lose buffered events; a killed process loses only its unflushed buffer
    for w in list(_open_writers):
        try:
            w.flush()
        except Exception:
            pass


class EventWriter:
    """Buffers events of one writer session and flushes each kind to its own immutable file.

    Rows are checked when emitted, so a bad row raises at its call site and nothing of it is
    buffered; `emit_many` checks the whole batch before buffering any of it. A flush writes every
    buffered kind or raises with the unwritten buffers intact.

    A flush happens every `flush_every` events, and with `flush_after_s` also when the oldest
    buffered event is that old (so an experiment's events are durable within seconds without a file
    per event); with `compact_every_s` the kinds this writer wrote are compacted in the background
    (under the per-kind lease, so many writers may ask for it), keeping a long run's file count bounded.
    """

    def __init__(self, store: str | Store | None = None, *, run_id: str | None = None, flush_every: int = 10_000,
                 flush_after_s: float | None = None, compact_every_s: float | None = None) -> None:
        self.store = resolve_store(store, for_writing=True)
        self._env = Envelope(run_id=run_id)
        self.run_id = self._env.run_id
        self.writer_id = self._env.writer
        self.flush_every = flush_every
        self.flush_after_s = flush_after_s
        self._buffers: dict[str, list[_Entry]] = {}
        self._n_buffered = 0
        self._oldest: float | None = None  # monotonic time of the oldest buffered event
        self._lock = self._env.lock  # one lock for seq and buffers: reserve_seq/adopt_seq take it too
        self._flush_lock = threading.Lock()
        self._pending: list[tuple[str, str, bytes, int]] = []  # (kind, target, bytes, rows) cut but not yet published
        self.files_written: list[str] = []
        self.flush_errors: list[str] = []  # background flushes that failed (the events stay buffered and are retried)
        _open_writers.add(self)
        self._stop = threading.Event()
        self._background: list[threading.Thread] = []
        if flush_after_s is not None:
            self._start(self._age_loop, "mkb-events-flush")
        if compact_every_s is not None:
            self._compact_every_s = compact_every_s
            self._start(self._compact_loop, "mkb-events-compact")

    def _start(self, fn, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._background.append(t)

    def _age_loop(self) -> None:
        """Every event is durable within flush_after_s: flush when the oldest buffered one is that old."""
        period = max(0.05, self.flush_after_s / 4)
        while not self._stop.wait(period):
            oldest = self._oldest
            if (oldest is not None and time.monotonic() - oldest >= self.flush_after_s) or self._pending:
                try:
                    self.flush()
                except Exception as exc:  # a full disk or a network error: the rows stay buffered and the next tick retries
                    self.flush_errors.append(f"{type(exc).__name__}: {exc}")

    def _compact_loop(self) -> None:
        """Compaction in the background of a run keeps the file count bounded; its lease keeps hosts from compacting one kind at once."""
        from mkb.events._compact import compact

        while not self._stop.wait(self._compact_every_s):
            try:
                compact(self.store, kinds=sorted(self._kinds_written))
            except Exception as exc:
                self.flush_errors.append(f"compaction: {type(exc).__name__}: {exc}")

    @property
    def _kinds_written(self) -> set[str]:
        return {p.rsplit("/", 2)[-2][len("kind="):] for p in self.files_written}

    def reserve_seq(self, attempt_id: str, n: int = DEFAULT_BLOCK) -> SeqBlock:
        """Seq numbers for events of `attempt_id` that another host will write (pass the block with the job; it calls `adopt_seq`)."""
        return self._env.reserve(attempt_id, n)

    def adopt_seq(self, block: SeqBlock) -> None:
        """Number this writer's events of `block.attempt_id` from a block the attempt's own writer reserved."""
        self._env.adopt(block)

    def _buffer(self, kind: str, rows: list[dict[str, Any]]) -> None:
        with self._lock:  # the envelope's lock: seq and buffer change together, so a batch stays contiguous
            take = self._env.take
            for row in rows:
                row["seq"] = take(row["attempt_id"])
            self._buffers.setdefault(kind, []).extend(rows)
            self._n_buffered += len(rows)
            if self._oldest is None:
                self._oldest = time.monotonic()
            full = self._n_buffered >= self.flush_every
        if full:
            self.flush()

    def emit(self, kind: str, *, attempt_id: str | None = None, **payload: Any) -> str:
        """Buffer one event; returns its event_id. Raises SchemaError here, at the call site, for a bad row.

        The per-event path does little more than a plain loop building the same dict would: a
        payload of a shape (keys and value types) seen before is checked only for its int ranges
        (mkb.events._validate.seen_shape) and buffered as its values, with the envelope columns that
        vary per event; flush lays them out column by column (see _Entry).
        """
        schema = schema_for(kind)
        if attempt_id is not None:
            payload["attempt_id"] = attempt_id  # `payload` is this call's own dict: type-check attempt_id with it
        keys = seen_shape(schema, payload)
        if keys is not None:
            event_id = self._env.event_id()
            ts = time.time_ns() // 1000
            with self._lock:
                buf = self._buffers.get(kind)
                if buf is None:
                    buf = self._buffers[kind] = []
                buf.append((keys, event_id, ts, self._env.take(attempt_id), *payload.values()))
                self._n_buffered = n = self._n_buffered + 1
                if self._oldest is None:
                    self._oldest = time.monotonic()
            if n >= self.flush_every:
                self.flush()
            return event_id
        self._env.check_payload(payload)  # attempt_id is not an envelope column the writer fills
        row = self._env.row(kind, schema.version, attempt_id, payload, time.time_ns() // 1000)
        check_row(schema, row, where="event", user=payload)  # may serialise a JSON column into row
        remember_shape(schema, payload)
        self._buffer(kind, [row])
        return row["event_id"]

    def emit_many(self, kind: str, rows: Iterable[dict[str, Any]]) -> list[str]:
        """Buffer a batch of one kind (each row may carry its attempt_id); all rows are checked before any is buffered.

        The caller's dicts are not changed; a row of a shape already checked takes emit's fast path.
        """
        schema = schema_for(kind)
        ts = time.time_ns() // 1000
        built: list = []
        for i, payload in enumerate(rows):
            keys = seen_shape(schema, payload)
            if keys is not None:
                built.append((keys, payload, self._env.event_id(), payload.get("attempt_id")))
                continue
            user = dict(payload)
            attempt_id = user.pop("attempt_id", None)
            self._env.check_payload(user)
            row = self._env.row(kind, schema.version, attempt_id, user, ts)
            if attempt_id is not None:
                user["attempt_id"] = attempt_id
            check_row(schema, row, where=f"row {i}", user=user)
            remember_shape(schema, payload)
            built.append(row)
        with self._lock:  # seq and buffer change together, so a batch stays contiguous
            take = self._env.take
            entries = []
            for item in built:
                if type(item) is dict:
                    item["seq"] = take(item["attempt_id"])
                    entries.append(item)
                else:
                    keys, payload, event_id, attempt_id = item
                    entries.append((keys, event_id, ts, take(attempt_id), *payload.values()))
            self._buffers.setdefault(kind, []).extend(entries)
            self._n_buffered += len(entries)
            if self._oldest is None:
                self._oldest = time.monotonic()
            full = self._n_buffered >= self.flush_every
        if full:
            self.flush()
        return [e["event_id"] if type(e) is dict else e[2] for e in built]

    def flush(self) -> list[str]:
        """Write each buffered kind as one new file; returns the paths written.

        Each batch gets its file name and bytes once; a batch whose publish failed is retried
        under the same name at the next flush, and a FileExistsError holding the same bytes counts
        as done. So a PUT that landed although the client saw a timeout is not written twice.
        """
        with self._flush_lock:
            with self._lock:
                buffers, self._buffers, self._n_buffered, oldest, self._oldest = self._buffers, {}, 0, self._oldest, None
            cut = []
            try:
                for kind, rows in buffers.items():
                    data = table_bytes(_entries_to_table(schema_for(kind), rows, self._env))
                    cut.append((kind, f"{self.store.kind_dir(kind)}/{uuid7()}.parquet", data, len(rows)))
            except BaseException:
                with self._lock:  # nothing of this flush was cut: put every row back, ahead of newer ones
                    for kind, rows in buffers.items():
                        self._buffers[kind] = rows + self._buffers.get(kind, [])
                        self._n_buffered += len(rows)
                    if buffers:
                        self._oldest = oldest
                raise
            self._pending += cut
            written = []
            while self._pending:
                kind, target, data, _ = self._pending[0]
                try:
                    commit(self.store, target, data)
                except FileExistsError:
                    if self.store.fs.cat_file(target) != data:
                        raise
                written.append(target)
                self._pending.pop(0)
                self.files_written.append(target)
            return written

    @property
    def pending_events(self) -> int:
        """Events buffered or in batches whose publish has not succeeded yet."""
        return self._n_buffered + sum(p[3] for p in self._pending)

    def close(self) -> None:
        self._stop.set()
        for t in self._background:
            t.join()
        self.flush()
        _open_writers.discard(self)

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
