"""Registered upcasters: turn a file of an older major schema version into the current one, so a published dataset stays readable by every later mkb.

The eventsourcing pattern: a major bump (a renamed, removed or retyped column) ships with one
function per step `(kind, from_major)` that rewrites an Arrow table of major N into major N+1. The
reader chains them from the file's major up to this mkb's; a file with a gap in the chain is
skipped and named, as before. Upcasters must be pure functions of the table (they run at read time,
on every read, and never rewrite stored files).
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa

Upcaster = Callable[[pa.Table], pa.Table]
_REGISTRY: dict[tuple[str, int], Upcaster] = {}


def register_upcaster(kind: str, from_major: int, fn: Upcaster | None = None):
    """Register `fn` to rewrite a `kind` table of major `from_major` into major `from_major + 1` (usable as a decorator)."""

    def add(f: Upcaster) -> Upcaster:
        key = (kind, from_major)
        if key in _REGISTRY and _REGISTRY[key] is not f:
            raise ValueError(f"an upcaster for {kind} {from_major}.x -> {from_major + 1}.x is already registered")
        _REGISTRY[key] = f
        return f

    return add(fn) if fn is not None else add


def unregister_upcaster(kind: str, from_major: int) -> None:
    _REGISTRY.pop((kind, from_major), None)


def chain(kind: str, from_major: int, to_major: int) -> list[Upcaster] | None:
    """The upcasters from `from_major` up to `to_major`, or None when a step is missing."""
    steps = []
    for m in range(from_major, to_major):
        fn = _REGISTRY.get((kind, m))
        if fn is None:
            return None
        steps.append(fn)
    return steps


def upcast(kind: str, table: pa.Table, from_major: int, to_major: int) -> pa.Table:
    for fn in chain(kind, from_major, to_major) or ():
        table = fn(table)
    return table
