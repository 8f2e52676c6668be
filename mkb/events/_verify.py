"""Reads every data page of every event file in a store and names the files that cannot be read, so a bad file is found before an analysis trips on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pyarrow.parquet as pq

from mkb.events._reader import ScanReport, _check, list_files
from mkb.events._schema import NewerSchemaError, schema_for, schemas
from mkb.events._store import Store, resolve_store


@dataclass
class VerifyReport:
    """Files read in full, rows in them, and each bad file with why (footer, schema, or data pages)."""

    files: int = 0
    rows: int = 0
    bad: dict[str, str] = field(default_factory=dict)
    unknown_kinds: list[str] = field(default_factory=list)


def verify(store: str | Store | None = None, *, kinds: list[str] | None = None, on_file: Callable[[str], None] | None = None) -> VerifyReport:
    """Check every footer as the reader does, then decode every page of every file the reader would use (superseded sources too)."""
    store = resolve_store(store)
    store.require_exists()
    out = VerifyReport()
    for kind in kinds or store.kinds():
        if kind not in schemas():
            out.unknown_kinds.append(kind)
            continue
        schema_for(kind)
        report = ScanReport()
        try:
            live = _check(store, kind, report, warn=False, use_index=False)  # every footer read, not what an index says of it
        except NewerSchemaError as exc:
            out.bad[store.kind_dir(kind)] = str(exc).splitlines()[0]
            continue
        out.bad.update(report.skipped)
        superseded = set(report.superseded)
        paths = [i.path for i in live] + [p for p, _ in list_files(store, kind) if p in superseded]
        for path in paths:
            try:
                with store.fs.open(path, "rb") as fh:
                    table = pq.read_table(fh, use_threads=False)
                out.rows += table.num_rows if path not in superseded else 0
            except FileNotFoundError:
                continue  # deleted by a compaction while we verified: its rows are in the merged file
            except Exception as exc:
                out.bad[path] = f"corrupt data pages ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
            out.files += 1
            if on_file:
                on_file(path)
    return out
