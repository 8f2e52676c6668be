"""Builds the envelope every event row carries (event_id, kind, schema_version, ts, run_id, attempt_id, seq, writer, mkb_version): the one place those columns are filled.

Standard library only, so a GPU host without pyarrow (mkb.grader's JSON-lines writer) builds rows
with it too. Per-attempt `seq` stays ordered across hosts without clocks: the attempt's own writer
owns the counter; when it hands work that emits events to another host (a grading job), it
reserves a block of seq numbers (`reserve`) and passes the `SeqBlock` with the job; the other
host's writer `adopt`s it and numbers its events of that attempt from the block. Events the attempt
writes after the job returns come after the block, so seq follows causality (submit < grading's
events < what the agent does with the verdict), and blocks of concurrent jobs are disjoint.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import mkb

FIELDS = ("event_id", "kind", "schema_version", "ts", "run_id", "attempt_id", "seq", "writer", "mkb_version")
AUTO = frozenset(FIELDS) - {"attempt_id"}  # filled by the builder; callers pass only attempt_id
DEFAULT_BLOCK = 1024


def _load_uuid7():
    try:
        from mkb.events._ids import uuid7
    except ImportError:  # no pyarrow: load the id module without the mkb.events package
        import importlib.util
        from pathlib import Path

        spec = importlib.util.spec_from_file_location("mkb_events_ids_standalone", Path(__file__).with_name("_ids.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        uuid7 = mod.uuid7
    return uuid7


_uuid7 = _load_uuid7()


@dataclass(frozen=True)
class SeqBlock:
    """Seq numbers [start, stop) of one attempt, reserved by the attempt's writer for events another host writes."""

    attempt_id: str
    start: int
    stop: int


class SeqExhausted(RuntimeError):
    """A host wrote more events of an attempt than the block it was handed holds."""


class Envelope:
    """One writer session's envelope: its run_id and writer id, and the per-attempt seq counters."""

    def __init__(self, *, run_id: str | None = None) -> None:
        self.run_id = run_id or _uuid7()
        self.writer = f"{socket.gethostname()}:{os.getpid()}:{_uuid7()[-8:]}"
        self._next: dict[str | None, int] = {}
        self._blocks: dict[str, list[int]] = {}  # attempt -> [next, stop] of an adopted block
        self.lock = threading.Lock()  # guards the counters; a writer may hold it for its buffers too and call `take`
        self._constants: dict[tuple[str, str], dict[str, Any]] = {}

    def check_payload(self, payload: dict[str, Any]) -> None:
        if not AUTO.isdisjoint(payload):
            try:
                from mkb.events._schema import SchemaError
            except ImportError:  # no pyarrow on this host
                SchemaError = ValueError  # noqa: N806
            raise SchemaError(f"envelope columns {sorted(AUTO.intersection(payload))} are filled in by the writer\nhint: do not pass them")

    def row(self, kind: str, version: str, attempt_id: str | None, payload: dict[str, Any], ts: Any, *, event_id: str | None = None) -> dict[str, Any]:
        """A row with every envelope column but `seq` (numbered with `number` once the row is accepted).

        `event_id`: a writer that draws ids when it buffers a row (EventWriter, from its blocks) passes a placeholder.
        """
        return {**payload, "event_id": _uuid7() if event_id is None else event_id, "kind": kind, "schema_version": version, "ts": ts, "run_id": self.run_id,
                "attempt_id": attempt_id, "seq": 0, "writer": self.writer, "mkb_version": mkb.__version__}

    def constants(self, kind: str, version: str) -> dict[str, Any]:
        """The envelope columns that are the same on every row of `kind` this writer writes (a writer lays them out per file, not per row)."""
        const = self._constants.get((kind, version))
        if const is None:
            const = self._constants[(kind, version)] = {"kind": kind, "schema_version": version, "run_id": self.run_id, "writer": self.writer,
                                                        "mkb_version": mkb.__version__}
        return const

    @staticmethod
    def event_id() -> str:
        return _uuid7()

    def number(self, rows: list[dict[str, Any]]) -> None:
        """Assign `seq` to accepted rows, in order, under `lock` (a writer that shares `lock` calls `take` while it holds it instead)."""
        with self.lock:
            for row in rows:
                row["seq"] = self.take(row["attempt_id"])

    def take(self, attempt_id: str | None) -> int:
        """The next seq of `attempt_id`; the caller holds `lock`."""
        block = self._blocks.get(attempt_id) if self._blocks and attempt_id is not None else None
        if block is not None:
            if block[0] >= block[1]:
                raise SeqExhausted(
                    f"attempt {attempt_id}: the seq block handed to this host ends at {block[1]}\n"
                    "hint: reserve a larger block (EventWriter.reserve_seq(attempt_id, n)) for this job"
                )
            block[0] += 1
            return block[0] - 1
        n = self._next.get(attempt_id, 0)
        self._next[attempt_id] = n + 1
        return n

    def reserve(self, attempt_id: str, n: int = DEFAULT_BLOCK) -> SeqBlock:
        """Reserve the next `n` seq numbers of `attempt_id` for another host (this writer's own events continue after them)."""
        if n < 1:
            raise ValueError(f"a seq block needs at least one number, got {n}")
        with self.lock:
            start = self._next.get(attempt_id, 0)
            self._next[attempt_id] = start + n
        return SeqBlock(attempt_id, start, start + n)

    def adopt(self, block: SeqBlock) -> None:
        """Number this writer's events of `block.attempt_id` from `block` (on the host the job was handed to)."""
        with self.lock:
            self._blocks[block.attempt_id] = [block.start, block.stop]
