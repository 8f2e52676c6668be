"""Keeps a store's footer index: what the footers of its good files said, so that a reader in a fresh process opens only the footers nobody indexed yet.

A store of 10,000 small files cost a cold reader ~1.5 s of footer parsing (~150 us a footer in
pyarrow) before polars read a byte of data, and polars then reads every footer again. The index is
immutable segments `<root>/_index/kind=<kind>/<uuid7>.arrow` (Arrow IPC, not `.parquet`, so a glob
over the dataset never takes them for events), each a row per file: name, size, schema version,
rows, event_id range, compacted_from, null counts of the required columns, and its column layout
(layouts are stored once per segment). They are written through the store's exclusive create
(`commit`), so any number of hosts may write them and none is ever overwritten.

Who writes: a reader that parsed at least `MIN_FILES` footers of good files no segment holds (one
segment for all of them; best effort: a read-only store is read without one), and compaction, which
rewrites it: one segment for every good file it left (none for fewer than `MIN_FILES`) and
the older segments deleted.

What a reader trusts: an entry is used only for a listed file of the same name and size (event
files are immutable: a torn or replaced file of another size is read afresh), and only files that
passed the footer check are indexed, so a bad file is read and named on every scan. The entry is
checked by the same rules as a footer (classify); and the rows read from indexed files are checked
for nulls in required columns, falling back to the files' own footers when any is found, so a file
replaced in place by one of the same size cannot pass unchecked. A segment that does not parse is
ignored (and named in a warning): the footers it would have spared are read.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import warnings

import pyarrow as pa

from mkb.events._commit import commit
from mkb.events._ids import uuid7
from mkb.events._store import Store, _protocols

INDEX_DIR = "_index"
MIN_FILES = 1_000  # a reader writes a segment only when it had to parse this many footers no segment held
_SUFFIX = ".arrow"
_META_KIND = b"mkb.index.kind"
_META_LAYOUTS = b"mkb.index.layouts"
_META_FORMAT = b"mkb.index.format"
_FORMAT = b"1"

_SCHEMA = pa.schema([
    ("name", pa.string()), ("size", pa.int64()), ("version", pa.string()), ("rows", pa.int64()), ("layout", pa.int32()),
    ("id_min", pa.string()), ("id_max", pa.string()), ("compacted_from", pa.list_(pa.string())), ("nulls", pa.string()),
])

# segments already parsed in this process: (protocol, path) -> {file name: (size, entry)}; segments are immutable
_loaded: dict[tuple, dict[str, tuple[int, tuple]]] = {}
_lock = threading.Lock()


def index_dir(store: Store, kind: str) -> str:
    return f"{store.root}/{INDEX_DIR}/kind={kind}"


def _list(store: Store, kind: str) -> list[str]:
    d = index_dir(store, kind)
    try:
        if store.is_local:
            with os.scandir(d) as it:
                return sorted(f"{d}/{e.name}" for e in it if e.name.endswith(_SUFFIX))
        store.fs.invalidate_cache(d)
        return sorted(str(p) for p in store.ls(d) if str(p).endswith(_SUFFIX))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _parse(data: bytes, kind: str) -> dict[str, tuple[int, tuple]]:
    table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    meta = table.schema.metadata or {}
    if meta.get(_META_FORMAT) != _FORMAT or meta.get(_META_KIND, b"").decode() != kind:
        raise ValueError(f"not a format-{_FORMAT.decode()} footer index of kind {kind!r}")
    if not table.schema.equals(_SCHEMA):
        raise ValueError("unexpected columns")
    layouts = []
    for blob in json.loads(meta[_META_LAYOUTS]):
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(blob)))
        layouts.append(tuple((f.name, f.type) for f in schema))
    cols = table.to_pydict()
    out = {}
    parsed: dict[str, tuple] = {}  # good files of one layout share their null counts (all zero): parse each text once
    for name, size, version, rows, layout, lo, hi, merged, nulls in zip(*(cols[c] for c in _SCHEMA.names)):
        null_counts = parsed.get(nulls)
        if null_counts is None:
            null_counts = parsed[nulls] = tuple((c, n) for c, n in json.loads(nulls))
        out[name] = (size, (version, rows, layouts[layout], tuple(merged) if merged else (), (lo, hi) if lo is not None and hi is not None else None,
                            null_counts))
    return out


def load(store: Store, kind: str) -> dict[str, tuple[int, tuple]]:
    """{file name: (size, (version, rows, types, compacted_from, id_range, null_counts))} from every segment of `kind`."""
    proto = _protocols(store.fs)
    entries: dict[str, tuple[int, tuple]] = {}
    for path in _list(store, kind):
        key = (proto, path)
        with _lock:
            seg = _loaded.get(key)
        if seg is None:
            try:
                seg = _parse(store.fs.cat_file(path), kind)
            except FileNotFoundError:
                continue  # replaced by a compaction since the listing
            except Exception as exc:
                warnings.warn(f"mkb: ignoring footer index {path}: {type(exc).__name__}: {exc}\n"
                              "hint: delete it; the store's own footers are read instead", stacklevel=4)
                seg = {}
            with _lock:
                if len(_loaded) > 4096:
                    _loaded.clear()
                _loaded[key] = seg
        entries.update(seg)
    return entries


def _table(kind: str, infos: list) -> pa.Table:
    layouts: dict[tuple, int] = {}
    blobs = []
    cols: dict[str, list] = {c: [] for c in _SCHEMA.names}
    for info in infos:
        layout = layouts.get(info.types)
        if layout is None:
            layout = layouts[info.types] = len(blobs)
            blobs.append(base64.b64encode(pa.schema(list(info.types)).serialize().to_pybytes()).decode())
        cols["name"].append(info.name)
        cols["size"].append(info.size)
        cols["version"].append(info.version)
        cols["rows"].append(info.rows)
        cols["layout"].append(layout)
        cols["id_min"].append(info.id_range[0] if info.id_range else None)
        cols["id_max"].append(info.id_range[1] if info.id_range else None)
        cols["compacted_from"].append(list(info.compacted_from))
        cols["nulls"].append(json.dumps(info.null_counts))
    meta = {_META_FORMAT: _FORMAT, _META_KIND: kind.encode(), _META_LAYOUTS: json.dumps(blobs).encode()}
    return pa.Table.from_pydict(cols, schema=_SCHEMA.with_metadata(meta))


def write(store: Store, kind: str, infos: list) -> str:
    """Publish one segment holding `infos` (FileInfo of files that passed the footer check); returns its path."""
    sink = pa.BufferOutputStream()
    table = _table(kind, infos)
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    path = f"{index_dir(store, kind)}/{uuid7()}{_SUFFIX}"
    commit(store, path, sink.getvalue().to_pybytes())
    return path


def rewrite(store: Store, kind: str, infos: list) -> str | None:
    """After a compaction: one segment for `infos` (every good file left) when they are MIN_FILES or more, and the segments listed before it deleted.

    Fewer files are read faster than an index would spare, so a compacted store of a few files keeps no index.
    """
    before = _list(store, kind)
    path = write(store, kind, infos) if len(infos) >= MIN_FILES else None
    for old in before:
        try:
            if store.is_local:
                os.unlink(old)
            else:
                store.fs.rm_file(old)
        except FileNotFoundError:
            pass
    return path


def clear_cache() -> None:
    with _lock:
        _loaded.clear()
