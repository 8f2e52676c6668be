"""Writer properties that are not about a backend: no polars needed, ids, sequence numbers."""

from __future__ import annotations

import json

from mkb.events import EventWriter, read, uuid7

from events_helpers import run_child


def test_writer_imports_and_writes_without_polars(tmp_path):
    res = run_child(
        """
        import sys
        sys.modules["polars"] = None  # any `import polars` now fails, as on the GPU host
        from mkb.events import EventWriter
        with EventWriter(sys.argv[1]) as w:
            w.emit("annotation", target_attempt_id="t", label="clean", reason="r", annotator="a")
        print(len(w.files_written))
        """,
        str(tmp_path / "ds"),
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1"


def test_uuid7_ids_are_unique_and_time_ordered():
    ids = [uuid7() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(i[14] == "7" for i in ids[:10])


def test_seq_counts_per_attempt_and_json_columns_accept_dicts(tmp_path):
    url = str(tmp_path / "ds")
    with EventWriter(url) as w:
        for i in range(3):
            w.emit("annotation", attempt_id="a", target_attempt_id="t", label="clean", reason=str(i), annotator="x")
        w.emit("annotation", attempt_id="b", target_attempt_id="t", label="clean", reason="b", annotator="x")
    df = read("annotation", url).sort("event_id")
    assert df["seq"].to_list() == [0, 1, 2, 0]
    from mkb.events import schema_for

    json_kind = next(k for k in ("timing", "verification", "characterisation") if any(c.type == "json" for c in schema_for(k).columns))
    col = next(c.name for c in schema_for(json_kind).columns if c.type == "json")
    from events_helpers import example_rows

    row = dict(example_rows(json_kind, 1)[0], **{col: {"a": [1, 2]}})
    with EventWriter(url) as w:
        w.emit(json_kind, **row)
    assert json.loads(read(json_kind, url)[col][0]) == {"a": [1, 2]}


def test_seq_stays_causal_when_a_grader_host_writes_events_of_the_attempt(tmp_path):
    """The attempt's writer reserves a block for a grading job; the grader's writer (another host) adopts it."""
    import pytest

    from mkb.events._envelope import SeqExhausted

    url = str(tmp_path / "ds")
    agent = EventWriter(url, run_id="run")
    grader = EventWriter(url, run_id="run")
    row = dict(target_attempt_id="t", label="clean", reason="r", annotator="a")
    agent.emit("annotation", attempt_id="A", **dict(row, reason="before submit"))
    block = agent.reserve_seq("A", 4)  # travels with the grading job
    agent.emit("annotation", attempt_id="A", **dict(row, reason="after the verdict"))
    grader.adopt_seq(block)
    for i in range(4):
        grader.emit("annotation", attempt_id="A", **dict(row, reason=f"grading {i}"))
    with pytest.raises(SeqExhausted, match="hint: reserve a larger block"):
        grader.emit("annotation", attempt_id="A", **row)
    agent.close()
    grader.close()
    df = read("annotation", url).sort("seq")
    assert df["reason"].to_list() == ["before submit", "grading 0", "grading 1", "grading 2", "grading 3", "after the verdict"]
    assert df["seq"].to_list() == [0, 1, 2, 3, 4, 5]
    assert df["writer"].n_unique() == 2


def test_a_buffered_writer_flushes_by_age_without_being_asked(tmp_path):
    import time

    url = str(tmp_path / "ds")
    w = EventWriter(url, flush_every=10**9, flush_after_s=0.2)
    w.emit("annotation", target_attempt_id="t", label="clean", reason="r", annotator="a")
    deadline = time.time() + 10
    while not w.files_written and time.time() < deadline:
        time.sleep(0.05)
    assert len(w.files_written) == 1 and read("annotation", url).height == 1  # durable within seconds, no flush() called
    w.close()


def test_background_compaction_keeps_the_file_count_bounded(tmp_path):
    import time

    from mkb.events._compact import compact_kind

    url = str(tmp_path / "ds")
    w = EventWriter(url, flush_every=5, compact_every_s=0.3)
    import mkb.events._compact as c

    real = c.compact_kind
    c.compact_kind = lambda *a, **k: real(*a, **{**k, "grace_s": 0})  # the test cannot wait out the default grace
    try:
        for i in range(200):
            w.emit("annotation", target_attempt_id=f"t{i}", label="clean", reason=str(i), annotator="a")
            if i % 20 == 0:
                time.sleep(0.2)
        w.close()
    finally:
        c.compact_kind = real
    assert len(w.files_written) >= 40  # one file per flush of 5 events
    left = list((tmp_path / "ds" / "kind=annotation").iterdir())
    assert len(left) <= len(w.files_written) // 3, f"{len(left)} files left of {len(w.files_written)} written"
    compact_kind("annotation", url, grace_s=0)
    assert len(list((tmp_path / "ds" / "kind=annotation").iterdir())) == 1
    assert sorted(read("annotation", url)["reason"].cast(int).to_list()) == list(range(200))


def test_a_payload_shape_seen_before_is_still_checked_for_every_value_that_can_fail(tmp_path):
    """emit checks a (keys, value types) shape once and then only int ranges: every other failure must still raise."""
    import pytest

    from mkb.events import SchemaError
    from events_helpers import example_rows

    url = str(tmp_path / "ds")
    good = {k: v for k, v in example_rows("verdict", 1)[0].items() if k != "attempt_id"}
    assert isinstance(good["problem"], int) and isinstance(good["speedup"], float)
    w = EventWriter(url)
    for _ in range(3):  # the shape is now known
        w.emit("verdict", attempt_id="a", **good)
    with pytest.raises(SchemaError, match=r"'problem' expects an int within int64"):
        w.emit("verdict", attempt_id="a", **dict(good, problem=2**63))
    with pytest.raises(SchemaError, match=r"'problem' expects an int within int64"):
        w.emit("verdict", attempt_id="a", **dict(good, problem=-(2**63) - 1))
    with pytest.raises(SchemaError, match=r"'speedup' expects a float or int"):
        w.emit("verdict", attempt_id="a", **dict(good, speedup="fast"))
    with pytest.raises(SchemaError, match=r"required column 'passed' is missing or null"):
        w.emit("verdict", attempt_id="a", **dict(good, passed=None))
    with pytest.raises(SchemaError, match=r"'attempt_id' expects a str"):
        w.emit("verdict", attempt_id=7, **good)
    with pytest.raises(SchemaError, match=r"envelope columns \['seq'\] are filled in by the writer"):
        w.emit("verdict", attempt_id="a", **dict(good, seq=3))
    w.emit("verdict", attempt_id="a", **dict(good, speedup=2))  # an int is a valid float64, checked and in range
    w.close()
    df = read("verdict", url).sort("seq")
    assert df.height == 4 and df["seq"].to_list() == [0, 1, 2, 3]
    assert df["speedup"].to_list() == [good["speedup"]] * 3 + [2.0]


def test_a_flush_mixing_checked_shapes_and_full_rows_keeps_emit_order_and_every_value(tmp_path):
    """Rows of a seen shape are buffered as values, others as dicts (a JSON dict, a list, a new shape): one file holds them all, in order."""
    from mkb.events import schema_for

    kind = next(k for k in ("timing", "verification", "characterisation") if any(c.type == "json" for c in schema_for(k).columns))
    from events_helpers import example_rows

    base = {k: v for k, v in example_rows(kind, 1)[0].items() if k != "attempt_id"}
    json_col = next(c.name for c in schema_for(kind).columns if c.type == "json")
    nullable = next(c.name for c in schema_for(kind).columns if c.nullable and c.name not in schema_for(kind).envelope and c.name != json_col)
    url = str(tmp_path / "ds")
    expected = []
    with EventWriter(url, flush_every=10**6) as w:
        for i in range(12):
            row = dict(base)
            if i % 4 == 1:
                row[json_col] = {"i": i}  # a dict: checked in full and serialised every time
            elif i % 4 == 2:
                row.pop(nullable)  # another shape of keys
            elif i % 4 == 3:
                row[nullable] = None
            attempt = f"a{i % 2}"
            eid = w.emit(kind, attempt_id=attempt, **row)
            expected.append((eid, attempt, json.loads(json.dumps(row[json_col])) if i % 4 == 1 else json.loads(row[json_col])))
        ids = w.emit_many(kind, [dict(base, attempt_id="a0"), dict(base, attempt_id="a1", **{json_col: {"many": 1}})])
        expected += [(ids[0], "a0", json.loads(base[json_col])), (ids[1], "a1", {"many": 1})]
    assert len(w.files_written) == 1
    df = read(kind, url)
    assert df["event_id"].to_list() == [e[0] for e in expected]  # file order is emit order
    assert df["attempt_id"].to_list() == [e[1] for e in expected]
    assert [json.loads(v) for v in df[json_col].to_list()] == [e[2] for e in expected]
    assert df["seq"].to_list() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    assert df.filter(df["event_id"].is_in([e[0] for i, e in enumerate(expected[:12]) if i % 4 in (2, 3)]))[nullable].null_count() == 6
    assert set(df["writer"].to_list()) == {w.writer_id} and set(df["run_id"].to_list()) == {w.run_id}
    assert df["kind"].unique().to_list() == [kind] and df["schema_version"].unique().to_list() == [schema_for(kind).version]


def _wait(cond, timeout: float = 20.0) -> bool:
    import time

    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.02)
    return cond()


def test_size_triggered_flushes_are_published_in_the_background_and_close_publishes_the_rest(tmp_path):
    url = str(tmp_path / "ds")
    w = EventWriter(url, flush_every=50)
    for i in range(120):
        w.emit("annotation", attempt_id="a", target_attempt_id="t", label="clean", reason=str(i), annotator="x")
    assert _wait(lambda: len(w.files_written) == 2)  # the two full batches, without a flush() from the caller
    assert read("annotation", url).height == 100 and w.pending_events == 20
    w.close()
    assert len(w.files_written) == 3 and w.pending_events == 0
    df = read("annotation", url).sort("seq")
    assert df["reason"].cast(int).to_list() == list(range(120)) and df["seq"].to_list() == list(range(120))


def test_a_failed_background_publish_keeps_the_rows_and_the_next_full_batch_raises_at_the_call_site(tmp_path, monkeypatch):
    import pytest

    import mkb.events._writer as writer_mod

    real = writer_mod.commit
    calls = {"n": 0}

    def full_disk_twice(store, target, data):
        if calls["n"] < 2:
            calls["n"] += 1
            raise OSError(28, "No space left on device", target)
        return real(store, target, data)

    monkeypatch.setattr(writer_mod, "commit", full_disk_twice)
    url = str(tmp_path / "ds")
    w = EventWriter(url, flush_every=10)
    row = dict(target_attempt_id="t", label="clean", annotator="x")
    for i in range(10):
        w.emit("annotation", attempt_id="a", reason=str(i), **row)
    assert _wait(lambda: bool(w.flush_errors)) and "No space left" in w.flush_errors[0]
    assert w.pending_events == 10 and w.files_written == []
    for i in range(10, 19):
        w.emit("annotation", attempt_id="a", reason=str(i), **row)
    with pytest.raises(OSError, match="No space left"):  # the batch it fills is published in the caller, which sees the failure
        w.emit("annotation", attempt_id="a", reason="19", **row)
    assert w.pending_events == 20
    w.close()  # the disk has room again
    assert len(w.files_written) == 2
    df = read("annotation", url).sort("seq")
    assert df["reason"].cast(int).to_list() == list(range(20)) and df["seq"].to_list() == list(range(20))


def test_threads_emitting_into_one_writer_lose_and_duplicate_nothing(tmp_path):
    import threading

    url = str(tmp_path / "ds")
    w = EventWriter(url, flush_every=97)

    def work(k: int) -> None:
        for i in range(400):
            w.emit("annotation", attempt_id=f"a{k}", target_attempt_id="t", label="clean", reason=str(i), annotator=str(k))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    df = read("annotation", url, dedupe=False)
    assert df.height == 1600 and df["event_id"].n_unique() == 1600
    for k in range(4):
        part = df.filter(df["attempt_id"] == f"a{k}").sort("seq")
        assert part["seq"].to_list() == list(range(400)) and part["reason"].cast(int).to_list() == list(range(400))


def test_a_full_batch_of_a_writer_dropped_without_close_is_still_published(tmp_path):
    import gc

    url = str(tmp_path / "ds")
    w = EventWriter(url, flush_every=30)
    for i in range(30):  # exactly one full batch, handed to the publisher
        w.emit("annotation", attempt_id="a", target_attempt_id="t", label="clean", reason=str(i), annotator="x")
    del w
    gc.collect()
    assert _wait(lambda: (tmp_path / "ds" / "kind=annotation").is_dir() and len(list((tmp_path / "ds" / "kind=annotation").iterdir())) == 1)
    assert sorted(read("annotation", url)["reason"].cast(int).to_list()) == list(range(30))


def test_uuid7_blocks_are_valid_ids_that_sort_between_the_ids_handed_out_before_and_after():
    import uuid

    from mkb.events._ids import uuid7_block

    before = [uuid7() for _ in range(3)]
    ms, small = uuid7_block(5)  # formatted id by id
    _, big = uuid7_block(300)  # formatted column-wise
    after = [uuid7() for _ in range(3)]
    ids = before + small + big + after
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for i in ids:
        u = uuid.UUID(i)
        assert str(u) == i and u.version == 7 and u.variant == uuid.RFC_4122
    assert len(small) == 5 and int(small[0][:8] + small[0][9:13], 16) == ms
    # the 62 random bits are random: no two ids of a block share their tail, and every variant digit occurs
    assert len({i[19:] for i in big}) == 300 and {i[19] for i in big} == set("89ab")


def test_a_uuid7_block_ends_where_its_millisecond_s_counters_do(monkeypatch):
    import time

    import mkb.events._ids as ids_mod

    for name in ("_last_ms", "_counter", "_prefix"):  # restored afterwards: later tests' ids must not carry this test's clock
        monkeypatch.setattr(ids_mod, name, getattr(ids_mod, name))
    frozen = time.time_ns() + 10_000_000
    monkeypatch.setattr(ids_mod.time, "time_ns", lambda: frozen)  # the clock stands still: every id takes the next counter
    first = ids_mod.uuid7()
    counter = int(first[15:18], 16)
    ms, block = ids_mod.uuid7_block(10_000)
    assert ms == frozen // 1_000_000 and len(block) == 0xFFF - counter  # only the counters left in this millisecond
    ms2, rest = ids_mod.uuid7_block(20)  # the next block borrows the next millisecond, as uuid7() does
    assert ms2 == ms + 1 and rest[0][15:18] == "000" and len(rest) == 20
    later = ids_mod.uuid7()
    assert [first] + block + rest + [later] == sorted({first, *block, *rest, later})
    assert int(later[:8] + later[9:13], 16) == ms + 1 and later[15:18] == "014"


def test_a_writer_s_event_ids_follow_emit_order_and_carry_the_millisecond_they_were_emitted_in(tmp_path, monkeypatch):
    """Ids come from blocks; a block the clock has left is dropped, so an id is never older than its event."""
    import time

    import mkb.events._ids as ids_mod

    for name in ("_last_ms", "_counter", "_prefix"):  # restored afterwards: later tests' ids must not carry this test's clock
        monkeypatch.setattr(ids_mod, name, getattr(ids_mod, name))
    now = [time.time_ns() + 10_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])  # the clock the writer and the id generator read
    url = str(tmp_path / "ds")
    row = dict(target_attempt_id="t", label="clean", annotator="x")
    ids, ms = [], []
    with EventWriter(url, flush_every=10**6) as w:
        for i in range(300):
            if i % 7 == 0:
                now[0] += 1_000_000 * (1 + i % 3)  # the clock moves on by 1-3 ms
            ids.append(w.emit("annotation", attempt_id="a", reason=str(i), **row))
            ms.append(now[0] // 1_000_000)
        ids += w.emit_many("annotation", [dict(row, attempt_id="a", reason=str(300 + i)) for i in range(50)])
        ms += [now[0] // 1_000_000] * 50
        now[0] += 5_000_000
        ids.append(w.emit("annotation", attempt_id="a", reason="350", annotator="x", label="clean", target_attempt_id="t"))  # a new shape: the full check
        ms.append(now[0] // 1_000_000)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [int(i[:8] + i[9:13], 16) for i in ids] == ms
    df = read("annotation", url)
    assert df["event_id"].to_list() == ids and df["reason"].cast(int).to_list() == list(range(351))


def test_event_files_dictionary_encode_every_column_but_event_id_and_ts(tmp_path):
    """event_id and ts differ on (nearly) every row: written plain; the rest (list columns too) keep their dictionary."""
    import pyarrow.parquet as pq

    from mkb.events import schema_for
    from events_helpers import example_rows

    kind = next(k for k in ("attempt_started", "integrity", "plan") if any(c.type.startswith("list[") for c in schema_for(k).columns))
    url = str(tmp_path / "ds")
    with EventWriter(url) as w:
        w.emit_many(kind, example_rows(kind, 50))

    def dictionary_encoded(source) -> set[str]:
        md = pq.ParquetFile(source).metadata.row_group(0)
        return {md.column(i).path_in_schema for i in range(md.num_columns) if any("DICTIONARY" in e for e in md.column(i).encodings)}

    table = pq.read_table(w.files_written[0])
    pq.write_table(table, tmp_path / "default.parquet")  # pyarrow's default: every column it can (not bools)
    default = dictionary_encoded(tmp_path / "default.parquet")
    assert {"event_id", "ts", "seq"} <= default and any(".list." in p for p in default)
    assert dictionary_encoded(w.files_written[0]) == default - {"event_id", "ts"}


def test_a_forked_child_does_not_reuse_its_parent_s_block_of_ids(tmp_path, monkeypatch):
    import os
    import time

    import pytest

    import mkb.events._ids as ids_mod

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    for name in ("_last_ms", "_counter", "_prefix"):
        monkeypatch.setattr(ids_mod, name, getattr(ids_mod, name))
    frozen = time.time_ns() + 10_000_000
    monkeypatch.setattr(time, "time_ns", lambda: frozen)  # the block stays fresh: only the fork may retire it
    w = EventWriter(str(tmp_path / "ds"), flush_every=10**6)
    row = dict(target_attempt_id="t", label="clean", reason="r", annotator="x")
    w.emit("annotation", attempt_id="a", **row)  # the writer now holds a block of ids
    r, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the id its next event gets, and leave without running the parent's exit handlers
        try:
            os.write(wr, w.emit("annotation", attempt_id="a", **row).encode())
        finally:
            os._exit(0)
    os.close(wr)
    os.waitpid(pid, 0)
    child_id = os.read(r, 100).decode()
    os.close(r)
    parent_id = w.emit("annotation", attempt_id="a", **row)
    assert len(child_id) == 36 and child_id != parent_id
    w._buffers.clear()  # nothing of this writer is to be written
    w._n_buffered = 0
    w.close()


def test_emit_many_whose_seq_block_runs_out_buffers_none_of_the_batch(tmp_path):
    """All or nothing: a batch that would overrun the adopted seq block raises before any of its rows is buffered."""
    import pytest

    from mkb.events._envelope import SeqExhausted

    url = str(tmp_path / "ds")
    agent = EventWriter(url)
    block = agent.reserve_seq("A", 3)
    grader = EventWriter(url, flush_every=10**6)
    grader.adopt_seq(block)
    row = dict(target_attempt_id="t", label="clean", annotator="a")
    grader.emit("annotation", attempt_id="A", reason="0", **row)
    grader.emit("annotation", attempt_id="B", reason="other attempt", **row)
    with pytest.raises(SeqExhausted):
        grader.emit_many("annotation", [dict(row, attempt_id="A", reason=str(i)) for i in (1, 2, 3)])
    assert grader.pending_events == 2
    grader.close()
    agent.close()
    assert sorted(read("annotation", url)["reason"].to_list()) == ["0", "other attempt"]
