"""Reads a store's events of one kind as a lazy polars frame on the canonical schema.

Every file's footer is checked first (kind, schema version, column types, and the required columns
present and null-free by the statistics): a torn, foreign, mistyped or incomplete file is named in a
warning and in the ScanReport and skipped; a newer major version is refused, an older one upcast.
The frame is a polars IO source: when collected it reads the listed files in chunks of native
scans, lists again and starts over if a compaction deleted one meanwhile, and skips and names a
file whose data pages do not decode. Footers are fetched in one batched request per scan on object stores (fsspec
`cat_ranges`), read in a thread pool on local disk, and cached by (path, size): event files are
immutable, so a second scan of the same store reads only new files' footers.

`iter_batches` and `read_batches` read the same files as frames of about `batch_rows` rows (a group of
whole files each), only the columns asked for, so a caller that reduces each batch (an analysis keeping
a few columns of a row, or a count) never holds every row of a kind at once.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader  # pq.read_metadata adds ~100 us a file of Python bookkeeping

# Every pq.read_table on a Python file object passes use_threads=False: with pyarrow's own decode threads reading
# through a Python file, a process that exits afterwards aborts now and then ("terminate called without an active
# exception"; 2-4 of 10 runs of a bare read here, 0 of 30 without them). Event files are small; nothing is lost.

try:  # parses a footer's Thrift bytes alone (pyarrow's unpickling of FileMetaData): 20% less than opening a reader, which also builds an Arrow schema
    from pyarrow._parquet import _reconstruct_filemetadata
except ImportError:  # pragma: no cover - a pyarrow without it opens a reader
    _reconstruct_filemetadata = None

from mkb.events import _index
from mkb.events._schema import META_COMPACTED_FROM, META_KIND, META_VERSION, KindSchema, NewerSchemaError, SchemaError, parse_version, schema_for
from mkb.events._store import Store, StoreError, _protocols, resolve_store
from mkb.events._upcast import chain, upcast

_TAIL = 64 * 1024  # bytes fetched from a file's end: covers the footer of any event file written so far


@dataclass(frozen=True)
class FileInfo:
    """What a file's footer says about it."""

    path: str
    size: int
    kind: str
    version: str
    rows: int
    types: tuple[tuple[str, pa.DataType], ...]  # (column, arrow type) in file order
    compacted_from: tuple[str, ...] = ()
    id_range: tuple[str, str] | None = None  # min and max event_id from the column statistics, when written
    null_counts: tuple[tuple[str, int | None], ...] = ()  # (flat column, nulls over all row groups; None without statistics)
    from_index: bool = field(default=False, compare=False)  # taken from the store's footer index, not this file's own footer

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass
class ScanReport:
    """What a scan found besides good files: skipped files with their reason, superseded and newer-minor files."""

    files: list[str] = field(default_factory=list)
    rows_in_files: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    superseded: list[str] = field(default_factory=list)
    newer_minor: dict[str, str] = field(default_factory=dict)


_cache: dict[tuple, FileInfo | str] = {}
_cache_lock = threading.Lock()


def list_files(store: Store, kind: str) -> list[tuple[str, int]]:
    """(path, size) of every `*.parquet` file directly in kind=<kind>/, sorted by name (uuid7: by write time)."""
    d = store.kind_dir(kind)
    entries = []
    if store.is_local:  # os.scandir: fsspec's ls costs an extra stat and path normalisation a file
        found = []
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.endswith(".parquet"):
                        try:
                            if e.is_file():
                                found.append((f"{d}/{e.name}", e.stat().st_size))
                        except FileNotFoundError:
                            pass  # deleted by a compaction since it was listed: its rows are in the merged file
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(found)
    for attempt in range(3):  # an object store's "no such prefix" is asked again: a missed listing would drop every row
        try:
            entries = store.ls(d, detail=True, refresh=True)
            break
        except FileNotFoundError:
            store.fs.invalidate_cache()
            if attempt < 2:
                import time

                time.sleep(0.05 * (attempt + 1))
    out = []
    for e in entries:
        name = str(e["name"])
        if e.get("type", "file") == "file" and name.endswith(".parquet"):
            out.append((name, int(e.get("size") or 0)))
    return sorted(out)


def _parse_footer(path: str, size: int, tail: bytes) -> FileInfo | str:
    if size == 0:
        return "empty file (torn, or a write in progress on a filesystem without hard links)"
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        return "not a complete Parquet file (no PAR1 footer: torn or not Parquet)"
    try:
        meta = _footer_metadata(tail, size)
        kv = meta.metadata or {}
        shape = _shape(meta, kv.get(b"ARROW:schema"))
        id_range, null_counts = _statistics(meta, shape)
    except Exception as exc:
        return f"unreadable Parquet footer ({type(exc).__name__}: {exc})"
    compacted = kv.get(META_COMPACTED_FROM)
    try:
        compacted = tuple(json.loads(compacted)) if compacted else ()
    except ValueError:
        compacted = ()
    return FileInfo(
        id_range=id_range, null_counts=null_counts,
        path=path, size=size, kind=kv.get(META_KIND, b"").decode(errors="replace"),
        version=kv.get(META_VERSION, b"").decode(errors="replace"), rows=meta.num_rows,
        types=shape.types, compacted_from=compacted,
    )


def _footer_metadata(tail: bytes, size: int) -> pq.FileMetaData:
    n = _footer_len(tail)
    if _reconstruct_filemetadata is not None and 0 < n <= len(tail) - 8:
        return _reconstruct_filemetadata(pa.py_buffer(tail[len(tail) - 8 - n:-8]))
    buf = tail if len(tail) >= size else b"PAR1" + tail  # pyarrow wants a leading magic; offsets in the footer are not followed
    reader = ParquetReader()
    reader.open(pa.py_buffer(buf))
    return reader.metadata


@dataclass(frozen=True)
class _Shape:
    """What files of one column layout share: their Arrow types and where the columns the footer check reads sit."""

    types: tuple[tuple[str, pa.DataType], ...]  # (column, arrow type) in file order
    id_index: int | None  # leaf index of event_id
    required: tuple[tuple[str, int], ...]  # (flat column, leaf index) of columns some kind requires
    parquet: pq.ParquetSchema = field(compare=False)  # the layout these indices hold for


_shapes: dict[bytes, _Shape] = {}


def _shape(meta: pq.FileMetaData, blob: bytes | None) -> _Shape:
    """The file's _Shape; converting a Parquet schema costs ~50 us a file, and files of one schema version share one ARROW:schema blob."""
    hit = _shapes.get(blob) if blob is not None else None
    if hit is not None and hit.parquet.equals(meta.schema):  # ~5 us: a blob copied onto other columns must not borrow their indices
        return hit
    types = tuple((f.name, f.type) for f in meta.schema.to_arrow_schema())
    leaves = [meta.schema.column(j).path for j in range(meta.num_columns)]
    required = _required_names()
    shape = _Shape(
        types=types,
        id_index=next((j for j, name in enumerate(leaves) if name == "event_id"), None),
        required=tuple((name, j) for j, name in enumerate(leaves) if name in required),  # list leaves ("x.list.element") never match
        parquet=meta.schema,
    )
    if blob is not None and len(_shapes) < 4096:
        _shapes[blob] = shape
    return shape


def _statistics(meta: pq.FileMetaData, shape: _Shape) -> tuple[tuple[str, str] | None, tuple[tuple[str, int | None], ...]]:
    """(min, max) event_id and the null count of each required column over all row groups, from the footer statistics.

    The id range is None when any row group lacks it; a null count is None when any row group lacks one.
    Only the columns the checks use are touched: a footer holds statistics for every column.
    """
    n_groups = meta.num_row_groups
    if n_groups == 0:
        return None, ()
    lo = hi = None
    have_range = shape.id_index is not None
    totals = dict.fromkeys((name for name, _ in shape.required), 0)
    for i in range(n_groups):
        rg = meta.row_group(i)
        if have_range:
            st = rg.column(shape.id_index).statistics
            if st is None or not st.has_min_max:
                have_range = False
            else:
                lo = st.min if lo is None or st.min < lo else lo
                hi = st.max if hi is None or st.max > hi else hi
        for name, j in shape.required:
            st = rg.column(j).statistics
            prev = totals[name]
            if st is None or not st.has_null_count or prev is None:
                totals[name] = None
            else:
                totals[name] = prev + st.null_count
    id_range = None
    if have_range:
        if isinstance(lo, bytes):
            lo, hi = lo.decode(errors="replace"), hi.decode(errors="replace")
        id_range = (lo, hi)
    return id_range, tuple(totals.items())


def _required_names() -> frozenset[str]:
    """Columns that are required (non-null) in some kind: only their null counts are worth reading from a footer."""
    global _REQUIRED
    if _REQUIRED is None:
        from mkb.events._schema import schemas

        _REQUIRED = frozenset(c.name for sch in schemas().values() for c in sch.columns if not c.nullable)
    return _REQUIRED


_REQUIRED: frozenset[str] | None = None


def overlap_groups(files: list[FileInfo]) -> list[list[FileInfo]]:
    """Files grouped so that two files that could share an event_id are in one group.

    Two files share an id only if their [min, max] event_id ranges overlap; files without
    statistics overlap everything. Files mkb writes have unique ids inside (uuid7 per event,
    compaction de-duplicates), so a file alone in its group needs no row-level de-duplication.
    """
    known = sorted((f for f in files if f.id_range is not None), key=lambda f: f.id_range)
    unknown = [f for f in files if f.id_range is None]
    groups: list[list[FileInfo]] = []
    hi = None
    for f in known:
        if groups and f.id_range[0] <= hi:
            groups[-1].append(f)
            hi = max(hi, f.id_range[1])
        else:
            groups.append([f])
            hi = f.id_range[1]
    if unknown:
        groups = [[f for g in groups for f in g] + unknown]
    return groups


def _footer_len(tail: bytes) -> int:
    return int.from_bytes(tail[-8:-4], "little") if len(tail) >= 8 else 0


def _inspect_local(files: list[tuple[str, int]]) -> list[FileInfo | str]:
    """Read footers in a thread pool, a few slices ahead, and parse them here.

    Parsing holds the GIL (~100 us a footer), so threads parsing at once only contend (measured: slower than
    one thread on an idle 2-core machine); reading is what threads overlap (a cold disk, a network
    filesystem). At most `ahead` slices of tails are held at once, whatever the number of files.
    """

    def info(item, tail):
        if isinstance(tail, BaseException):
            return f"unreadable ({type(tail).__name__}: {tail})"
        return _parse_footer(item[0], item[1], tail)

    def one(item):
        path, size = item
        try:
            fd = os.open(path, os.O_RDONLY)  # os.pread: a buffered file object costs more than the read
            try:
                tail = os.pread(fd, min(size, _TAIL), max(0, size - _TAIL))
                need = _footer_len(tail) + 8
                if tail[-4:] == b"PAR1" and len(tail) < need <= size:
                    tail = os.pread(fd, need, size - need)
            finally:
                os.close(fd)
            return tail
        except Exception as exc:
            return exc

    if len(files) < 64:
        return [info(x, one(x)) for x in files]
    step, ahead = 128, 4
    slices = iter([files[k:k + step] for k in range(0, len(files), step)])
    out: list[FileInfo | str] = []
    with ThreadPoolExecutor(max_workers=ahead) as pool:
        queue = deque((part, pool.submit(lambda p: [one(x) for x in p], part)) for part in itertools.islice(slices, ahead))
        while queue:
            part, tails = queue.popleft()
            nxt = next(slices, None)
            if nxt is not None:
                queue.append((nxt, pool.submit(lambda p: [one(x) for x in p], nxt)))
            out.extend(info(item, tail) for item, tail in zip(part, tails.result()))
    return out


def _read_tails_remote(store: Store, files: list[tuple[str, int]]) -> list[bytes | Exception]:
    paths = [p for p, _ in files]
    starts = [max(0, s - _TAIL) for _, s in files]
    ends = [s for _, s in files]
    try:
        tails = store.fs.cat_ranges(paths, starts, ends, on_error="return")
    except TypeError:  # an fsspec implementation without on_error
        tails = store.fs.cat_ranges(paths, starts, ends)
    out: list[bytes | Exception] = []
    for (path, size), tail in zip(files, tails):
        if isinstance(tail, bytes) and tail[-4:] == b"PAR1" and len(tail) < _footer_len(tail) + 8 <= size:
            try:
                tail = store.fs.cat_file(path, start=size - _footer_len(tail) - 8, end=size)
            except Exception as exc:
                tail = exc
        out.append(tail)
    return out


def inspect_files(store: Store, files: list[tuple[str, int]], *, kind: str | None = None) -> list[FileInfo | str]:
    """FileInfo for each file, or why it cannot be read; cached by (protocol, path, size).

    With `kind`, files the store's footer index (mkb.events._index) holds at the same size are taken
    from it and only the others' footers are read.
    """
    proto = _protocols(store.fs)
    keys = [(proto, p, s) for p, s in files]
    with _cache_lock:
        todo = [i for i, k in enumerate(keys) if k not in _cache]
    if todo and kind is not None:
        entries = _index.load(store, kind)
        rest = []
        for i in todo:
            path, size = files[i]
            hit = entries.get(path.rsplit("/", 1)[-1]) if entries else None
            if hit is not None and hit[0] == size:
                version, rows, types, merged, id_range, nulls = hit[1]
                info = FileInfo(path=path, size=size, kind=kind, version=version, rows=rows, types=types, compacted_from=merged,
                                id_range=id_range, null_counts=nulls, from_index=True)
                with _cache_lock:
                    _cache[keys[i]] = info
            else:
                rest.append(i)
        todo = rest
    if todo:
        sub = [files[i] for i in todo]
        if store.is_local:
            infos = _inspect_local(sub)
        else:
            infos = []
            for (path, size), tail in zip(sub, _read_tails_remote(store, sub)):
                if isinstance(tail, BaseException) or not isinstance(tail, (bytes, bytearray)):
                    infos.append(f"unreadable ({type(tail).__name__}: {tail})")
                else:
                    infos.append(_parse_footer(path, size, bytes(tail)))
        with _cache_lock:
            for i, info in zip(todo, infos):
                if isinstance(info, FileInfo):  # only good verdicts are cached: a file listed mid-write may heal
                    _cache[keys[i]] = info
                else:
                    _cache.setdefault(("bad",) + keys[i], info)
    with _cache_lock:
        return [_cache.get(k) or _cache.get(("bad",) + k) for k in keys]


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal up to list item names (Parquet round-trips `list<item>` as `list<element>`)."""
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same_type(a.value_type, b.value_type)
    return a.equals(b)


def classify(schema: KindSchema, info: FileInfo | str) -> str | None:
    """None when `info` is a readable event file of the schema's kind; else why it is skipped. Raises on a newer major.

    Readable: this major (or an older one with registered upcasters), canonical column types, and
    every required column present and free of nulls by the footer statistics.
    """
    if isinstance(info, str):
        return info
    if info.kind != schema.kind:
        return f"foreign file (footer mkb.kind={info.kind!r}, expected {schema.kind!r})"
    try:
        major, minor = parse_version(info.version)
    except SchemaError:
        return f"foreign file (footer mkb.schema_version={info.version!r} is not major.minor)"
    if major > schema.major:
        raise NewerSchemaError(
            f"{info.path} was written with {schema.kind} schema {info.version}, newer than this mkb reads ({schema.version})\n"
            "hint: upgrade mkb (pip install -U mkb) to read this dataset; major versions change columns incompatibly"
        )
    if major < schema.major:
        if chain(schema.kind, major, schema.major) is None:
            return f"older major schema {info.version} and no upcaster to {schema.major}.x registered (this mkb reads {schema.major}.x)\nhint: read it with the mkb release that wrote it"
        return None  # columns are checked after upcasting, when it is read
    why = _type_verdict(schema, info.types)
    if why:
        return why
    present = dict(info.types)
    nulls = dict(info.null_counts)
    for c in schema.columns:
        if c.nullable:
            continue
        if c.name not in present:
            if c.name in schema.envelope or minor >= schema.minor:
                return f"required column {c.name!r} is missing (the {schema.kind} schema forbids null)"
            continue
        n = nulls.get(c.name, 0)
        if n is None:
            return f"required column {c.name!r} has no null statistics, so its rows cannot be checked\nhint: rewrite the file with Parquet statistics (pyarrow and polars write them by default)"
        if n:
            return f"required column {c.name!r} holds {n} null(s) (the {schema.kind} schema forbids null)"
    return None


_type_verdicts: dict[tuple, str | None] = {}


def _type_verdict(schema: KindSchema, types: tuple[tuple[str, pa.DataType], ...]) -> str | None:
    """Why a file of these column types is not of the schema, or None; files of one layout share it (comparing 16 types cost ~100 us a file)."""
    key = (schema, types)
    hit = _type_verdicts.get(key, False)
    if hit is not False:
        return hit
    canon = {f.name: f.type for f in schema.arrow()}
    why = None
    for name, typ in types:
        if name in canon and not _same_type(canon[name], typ):
            why = f"column {name!r} is {typ}, the {schema.kind} schema says {canon[name]}"
            break
    if len(_type_verdicts) > 4096:
        _type_verdicts.clear()
    _type_verdicts[key] = why
    return why


_verdicts: dict[tuple, tuple] = {}


def _classify_cached(schema: KindSchema, info: FileInfo | str) -> str | None:
    """classify, remembered per (schema, what the verdict depends on): files of one layout, version and null counts share it.

    Re-checking 10,000 footers' columns cost ~2 s a scan, and ~0.2 s even once per file. The layout's
    types tuple is one object per layout (see _shape and mkb.events._index), so it is keyed by identity
    and kept alive in the entry.
    """
    if isinstance(info, str):
        return info
    k = (id(schema), info.kind, info.version, id(info.types), info.null_counts)
    hit = _verdicts.get(k)
    if hit is not None and hit[0] is schema and hit[1] is info.types:
        return hit[2]
    why = classify(schema, info)  # raises NewerSchemaError, never cached
    if info.version.split(".")[0] == str(schema.major):  # an older major's verdict depends on the upcasters registered now
        if len(_verdicts) > 65_536:
            _verdicts.clear()
        _verdicts[k] = (schema, info.types, why)
    return why


def needs_upcast(schema: KindSchema, info: FileInfo) -> bool:
    return parse_version(info.version)[0] < schema.major


def good_files(store: Store, kind: str, report: ScanReport, *, use_index: bool = True) -> list[FileInfo]:
    """Every listed file of `kind` that passes its footer check (superseded ones too); the others go to `report.skipped`.

    A reader that had to parse MIN_FILES footers of good files the footer index did not hold leaves a
    segment with them behind (best effort: a store it cannot write to is read without one).
    """
    schema = schema_for(kind)
    files = list_files(store, kind)
    good: list[FileInfo] = []
    proto = _protocols(store.fs)
    with _cache_lock:
        known = sum(1 for p, s in files if (proto, p, s) in _cache)
    infos = inspect_files(store, files, kind=kind if use_index else None)
    parsed = []
    for (path, size), info in zip(files, infos):
        why = _bad_data.get((proto, path, size)) or _classify_cached(schema, info)
        if why is None:
            good.append(info)
            if not info.from_index:
                parsed.append(info)
        else:
            report.skipped[path] = why
    if use_index and len(parsed) >= _index.MIN_FILES and len(files) - known >= _index.MIN_FILES and not _read_only(store):
        try:
            _index.write(store, kind, parsed)
        except Exception:
            pass  # a read-only or full store is read without an index; the next reader tries again
    return good


def _read_only(store: Store) -> bool:
    from mkb.events._store import READ_ONLY_PROTOCOLS

    return any(p in READ_ONLY_PROTOCOLS for p in _protocols(store.fs))


def _check(store: Store, kind: str, report: ScanReport, *, warn: bool = True, stacklevel: int = 3, use_index: bool = True) -> list[FileInfo]:
    schema = schema_for(kind)
    good = good_files(store, kind, report, use_index=use_index)
    if warn:
        for path, why in report.skipped.items():
            warnings.warn(f"mkb: skipping {path}: {why}", stacklevel=stacklevel)
    merged = {name for info in good for name in info.compacted_from}
    live = []
    for info in good:
        if info.name in merged:
            report.superseded.append(info.path)  # its rows are in a compacted file that is present
        else:
            live.append(info)
    for info in live:
        major, minor = parse_version(info.version)
        if major == schema.major and minor > schema.minor:
            extra = [n for n, _ in info.types if n not in set(schema.names)]
            report.newer_minor[info.path] = info.version
            if warn and extra:
                warnings.warn(
                    f"mkb: {info.path} has {kind} schema {info.version} (this mkb knows {schema.version}); columns {extra} are not read\n"
                    "hint: upgrade mkb to see them", stacklevel=stacklevel,
                )
    report.files = [i.path for i in live]
    report.rows_in_files = sum(i.rows for i in live)
    return live


_bad_data: dict[tuple, str] = {}  # files whose footer is intact but whose data pages are not (found when read)


def clear_caches() -> None:
    """Forget every footer, verdict and layout seen, as in a fresh process (benchmarks measure cold reads with it)."""
    with _cache_lock:
        _cache.clear()
    for c in (_verdicts, _type_verdicts, _shapes, _bad_data, _distrusted):
        c.clear()
    _index.clear_cache()
_CHUNK = 16_384  # files per native scan (one scan for most stores: each scan's slowest files hold up its end); errors are found by halving
_RETRIES = 5


class _IndexDistrusted(Exception):
    """Rows of files taken from the footer index hold nulls where the schema forbids them: read those files' own footers."""


def _index_lied(schema: KindSchema, live: list[FileInfo], df) -> bool:
    """Whether files taken from the footer index gave rows with nulls in required columns (a file replaced in place at the same size).

    A file whose own footer allows that (an older minor lacking a later required column) is read the same way after the fallback.
    """
    if not any(i.from_index for i in live):
        return False
    required = [c.name for c in schema.columns if not c.nullable and c.name in df.columns]
    if not required or df.height == 0:
        return False
    return any(df.get_column(name).null_count() for name in required)  # not df.select(...): ~1 s per 10,000 chunks


def _forget_index(store: Store, live: list[FileInfo]) -> None:
    proto = _protocols(store.fs)
    with _cache_lock:
        for i in live:
            if i.from_index:
                _cache.pop((proto, i.path, i.size), None)


class _Vanished(Exception):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class ListingChanged(StoreError):
    """A file listed for this read vanished before it was read (a compaction merged it), or the footer index was
    found stale: what `iter_batches` yielded so far must be discarded and the read started again (`read_batches` does)."""

    def __init__(self, msg: str, *, path: str = "", distrust_index: bool = False) -> None:
        super().__init__(msg)
        self.path = path
        self.distrust_index = distrust_index


def scan(kind: str, store: str | Store | None = None, *, report: ScanReport | None = None, dedupe: bool = True):
    """A lazy frame of every `kind` event in the store, on the canonical schema.

    Files of older minor versions lack newer columns; those read as null. Files of a newer minor
    version read without their extra columns (warned); files of an older major version are
    upcast through registered upcasters (mkb.events.register_upcaster). A torn or foreign file, or
    one whose required columns are missing or null, is named in a warning (and in `report`) and
    skipped; a newer major version raises NewerSchemaError. A file whose data pages turn out corrupt
    when collected is skipped and named then (added to `report.skipped`).

    The files are read when the frame is collected, from the listing made here; a file that a
    compaction deleted in between (its rows now in a merged file) makes the read list the store again
    and start over, so a reader sees every row once, never a partial set.

    Rows are de-duplicated on event_id (a copied file, or two compactions racing, leave copies);
    only files whose event_id ranges overlap are de-duplicated row by row (see overlap_groups).
    """
    import polars as pl
    from polars.io.plugins import register_io_source

    store = resolve_store(store)
    store.require_exists()
    schema = schema_for(kind)
    report = report if report is not None else ScanReport()
    live = _check(store, kind, report)
    canon = schema.polars()
    state = {"live": live, "use_index": True}

    def source(with_columns, predicate, n_rows, batch_size):
        cols = list(with_columns) if with_columns else list(schema.names)
        need = list(dict.fromkeys(cols + (predicate.meta.root_names() if predicate is not None else [])))  # _batches reads event_id where it de-duplicates

        def whole():
            parts = list(_batches(store, schema, state["live"], need, report, dedupe=dedupe, batch_rows=None))
            if not parts:
                return pl.DataFrame(schema={c: canon[c] for c in need})
            return pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]

        df = _retrying(store, kind, report, state, whole)
        if predicate is not None:
            df = df.filter(predicate)
        if df.columns != cols:  # a select on a frame of a chunk per file costs ~1 s per 10,000 files: only when it changes something
            df = df.select(cols)
        if n_rows is not None:
            df = df.head(n_rows)
        yield df

    if not live:
        return pl.LazyFrame(schema=canon)
    return register_io_source(source, schema=canon, explain_name="mkb.events", explain_detail=f"{kind} in {store.url}")


BATCH_ROWS = 262_144  # rows per batch of iter_batches / read_batches: whole files are grouped up to about this many rows


def iter_batches(kind: str, store: str | Store | None = None, *, columns: list[str] | tuple[str, ...] | None = None,
                 batch_rows: int = BATCH_ROWS, report: ScanReport | None = None, dedupe: bool = True) -> Iterator:
    """Every `kind` event as polars frames of about `batch_rows` rows (whole files grouped; a file larger than that is
    one batch), holding only `columns` (default: every canonical column), on the canonical types.

    The files, their footer checks, upcasting and the skipping and naming of hostile files are those of `scan`
    (a file whose data pages do not decode is named when its batch is read). With `dedupe`, files whose event_id
    ranges overlap are read as one batch and de-duplicated (no id can repeat across batches), every other file as is.

    A generator cannot take back what it yielded: if a compaction deletes a listed file before it is read (or the
    footer index turns out stale), this raises ListingChanged, and the caller discards what it got and iterates
    again. `read_batches` does that for a caller that reduces each batch.
    """
    store = resolve_store(store)
    store.require_exists()
    schema = schema_for(kind)
    report = report if report is not None else ScanReport()
    cols = _columns(schema, columns)
    live = _check(store, kind, report, use_index=_index_trusted(store, kind))
    try:
        yield from _batches(store, schema, live, cols, report, dedupe=dedupe, batch_rows=batch_rows)
    except _Vanished as exc:
        raise ListingChanged(f"{exc.path} vanished while it was read (a compaction merged it)\nhint: iterate again",
                             path=exc.path) from None
    except _IndexDistrusted:
        _distrust_index(store, kind)  # the next iteration reads the files' own footers
        raise ListingChanged("the footer index is stale (a file was replaced in place)\nhint: iterate again",
                             distrust_index=True) from None


def read_batches(kind: str, store: str | Store | None = None, *, columns: list[str] | tuple[str, ...] | None = None,
                 reduce: Callable | None = None, batch_rows: int = BATCH_ROWS, report: ScanReport | None = None,
                 dedupe: bool = True):
    """The frames of `iter_batches`, each passed through `reduce` (a function of a LazyFrame returning a LazyFrame) and
    concatenated in file order: what a caller keeps of a kind is built batch by batch, never from every row at once.

    Like `scan`, a file a compaction deleted before it was read makes the read list the store again and start over
    (discarding what was reduced so far), so the result holds every row once, never a partial set. `reduce` must be a
    function of the rows alone (a filter, a projection, a per-row expression, a join to a small table): it is run
    on each batch, and on an empty frame of the canonical schema when the kind holds no rows.
    """
    import polars as pl

    store = resolve_store(store)
    store.require_exists()
    schema = schema_for(kind)
    report = report if report is not None else ScanReport()
    cols = _columns(schema, columns)
    reduce = reduce if reduce is not None else (lambda lf: lf)
    trusted = _index_trusted(store, kind)
    state = {"live": _check(store, kind, report, use_index=trusted), "use_index": trusted}

    def whole():
        parts = [reduce(df.lazy()).collect() for df in _batches(store, schema, state["live"], cols, report, dedupe=dedupe,
                                                                batch_rows=batch_rows)]
        if not parts:
            canon = schema.polars()
            return reduce(pl.LazyFrame(schema={c: canon[c] for c in cols})).collect()
        return pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]

    return _retrying(store, kind, report, state, whole)


_distrusted: set[tuple] = set()  # (protocols, root, kind) whose footer index a batched read caught lying, in this process


def _index_trusted(store: Store, kind: str) -> bool:
    return (_protocols(store.fs), store.root, kind) not in _distrusted


def _distrust_index(store: Store, kind: str) -> None:
    _distrusted.add((_protocols(store.fs), store.root, kind))


def _columns(schema: KindSchema, columns) -> list[str]:
    if columns is None:
        return list(schema.names)
    cols = list(dict.fromkeys(columns))
    unknown = [c for c in cols if c not in set(schema.names)]
    if unknown:
        raise SchemaError(f"{schema.kind} has no column {unknown[0]!r}\nhint: its columns: {', '.join(schema.names)}")
    return cols


def _retrying(store: Store, kind: str, report: ScanReport, state: dict, read: Callable):
    """`read()` from `state["live"]`; when a listed file vanished or the footer index lied, list again and start over."""
    gone = ""
    for _attempt in range(_RETRIES):
        try:
            return read()
        except (_Vanished, _IndexDistrusted) as exc:
            gone = getattr(exc, "path", "")
            fresh = ScanReport()
            use_index = not isinstance(exc, _IndexDistrusted) and state["use_index"]
            state["use_index"] = use_index
            if not use_index:
                _distrust_index(store, kind)
            state["live"] = _check(store, kind, fresh, warn=isinstance(exc, _IndexDistrusted), use_index=use_index, stacklevel=5)
            report.files, report.rows_in_files, report.superseded = fresh.files, fresh.rows_in_files, fresh.superseded
            report.skipped.update(fresh.skipped)
    raise StoreError(
        f"{gone} vanished while it was read, {_RETRIES} times (a compaction with --grace-s 0 is deleting files under this reader)\n"
        "hint: read again, or compact with a grace period longer than a read takes"
    )


def _batches(store: Store, schema: KindSchema, live: list[FileInfo], cols: list[str], report: ScanReport, *, dedupe: bool,
             batch_rows: int | None) -> Iterator:
    """Frames of `cols` of every live file, in file order: files that need no row-level de-duplication first (native scans
    of chunks of files, then upcast files one by one), then the files whose event_id ranges overlap, de-duplicated.

    `batch_rows=None` (scan: one frame is wanted) reads chunks of _CHUNK files and de-duplicates every overlapping file
    together; otherwise chunks end at about `batch_rows` rows and each overlap group is its own batch.
    Raises _Vanished (a listed file is gone) and _IndexDistrusted (rows of index-held files break the schema).
    """
    import polars as pl

    read_cols = list(dict.fromkeys(cols + ["event_id"]))  # of files de-duplicated row by row
    if dedupe:
        groups = overlap_groups(live)
        alone = {g[0].path for g in groups if len(g) == 1}
        shared_groups = [g for g in groups if len(g) > 1]
    else:
        alone, shared_groups = {i.path for i in live}, []

    def checked(infos: list[FileInfo], dfs: list):
        for df in dfs:
            if _index_lied(schema, infos, df):
                _forget_index(store, infos)
                raise _IndexDistrusted()
            yield df

    current = [i for i in live if i.path in alone and not needs_upcast(schema, i)]
    for chunk in _chunks(current, batch_rows):
        yield from checked(chunk, _read_chunk(store, schema, chunk, cols, report))
    for info in live:
        if info.path in alone and needs_upcast(schema, info):
            df = _read_upcast(store, schema, info, cols, report)
            if df is not None:
                yield df
    if not shared_groups:
        return
    if batch_rows is None:
        shared_groups = [[i for g in shared_groups for i in g]]
    order = {i.path: k for k, i in enumerate(live)}
    for group in shared_groups:
        group = sorted(group, key=lambda i: order[i.path])  # file order, as read without de-duplication
        parts = []
        now = [i for i in group if not needs_upcast(schema, i)]
        for chunk in _chunks(now, None):
            parts.extend(checked(chunk, _read_chunk(store, schema, chunk, read_cols, report)))
        parts.extend(p for i in group if needs_upcast(schema, i)
                     if (p := _read_upcast(store, schema, i, read_cols, report)) is not None)
        if parts:
            df = _dedupe(pl.concat(parts, how="vertical").lazy()).collect()
            yield df.select(cols) if df.columns != cols else df


def _chunks(infos: list[FileInfo], batch_rows: int | None) -> Iterator[list[FileInfo]]:
    """Consecutive runs of files for one native scan each: at most _CHUNK files, and about `batch_rows` rows when given."""
    chunk: list[FileInfo] = []
    rows = 0
    for info in infos:
        if chunk and (len(chunk) >= _CHUNK or (batch_rows is not None and rows + info.rows > batch_rows)):
            yield chunk
            chunk, rows = [], 0
        chunk.append(info)
        rows += info.rows
    if chunk:
        yield chunk


def _exists(store: Store, path: str) -> bool:
    try:
        return os.path.exists(path) if store.is_local else store.fs.exists(path)
    except Exception:
        return False


def _native(store: Store, schema: KindSchema, paths: list[str], cols: list[str]):
    return _scan_paths(store, schema, paths).select(cols).collect()


def _read_chunk(store: Store, schema: KindSchema, infos: list[FileInfo], cols: list[str], report: ScanReport, *, checked: bool = False) -> list:
    """One native scan of the chunk; on an error, find the file(s) to blame: vanished (start over) or corrupt (skip and name).

    The blame is found by halving: a chunk that fails is read as two halves, down to the one file
    that fails alone, so a bad file among 10,000 costs ~2 log2(10,000) scans, not 10,000 of them.
    """
    if not infos:
        return []
    try:
        return [_native(store, schema, [i.path for i in infos], cols)]
    except Exception as exc:
        first = exc
    if not checked:  # a compaction deleted one: list again and start over (cheaper than halving down to it)
        for info in infos:
            if not _exists(store, info.path):
                raise _Vanished(info.path)
    if len(infos) > 1:
        mid = len(infos) // 2
        return (_read_chunk(store, schema, infos[:mid], cols, report, checked=True)
                + _read_chunk(store, schema, infos[mid:], cols, report, checked=True))
    info = infos[0]
    if not _exists(store, info.path):
        raise _Vanished(info.path) from None
    try:  # a second, independent decoder: only a file both refuse is blamed (not, say, a transient EMFILE)
        with store.fs.open(info.path, "rb") as fh:
            pq.read_table(fh, use_threads=False)
    except FileNotFoundError:
        raise _Vanished(info.path) from None
    except Exception:
        pass
    else:
        raise first
    why = f"corrupt data pages ({type(first).__name__}: {str(first).splitlines()[0][:200]})\nhint: `mkb-run verify --store URL` lists every such file"
    _bad_data[(_protocols(store.fs), info.path, info.size)] = why
    report.skipped[info.path] = why
    warnings.warn(f"mkb: skipping {info.path}: {why}", stacklevel=4)
    return []


def _read_upcast(store: Store, schema: KindSchema, info: FileInfo, cols: list[str], report: ScanReport):
    """An older-major file through its upcasters, then onto the canonical schema like any file."""
    import polars as pl

    try:
        with store.fs.open(info.path, "rb") as fh:
            table = pq.read_table(fh, use_threads=False)
    except FileNotFoundError:
        raise _Vanished(info.path) from None
    except Exception as exc:
        report.skipped[info.path] = f"unreadable ({type(exc).__name__}: {exc})"
        warnings.warn(f"mkb: skipping {info.path}: {report.skipped[info.path]}", stacklevel=4)
        return None
    major = parse_version(info.version)[0]
    try:
        table = upcast(schema.kind, table, major, schema.major)
        arrow = schema.arrow()
        arrays = []
        for f in arrow:
            if f.name in table.column_names:
                arrays.append(table.column(f.name).cast(f.type))
            elif f.nullable:
                arrays.append(pa.nulls(table.num_rows, f.type))
            else:
                raise SchemaError(f"required column {f.name!r} is missing after upcasting")
        table = pa.Table.from_arrays(arrays, schema=arrow)
        for f in arrow:
            if not f.nullable and table.column(f.name).null_count:
                raise SchemaError(f"required column {f.name!r} holds nulls after upcasting")
    except Exception as exc:
        report.skipped[info.path] = f"upcasting {info.version} -> {schema.version} failed ({type(exc).__name__}: {exc})"
        warnings.warn(f"mkb: skipping {info.path}: {report.skipped[info.path]}", stacklevel=4)
        return None
    return pl.from_arrow(table).select(cols)


def _dedupe(lf):
    """Exact de-duplication on event_id at a third of `unique`'s cost: only rows whose 64-bit hash
    repeats (all true duplicates, plus rare collisions) go through the exact string comparison."""
    import polars as pl

    lf = lf.with_columns(pl.col("event_id").hash(7).alias("__mkb_h"))
    repeated = pl.col("__mkb_h").is_duplicated()
    return pl.concat([
        lf.filter(~repeated),
        lf.filter(repeated).unique(subset="event_id", keep="first", maintain_order=True),
    ]).drop("__mkb_h")


def _scan_paths(store: Store, schema: KindSchema, paths: list[str]):
    import polars as pl

    if store.is_local:
        return pl.scan_parquet(paths, schema=schema.polars(), missing_columns="insert", extra_columns="ignore", hive_partitioning=False)
    # polars cannot open memory:// (or every fsspec protocol); pyarrow reads through the fs object and null-fills by schema
    import pyarrow.dataset as ds

    return pl.scan_pyarrow_dataset(ds.dataset(paths, schema=schema.arrow(), filesystem=store.fs, format="parquet"))


def read(kind: str, store: str | Store | None = None, **kw):
    """`scan(...).collect()`."""
    return scan(kind, store, **kw).collect()
