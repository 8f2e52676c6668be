"""The store's batched read (iter_batches / read_batches), on every backend: batches of whole files, only the columns asked
for, hostile files skipped and named, and under compaction every row once (never fewer, never twice)."""

from __future__ import annotations

import threading
import time

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mkb.events import EventWriter, ListingChanged, ScanReport, iter_batches, read, read_batches, resolve_store, rows_to_table, schema_for


def _flushes(store_url: str, files: int, per: int, *, attempt: str = "a0") -> EventWriter:
    w = EventWriter(store_url, flush_every=10**9)
    for f in range(files):
        for i in range(per):
            w.emit("annotation", attempt_id=attempt, target_attempt_id=f"t{f}-{i}", label="clean", reason=f"{f}.{i}", annotator="test")
        w.flush()
    return w


def _put(store_url: str, name: str, data: bytes) -> str:
    store = resolve_store(store_url)
    path = f"{store.kind_dir('annotation')}/{name}.parquet"
    store.fs.pipe_file(path, data)
    return path


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_batches_are_whole_files_up_to_batch_rows_with_only_the_columns_asked(store_url):
    _flushes(store_url, 5, 10)
    batches = list(iter_batches("annotation", store_url, columns=["target_attempt_id", "reason"], batch_rows=20))
    assert [b.height for b in batches] == [20, 20, 10]  # two files of 10 fit 20 rows; a third would not
    assert all(b.columns == ["target_attempt_id", "reason"] for b in batches)
    whole = read("annotation", store_url).select("target_attempt_id", "reason")
    assert pl.concat(batches).sort("target_attempt_id").equals(whole.sort("target_attempt_id"))
    # a file larger than batch_rows is a batch of its own, never split
    assert [b.height for b in iter_batches("annotation", store_url, columns=["reason"], batch_rows=3)] == [10] * 5
    with pytest.raises(Exception, match="no column 'nope'"):
        list(iter_batches("annotation", store_url, columns=["nope"]))


def test_batches_skip_and_name_every_hostile_file(store_url):
    w = _flushes(store_url, 3, 4)
    store = resolve_store(store_url)
    data = store.fs.cat_file(w.files_written[0])
    schema = schema_for("annotation")
    rows = [dict(event_id=f"x-{i}", kind="annotation", schema_version=schema.version, ts=0, run_id="r", seq=i, writer="w", mkb_version="0",
                 attempt_id="a", target_attempt_id=f"x{i}", label="clean", reason="r", annotator="t") for i in range(50)]
    good = rows_to_table(schema, rows)
    no_id = good.drop_columns(["event_id"]).replace_schema_metadata(good.schema.metadata)
    footer = int.from_bytes(data[-8:-4], "little") + 8
    corrupt = bytes(data[:4]) + bytes((b * 7 + 13) & 0xFF for b in data[4:len(data) - footer - 1]) + bytes(data[len(data) - footer - 1:])
    bad = {
        _put(store_url, "0-torn", data[: len(data) // 2]): "torn",
        _put(store_url, "1-foreign", _parquet(pa.table({"x": [1, 2]}))): "foreign",
        _put(store_url, "2-no-event-id", _parquet(no_id)): "required column 'event_id' is missing",
        _put(store_url, "3-corrupt-pages", corrupt): "corrupt data pages",
    }
    report = ScanReport()
    with pytest.warns(UserWarning) as record:
        batches = list(iter_batches("annotation", store_url, columns=["target_attempt_id"], batch_rows=4, report=report, dedupe=False))
    assert sum(b.height for b in batches) == 12 and len(batches) == 3
    said = "\n".join(str(r.message) for r in record)
    for path, why in bad.items():
        assert why in report.skipped[path], (path, report.skipped.get(path))
        assert path in said
    # read_batches names them the same way and keeps every good row
    report = ScanReport()
    with pytest.warns(UserWarning):
        df = read_batches("annotation", store_url, columns=["target_attempt_id"], batch_rows=4, report=report, dedupe=False)
    assert df.height == 12 and set(bad) <= set(report.skipped)


def test_files_sharing_event_ids_are_one_batch_de_duplicated(store_url):
    w = _flushes(store_url, 3, 5)
    store = resolve_store(store_url)
    copy = _put(store_url, "zz-copy", store.fs.cat_file(w.files_written[1]))  # a copied file: its ids twice
    assert copy
    batches = list(iter_batches("annotation", store_url, columns=["target_attempt_id"], batch_rows=5))
    ids = pl.concat(batches)["target_attempt_id"]
    assert ids.len() == 15 and ids.n_unique() == 15
    assert sorted(b.height for b in batches) == [5, 5, 5]  # the file and its copy: one batch, de-duplicated
    assert read_batches("annotation", store_url, columns=["reason"], dedupe=False).height == 20


def test_a_compaction_during_the_read_restarts_it_and_every_row_is_seen_once(store_url):
    from mkb.events._compact import compact_kind

    _flushes(store_url, 6, 5)
    calls = []

    def reduce(lf: pl.LazyFrame) -> pl.LazyFrame:
        if not calls:  # after the first batch: the sources of the rest are merged and deleted (grace 0)
            compact_kind("annotation", store_url, target_rows=1000, grace_s=0)
        calls.append(1)
        return lf.select("event_id")

    with pytest.raises(ListingChanged, match="vanished"):
        for i, _ in enumerate(iter_batches("annotation", store_url, columns=["target_attempt_id"], batch_rows=5)):
            if i == 0:
                compact_kind("annotation", store_url, target_rows=1000, grace_s=0)
    _flushes(store_url, 4, 5, attempt="a1")  # small files again, for the reducer's compaction to merge
    df = read_batches("annotation", store_url, columns=["event_id"], reduce=reduce, batch_rows=5)
    assert df.columns == ["event_id"] and df.height == 50 and df["event_id"].n_unique() == 50
    assert len(calls) >= 2


def test_batched_readers_under_concurrent_compaction_never_see_fewer_rows_nor_duplicates(store_url):
    from mkb.events._compact import compact_kind

    flushes, per = 8, 5
    errors, seen = [], []
    done = threading.Event()
    first = threading.Event()

    def writer():
        try:
            w = EventWriter(store_url, flush_every=10**9)
            for f in range(flushes):
                for i in range(per):
                    w.emit("annotation", attempt_id="w", target_attempt_id=f"t{f}-{i}", label="clean", reason="r", annotator="t")
                w.flush()
                first.set()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(("writer", repr(exc)))

    def compactor():
        try:
            while not done.is_set():
                compact_kind("annotation", store_url, target_rows=12, grace_s=0, lease_ttl_s=30)
        except Exception as exc:
            errors.append(("compactor", repr(exc)))

    def reader():
        last = 0
        try:
            while not done.is_set():
                df = read_batches("annotation", store_url, columns=["event_id"], batch_rows=5, dedupe=False)
                n = df.height
                assert df["event_id"].n_unique() == n, f"saw {n - df['event_id'].n_unique()} duplicated rows"
                assert last <= n <= flushes * per, f"saw {n} rows after {last}"
                last = n
                seen.append(n)
        except Exception as exc:
            errors.append(("reader", repr(exc)))

    w = threading.Thread(target=writer)
    w.start()
    assert first.wait(30)
    others = [threading.Thread(target=compactor), threading.Thread(target=reader)]
    for t in others:
        t.start()
    w.join()
    time.sleep(0.3)
    done.set()
    for t in others:
        t.join()
    assert errors == [] and seen
    assert read_batches("annotation", store_url, columns=["event_id"], dedupe=False).height == flushes * per


def test_an_index_that_vouches_for_a_bad_file_is_caught_and_not_used_again(store_url):
    """A segment saying a file's required column is null-free when it is not (a file replaced in place at the same size):
    the batch shows the nulls, iter_batches says the listing changed, and the next iteration reads the files' own footers."""
    import dataclasses

    import mkb.events._index as idx
    from mkb.events._reader import clear_caches, inspect_files

    _flushes(store_url, 2, 3)
    schema = schema_for("annotation")
    rows = [dict(event_id=f"z-{i}", kind="annotation", schema_version=schema.version, ts=0, run_id="r", seq=i, writer="w", mkb_version="0",
                 attempt_id="a", target_attempt_id=f"z{i}", label=None, reason="r", annotator="t") for i in range(20)]
    table = rows_to_table(schema, [dict(r, label="x") for r in rows])
    bad = table.set_column(table.schema.get_field_index("label"), pa.field("label", pa.string()), pa.array([None] * 20, pa.string()))
    path = _put(store_url, "zz-replaced", _parquet(bad.replace_schema_metadata(table.schema.metadata)))
    store = resolve_store(store_url)
    info = inspect_files(store, [(path, store.fs.size(path))])[0]
    idx.write(store, "annotation", [dataclasses.replace(info, null_counts=tuple((c, 0) for c, _ in info.null_counts))])
    for read_it in ("iterate", "read_batches"):
        clear_caches()  # a fresh process: the forged segment is trusted at first
        report = ScanReport()
        if read_it == "iterate":
            with pytest.raises(ListingChanged, match="footer index is stale") as caught:
                list(iter_batches("annotation", store_url, columns=["label"], batch_rows=3, report=report))
            assert caught.value.distrust_index
            with pytest.warns(UserWarning, match="holds 20 null"):
                df = pl.concat(iter_batches("annotation", store_url, columns=["label"], batch_rows=3, report=report))
        else:
            with pytest.warns(UserWarning, match="holds 20 null"):
                df = read_batches("annotation", store_url, columns=["label"], batch_rows=3, report=report)
        assert df.height == 6 and df["label"].null_count() == 0
        assert "required column 'label' holds 20 null(s)" in report.skipped[path]
