"""Reads a store's events of one kind as a lazy polars frame on the canonical schema."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from mkb.events._schema import SchemaError, schema_for
from mkb.events._store import Store, resolve_store

log = logging.getLogger(__name__)


class NewerSchemaError(SchemaError):
    """A file was written with a newer major schema version than this mkb knows."""


@dataclass
class ScanReport:
    """What a scan found besides good files: skipped files, each with its reason."""

    files: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def list_files(store: Store, kind: str) -> list[str]:
    d = store.kind_dir(kind)
    if not store.fs.exists(d):
        return []
    return sorted(p for p in store.fs.ls(d, detail=False) if str(p).endswith(".parquet"))


def _check_file(store: Store, path: str, kind: str, known_major: int) -> str | None:
    """None when the file is a readable event file of `kind`; else why it is skipped."""
    try:
        with store.fs.open(path, "rb") as f:
            meta = pq.read_metadata(f)
    except Exception as exc:  # torn or not Parquet at all
        return f"unreadable Parquet ({type(exc).__name__}: {exc})"
    kv = meta.metadata or {}
    file_kind = kv.get(b"mkb.kind", b"").decode()
    version = kv.get(b"mkb.schema_version", b"").decode()
    if file_kind != kind or not version:
        return f"foreign file (mkb.kind={file_kind!r}, expected {kind!r})"
    major = int(version.split(".")[0])
    if major > known_major:
        raise NewerSchemaError(
            f"{path} was written with {kind} schema {version}, newer than this mkb reads (major {known_major})\n"
            "hint: upgrade mkb to read this dataset"
        )
    return None


def scan(kind: str, store: str | Store | None = None, *, report: ScanReport | None = None, dedupe: bool = True):
    """A lazy frame of every `kind` event in the store, on the canonical schema.

    Files of older minor versions lack newer columns; those read as null. A torn or foreign file
    is named in a warning (and in `report`) and skipped; a newer major version raises.
    """
    import polars as pl

    store = store if isinstance(store, Store) else resolve_store(store)
    schema = schema_for(kind)
    report = report if report is not None else ScanReport()
    good = []
    for path in list_files(store, kind):
        why = _check_file(store, path, kind, schema.major)
        if why is None:
            good.append(path)
        else:
            report.skipped[path] = why
            warnings.warn(f"mkb: skipping {path}: {why}", stacklevel=2)
    report.files = good
    canon = schema.polars()
    if not good:
        return pl.LazyFrame(schema=canon)
    if store.is_local:
        lf = pl.scan_parquet(good, schema=canon, missing_columns="insert", extra_columns="ignore")
    else:  # polars cannot open every fsspec protocol itself; pyarrow reads through the fs object
        import pyarrow.dataset as ds

        lf = pl.scan_pyarrow_dataset(ds.dataset(good, schema=schema.arrow(), filesystem=store.fs, format="parquet"))
    if dedupe:
        lf = lf.unique(subset="event_id", keep="first", maintain_order=True)
    return lf


def read(kind: str, store: str | Store | None = None, **kw):
    """`scan(...).collect()`."""
    return scan(kind, store, **kw).collect()
