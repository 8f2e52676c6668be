"""Appends validated events to a store as immutable Parquet files, one per flush.

Imports only pyarrow and fsspec (no polars): the GPU host that grades kernels writes events too and has no polars.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import deque
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from mkb.events._commit import commit
from mkb.events._envelope import DEFAULT_BLOCK, Envelope, SeqBlock
from mkb.events._ids import uuid7, uuid7_block
from mkb.events._schema import META_KIND, KindSchema, SchemaError, schema_for
from mkb.events._store import Store, resolve_store
from mkb.events._validate import _INT64_MAX, _INT64_MIN, _SHAPE_TYPES, check_row



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
_ID_BLOCK_MAX = 1024
COMPRESSION = "zstd"


# Buffered events of one kind are a list of segments (keys, entries) in emit order. A payload of a shape already
# checked (the per-event path of emit) is buffered in a segment whose keys are the shape's keys (one tuple shared by
# the shape) as a flat run of values in one list: event_id, ts, seq, then the payload's values, 3 + len(keys) per
# event. No object outlives an emit (a tuple or dict per event kept the garbage collector walking ~0.2 us an event),
# and at flush each column is one strided slice of the list converted by pyarrow, cheaper than the dict rows a plain
# loop hands to from_pylist. A row checked in full is a dict in a segment with keys None.
_Segment = tuple["tuple[str, ...] | None", list]
_ENTRY = ("event_id", "ts", "seq")  # what a flat entry holds before the payload's values


def _segment_events(seg: _Segment) -> int:
    keys, entries = seg
    return len(entries) if keys is None else len(entries) // (len(_ENTRY) + len(keys))


def _segments_to_table(schema: KindSchema, segments: list[_Segment], env: Envelope) -> pa.Table:
    """Buffered segments (see _Segment) as one table of the canonical schema, in the order they were buffered."""
    const = env.constants(schema.kind, schema.version)
    tables = [rows_to_table(schema, rows) if keys is None else _flat_to_table(schema, keys, rows, const) for keys, rows in segments]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _flat_to_table(schema: KindSchema, keys: tuple[str, ...], flat: list, const: dict[str, Any]) -> pa.Table:
    """A flat segment's columns, each one strided slice; the envelope's constant columns are one value repeated.

    `ts` is the writer's integer microseconds, which pyarrow takes as the timestamp's value.
    """
    arrow = schema.arrow()
    width = len(_ENTRY) + len(keys)
    n = len(flat) // width
    at = {name: j for j, name in enumerate(_ENTRY + keys)}
    cols = []
    for field in arrow:
        j = at.get(field.name)
        if j is not None:
            cols.append(pa.array(flat[j::width], type=field.type))
        elif field.name in const:
            cols.append(pa.repeat(pa.scalar(const[field.name], field.type), n))
        else:
            cols.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(cols, schema=arrow)


# Envelope columns that differ on (nearly) every row: a dictionary page of them is pure overhead (a file of 10k events
# written with one cost ~15% more CPU and ~20% more bytes), so they are written plain; every other column keeps its
# dictionary (seq too: small per-attempt counters repeat across attempts, and its dictionary made files smaller).
_UNIQUE_COLUMNS = frozenset({"event_id", "ts"})


def _dictionary_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths to dictionary-encode: every leaf but the unique envelope columns' (~10 us a file; not
    cached, since a compacted file's schema carries its sources' names in its metadata)."""
    return [f"{f.name}.list.element" if pa.types.is_list(f.type) else f.name for f in schema if f.name not in _UNIQUE_COLUMNS]


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=COMPRESSION, row_group_size=ROW_GROUP_SIZE, use_dictionary=_dictionary_paths(table.schema))
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
_busy: "set[EventWriter]" = set()  # writers with batches handed to their publisher and not yet published
_all_writers: "weakref.WeakSet[EventWriter]" = weakref.WeakSet()


def _drop_id_blocks() -> None:
    # a forked child must not hand out the rest of its parent's blocks of ids: both processes would write them
    for w in list(_all_writers):
        w._ids = iter(())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_id_blocks)


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

    A flush that `flush_every` triggers is handed to a publisher thread, so the caller goes on
    emitting while the batch is encoded, fsynced and published (encoding and fsync release the
    GIL); at most `_MAX_CUTS` batches wait, beyond that the caller publishes them itself. An
    explicit `flush()` or `close()` publishes everything before it returns and raises what failed;
    after a background publish failed, the next size-triggered flush runs in the caller and raises
    there, as it did before there was a publisher.
    """

    _MAX_CUTS = 2  # batches cut and waiting for the publisher before emit publishes in the caller

    def __init__(self, store: str | Store | None = None, *, run_id: str | None = None, flush_every: int = 10_000,
                 flush_after_s: float | None = None, compact_every_s: float | None = None) -> None:
        self.store = resolve_store(store, for_writing=True)
        self._env = Envelope(run_id=run_id)
        self.run_id = self._env.run_id
        self.writer_id = self._env.writer
        self.flush_every = flush_every
        self.flush_after_s = flush_after_s
        self._buffers: dict[str, list[_Segment]] = {}
        self._tail: dict[str, _Segment] = {}  # each kind's last segment
        self._n_buffered = 0
        self._oldest: float | None = None  # monotonic time of the oldest buffered event
        self._lock = self._env.lock  # one lock for seq, buffers and cuts: reserve_seq/adopt_seq take it too
        self._flush_lock = threading.Lock()  # one batch is converted and published at a time, in the order it was cut
        self._cuts: deque[tuple[dict[str, list[_Segment]], int]] = deque()  # (buffers, events) cut, not yet converted
        self._pending: list[tuple[str, str, bytes, int]] = []  # (kind, target, bytes, rows) converted but not yet published
        self._shapes: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, ...], dict]] = {}  # (kind, keys) -> (keys, {types: int columns}); see _shape
        self._last_shape: tuple | None = None  # (kind, keys, [value types], int columns) of the last fast-path emit
        self._seq_next, self._seq_blocks = self._env._next, self._env._blocks  # the envelope's seq counters (mutated in place, never replaced)
        self._ids: Iterator[str] = iter(())  # the rest of this writer's block of event ids (see _refill_ids)
        self._ids_until = 0  # ts (microseconds) from which the block is stale
        self._id_block = 1  # the current block's length
        self.files_written: list[str] = []
        self.flush_errors: list[str] = []  # background flushes that failed (the events stay buffered and are retried)
        _open_writers.add(self)
        _all_writers.add(self)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._publisher: threading.Thread | None = None
        self._background_failed = False
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
            if (oldest is not None and time.monotonic() - oldest >= self.flush_after_s) or self._pending or self._cuts:
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

    def _shape(self, kind: str, keys: tuple[str, ...], types: tuple[type, ...]) -> tuple | None:
        """(kind, keys, types, int columns) when a payload of these keys and exact value types passed check_row in this writer before; else None.

        For str, bool, float, int and None the verdict of check_row depends only on the column and the
        value's type (an int also on its range, which the caller checks); anything else (dicts for
        JSON, lists, datetimes, numpy scalars) always takes the full check. `keys` in the result is the
        one tuple the shape's buffered segments share.
        """
        hit = self._shapes.get((kind, keys))
        if hit is None:
            return None
        ints = hit[1].get(types)
        return None if ints is None else (kind, hit[0], types, ints)

    def _fast_keys(self, kind: str, payload: dict[str, Any]) -> tuple[str, ...] | None:
        """The shape's shared keys when `payload` may skip the full check (see _shape) and its ints are in range; else None."""
        shape = self._shape(kind, tuple(payload), tuple(map(type, payload.values())))
        if shape is None:
            return None
        for name in shape[3]:
            if not _INT64_MIN <= payload[name] <= _INT64_MAX:
                return None
        return shape[1]

    def _remember(self, kind: str, payload: dict[str, Any]) -> None:
        """Record that `payload` passed check_row, when its verdict is decided by its keys and value types (see _shape)."""
        types = tuple(map(type, payload.values()))
        if not _SHAPE_TYPES.issuperset(types):
            return
        key = (kind, tuple(payload))
        hit = self._shapes.get(key)
        if hit is None:
            if len(self._shapes) > 1_000:  # a caller varying keys without end must not grow this
                self._shapes.clear()
            hit = self._shapes[key] = (key[1], {})
        if len(hit[1]) < 256:
            hit[1][types] = tuple(n for n, t in zip(key[1], types) if t is int)

    def _next_id(self, ts: int) -> str:
        """The next event_id of this writer's block of uuid7s (see _refill_ids); the caller holds `_lock`."""
        event_id = next(self._ids, None)
        if event_id is None or ts >= self._ids_until:
            event_id = self._refill_ids(event_id is None)
        return event_id

    def _refill_ids(self, used_up: bool) -> str:
        """A fresh block of ids, returning its first; the caller holds `_lock`.

        Ids come from blocks (uuid7_block: one f-string per id costs ~0.9 us, an id of a block ~0.2),
        taken in emit order under the writer's lock, so a writer's ids increase in the order its events
        are buffered. A block is dropped once the clock has left its millisecond, so an event's id
        carries the millisecond it was emitted in. The block size follows the rate: it doubles when a
        block was used up within its millisecond and halves when the clock left one with ids unused
        (sizing it to the last millisecond's count instead dropped more: a block starts mid-millisecond).
        """
        k = min(self._id_block * 2, _ID_BLOCK_MAX) if used_up else max(self._id_block // 2, 1)
        ms, ids = uuid7_block(k)
        self._id_block = len(ids)  # fewer than k when the millisecond's counters ran out
        self._ids_until = (ms + 1) * 1000  # ts is in microseconds
        it = self._ids = iter(ids)
        return next(it)

    def _buffer(self, kind: str, row: dict[str, Any]) -> None:
        """Buffer one row checked in full, numbering its seq and event_id."""
        with self._lock:  # the envelope's lock: seq, ids and buffer change together, so a batch stays contiguous
            row["seq"] = self._env.take(row["attempt_id"])
            row["event_id"] = self._next_id(row["ts"])
            seg = self._tail.get(kind)
            (seg[1] if seg is not None and seg[0] is None else self._segment(kind, None)).append(row)
            self._n_buffered += 1
            if self._oldest is None:
                self._oldest = time.monotonic()
            full = self._n_buffered >= self.flush_every
        if full:
            self._flush_full()

    def emit(self, kind: str, /, **payload: Any) -> str:
        """Buffer one event (`attempt_id=` among its columns); returns its event_id. Raises SchemaError here, at the call site, for a bad row.

        The per-event path does little more than a plain loop building the same dict would: a
        payload of the shape (keys and value types) this writer saw last, or of one it saw before,
        is checked only for its int ranges (see _shape) and appended as its values, with the
        envelope columns that vary per event, to its shape's flat segment (see _Segment); flush
        converts them column by column. `kind` is positional-only, so the caller's keywords become
        the payload dict without being matched against named parameters one by one.
        """
        keys = tuple(payload)
        types = list(map(type, payload.values()))  # (a list: list(map()) is cheaper than tuple(map()), which builds a list first)
        last = self._last_shape
        if last is None or last[2] != types or last[1] != keys or last[0] != kind:
            last = self._shape(kind, keys, tuple(types))
            if last is not None:
                last = self._last_shape = (kind, last[1], types, last[3])
        if last is not None:
            for name in last[3]:
                if not _INT64_MIN <= payload[name] <= _INT64_MAX:
                    break
            else:
                ts = time.time_ns() // 1000
                attempt_id = payload.get("attempt_id")
                lock = self._lock
                lock.acquire()  # (not `with`: its two method lookups cost as much as the lock itself)
                try:
                    event_id = next(self._ids, None)  # _next_id, inline
                    if event_id is None or ts >= self._ids_until:
                        event_id = self._refill_ids(event_id is None)
                    if self._seq_blocks:
                        seq = self._env.take(attempt_id)
                    else:  # Envelope.take without a block adopted, inline: a call per event costs as much as the rest of this block
                        counters = self._seq_next
                        seq = counters.get(attempt_id, 0)
                        counters[attempt_id] = seq + 1
                    seg = self._tail.get(kind)
                    # one extend, so the flat segment never holds part of an event; a new segment sets _oldest
                    (seg[1] if seg is not None and seg[0] is last[1] else self._segment(kind, last[1])).extend((event_id, ts, seq, *payload.values()))
                    self._n_buffered = n = self._n_buffered + 1
                finally:
                    lock.release()
                if n >= self.flush_every:
                    self._flush_full()
                return event_id
        schema = schema_for(kind)
        user = dict(payload)  # the caller's key order stays as given: it is what the next emit's shape is compared with
        attempt_id = user.pop("attempt_id", None)
        self._env.check_payload(user)  # attempt_id is not an envelope column the writer fills
        row = self._env.row(kind, schema.version, attempt_id, user, time.time_ns() // 1000, event_id="")  # its id is drawn when it is buffered
        check_row(schema, row, where="event", user=payload)  # attempt_id type-checked with the caller's values; may serialise a JSON column into row
        self._remember(kind, payload)
        self._buffer(kind, row)
        return row["event_id"]

    def emit_many(self, kind: str, rows: Iterable[dict[str, Any]]) -> list[str]:
        """Buffer a batch of one kind (each row may carry its attempt_id); all rows are checked before any is buffered.

        The caller's dicts are not changed; a row of a shape already checked takes emit's fast path.
        """
        schema = schema_for(kind)
        ts = time.time_ns() // 1000
        built: list = []
        fast = self._fast_keys
        for i, payload in enumerate(rows):
            keys = fast(kind, payload)
            if keys is not None:
                built.append((keys, payload))
                continue
            user = dict(payload)
            attempt_id = user.pop("attempt_id", None)
            self._env.check_payload(user)
            row = self._env.row(kind, schema.version, attempt_id, user, ts, event_id="")
            if attempt_id is not None:
                user["attempt_id"] = attempt_id
            check_row(schema, row, where=f"row {i}", user=user)
            self._remember(kind, payload)
            built.append(row)
        ids = []
        with self._lock:  # seq, ids and buffer change together, so a batch stays contiguous
            take, next_id = self._env.take, self._next_id
            # every seq first: a seq block that runs out (SeqExhausted) raises before any row is buffered
            seqs = [take(item["attempt_id"] if type(item) is dict else item[1].get("attempt_id")) for item in built]
            for item, seq in zip(built, seqs):
                event_id = next_id(ts)
                if type(item) is dict:
                    item["seq"] = seq
                    item["event_id"] = event_id
                    seg = self._tail.get(kind)
                    (seg[1] if seg is not None and seg[0] is None else self._segment(kind, None)).append(item)
                else:
                    keys, payload = item
                    seg = self._tail.get(kind)
                    (seg[1] if seg is not None and seg[0] is keys else self._segment(kind, keys)).extend((event_id, ts, seq, *payload.values()))
                ids.append(event_id)
            self._n_buffered += len(built)
            if self._oldest is None:
                self._oldest = time.monotonic()
            full = self._n_buffered >= self.flush_every
        if full:
            self._flush_full()
        return ids

    def _segment(self, kind: str, keys: tuple[str, ...] | None) -> list:
        """A new last segment of `kind` for entries of `keys` (None: row dicts); the caller holds `_lock`."""
        seg = self._tail[kind] = (keys, [])
        self._buffers.setdefault(kind, []).append(seg)
        if self._oldest is None:  # the first event since the last cut: every kind's tail starts empty after one
            self._oldest = time.monotonic()
        return seg[1]

    def _cut(self) -> None:
        """Move the buffers into the queue of batches to publish; the caller holds `_lock`."""
        if self._n_buffered:
            self._cuts.append((self._buffers, self._n_buffered))
        self._buffers, self._tail, self._n_buffered, self._oldest = {}, {}, 0, None

    def _flush_full(self) -> None:
        """A size-triggered flush: hand the batch to the publisher thread, or publish in the caller when it is behind or failed."""
        if self._background_failed or self._stop.is_set():
            self.flush()  # raises here, at a call site, what the publisher could not write
            return
        with self._lock:
            if self._n_buffered < self.flush_every:  # another thread cut it meanwhile
                return
            self._cut()
            behind = len(self._cuts) > self._MAX_CUTS
        if behind:
            self.flush()
            return
        _busy.add(self)  # a writer dropped without close() lives until its cut batches are published
        if self._publisher is None:
            self._publisher = threading.Thread(target=_publish_loop, args=(weakref.ref(self), self._wake, self._stop),
                                               name="mkb-events-publish", daemon=True)
            self._publisher.start()
        self._wake.set()

    def _publish_cuts(self) -> list[str]:
        """Convert every cut batch in order and publish it; the caller holds `_flush_lock`. Raises with what is left kept.

        Each batch gets its file name and bytes once; a batch whose publish failed is retried
        under the same name at the next flush, and a FileExistsError holding the same bytes counts
        as done. So a PUT that landed although the client saw a timeout is not written twice.
        """
        while True:
            with self._lock:
                if not self._cuts:
                    break
                buffers, _ = self._cuts[0]
            cut = []
            for kind, segments in buffers.items():  # raises with the batch still first in line: nothing of it is lost or reordered
                data = table_bytes(_segments_to_table(schema_for(kind), segments, self._env))
                cut.append((kind, f"{self.store.kind_dir(kind)}/{uuid7()}.parquet", data, sum(map(_segment_events, segments))))
            with self._lock:
                self._cuts.popleft()
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
            with self._lock:
                self._pending.pop(0)
            self.files_written.append(target)
        return written

    def flush(self) -> list[str]:
        """Write each buffered kind as one new file, with every batch still waiting for the publisher; returns the paths written."""
        with self._flush_lock:
            with self._lock:
                self._cut()
            written = self._publish_cuts()
            self._background_failed = False
            _busy.discard(self)
            return written

    @property
    def pending_events(self) -> int:
        """Events buffered, or cut into batches whose publish has not succeeded yet."""
        with self._lock:
            return self._n_buffered + sum(c[1] for c in self._cuts) + sum(p[3] for p in self._pending)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._background + ([self._publisher] if self._publisher is not None else []):
            t.join()
        self.flush()
        _open_writers.discard(self)

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _publish_loop(ref: "weakref.ref[EventWriter]", wake: threading.Event, stop: threading.Event) -> None:
    """The publisher thread: publishes the batches size-triggered flushes cut, until the writer closes or is collected.

    It holds the writer only while publishing, so a writer nobody closed can still be collected.
    """
    while True:
        woken = wake.wait(1.0)
        w = ref()
        if w is None or (stop.is_set() and not woken):
            return
        wake.clear()
        try:
            with w._flush_lock:
                w._publish_cuts()
                if not w._cuts and not w._pending:
                    _busy.discard(w)
        except Exception as exc:  # kept for a retry; the next size-triggered flush runs in the caller and raises it there
            w._background_failed = True  # (and the writer stays in _busy: the exit-time flush retries what is left)
            w.flush_errors.append(f"{type(exc).__name__}: {exc}")
        if stop.is_set():
            return
        del w
