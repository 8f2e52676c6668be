"""The event-store contract, run unchanged against every backend (local folder, memory://, moto S3, SeaweedFS S3)."""

from __future__ import annotations

import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mkb.events import EventWriter, NewerSchemaError, ScanReport, SchemaError, read, resolve_store, rows_to_table, schema_for, schemas, write_table
from mkb.events._schema import META_VERSION

from events_helpers import example_rows, run_child, wait_for


def _names(store_url: str, kind: str) -> list[str]:
    store = resolve_store(store_url)
    d = store.kind_dir(kind)
    store.fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in store.fs.ls(d, detail=False)) if store.fs.exists(d) else []


def _annotations(store_url: str, n: int, *, start: int = 0, attempt: str = "a0", flush: bool = True) -> EventWriter:
    w = EventWriter(store_url, flush_every=10**9)
    for i in range(start, start + n):
        w.emit("annotation", attempt_id=attempt, target_attempt_id=f"t{i}", label="clean", reason=str(i), annotator="test")
    if flush:
        w.flush()
    return w


def test_every_kind_round_trips(store_url):
    written = {}
    with EventWriter(store_url) as w:
        for kind in schemas():
            rows = example_rows(kind, 4)
            w.emit_many(kind, [dict(r, attempt_id=f"att-{i}") for i, r in enumerate(rows)])
            written[kind] = rows
    for kind, rows in written.items():
        df = read(kind, store_url).sort("attempt_id")
        assert df.height == len(rows), kind
        assert df["kind"].unique().to_list() == [kind]
        assert df["schema_version"].unique().to_list() == [schema_for(kind).version]
        for col in rows[0]:
            if col == "attempt_id":
                continue
            assert df[col].to_list() == [r[col] for r in rows], f"{kind}.{col}"


def test_bad_rows_are_rejected_at_the_call_site_and_nothing_is_written(store_url):
    good = example_rows("verdict", 1)[0]
    w = EventWriter(store_url)
    with pytest.raises(SchemaError, match=r"unknown column 'speedupp' \(did you mean 'speedup'\?\)[\s\S]*hint:"):
        w.emit("verdict", **dict(good, speedupp=2.0))
    with pytest.raises(SchemaError, match=r"required column 'passed' is missing[\s\S]*hint:"):
        w.emit("verdict", **{k: v for k, v in good.items() if k != "passed"})
    with pytest.raises(SchemaError, match=r"verdict row 2: column 'speedup' expects a float or int \(float64\), got str 'fast'"):
        w.emit_many("verdict", [good, good, dict(good, speedup="fast"), good])
    with pytest.raises(SchemaError, match=r"'problem' expects an int within int64"):
        w.emit("verdict", **dict(good, problem=2**64))
    with pytest.raises(SchemaError, match="unknown event kind 'verdicts'"):
        w.emit("verdicts", **good)
    w.close()
    assert w.files_written == []
    assert _names(store_url, "verdict") == []


def test_writer_never_overwrites_a_file(store_url):
    schema = schema_for("annotation")
    first = rows_to_table(schema, [dict(r, event_id="e1", kind="annotation", schema_version=schema.version, ts=1, run_id="r", seq=0, writer="w", mkb_version="0") for r in example_rows("annotation", 1)])
    path = write_table(store_url, "annotation", first, name="fixed.parquet")
    store = resolve_store(store_url)
    before = store.fs.cat_file(path)
    with pytest.raises(FileExistsError, match="never overwrites"):
        write_table(store_url, "annotation", first.slice(0, 0), name="fixed.parquet")
    assert store.fs.cat_file(path) == before
    assert read("annotation", store_url).height == 1


def test_sigkill_mid_flush_leaves_no_partial_file_and_loses_nothing_flushed(store_url, multiprocess, tmp_path):
    marker = tmp_path / "mid-flush"
    child = run_child(
        """
        import os, sys, time
        import mkb.events._commit as c
        from mkb.events import EventWriter
        url, marker = sys.argv[1:]
        w = EventWriter(url, flush_every=10**9)
        for i in range(100):
            w.emit("annotation", attempt_id="a", target_attempt_id=f"t{i}", label="clean", reason=str(i), annotator="t")
        w.flush()
        for i in range(100, 150):
            w.emit("annotation", attempt_id="a", target_attempt_id=f"t{i}", label="clean", reason=str(i), annotator="t")
        def stall():
            open(marker, "w").close()
            time.sleep(120)
        def half_local(fd, data):  # the staging file gets half its bytes, then the process dies
            os.write(fd, data[: len(data) // 2]); os.fsync(fd); stall()
        real_create = c._create
        def half_remote(fs, path, data):  # the upload has begun and not completed
            if ".mkb-probe" in path:
                return real_create(fs, path, data)
            f = fs.open(path, "xb"); f.write(data[: len(data) // 2]); f.flush(); stall()
        c._write_fully, c._create = half_local, half_remote
        w.flush()
        """,
        store_url, str(marker), wait=False,
    )
    wait_for(marker, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    report = ScanReport()
    df = read("annotation", store_url, report=report)
    assert sorted(df["reason"].cast(int).to_list()) == list(range(100))
    assert report.skipped == {}
    assert len(_names(store_url, "annotation")) == 1, _names(store_url, "annotation")


def test_eight_writer_processes_lose_and_duplicate_nothing(store_url, multiprocess):
    code = """
        import sys
        from mkb.events import EventWriter
        url, k = sys.argv[1], sys.argv[2]
        with EventWriter(url, flush_every=40) as w:
            for i in range(120):
                w.emit("annotation", attempt_id=f"w{k}", target_attempt_id=f"t{i}", label="clean", reason=str(i), annotator=k)
        """
    procs = [run_child(code, store_url, str(k), wait=False) for k in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    df = read("annotation", store_url, dedupe=False)
    assert df.height == 8 * 120
    assert df["event_id"].n_unique() == df.height
    for k in range(8):
        part = df.filter(df["attempt_id"] == f"w{k}")
        assert sorted(part["reason"].cast(int).to_list()) == list(range(120))
        assert sorted(part["seq"].to_list()) == list(range(120))
    assert len(_names(store_url, "annotation")) == 8 * 3


def test_torn_or_foreign_files_are_reported_by_name_and_skipped(store_url):
    w = _annotations(store_url, 10)
    good = w.files_written[0]
    store = resolve_store(store_url)
    data = store.fs.cat_file(good)
    d = store.kind_dir("annotation")
    torn, foreign, junk, other_kind = (f"{d}/{n}.parquet" for n in ("0-torn", "1-foreign", "2-junk", "3-other-kind"))
    store.fs.pipe_file(torn, data[: len(data) // 2])
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"x": [1, 2]}), sink)
    store.fs.pipe_file(foreign, sink.getvalue().to_pybytes())
    store.fs.pipe_file(junk, b"not parquet at all")
    verdicts = rows_to_table(schema_for("verdict"), [dict(r, event_id="v", kind="verdict", schema_version="1.0", ts=0, run_id="r", seq=0, writer="w", mkb_version="0") for r in example_rows("verdict", 1)])
    sink = pa.BufferOutputStream()
    pq.write_table(verdicts, sink)
    store.fs.pipe_file(other_kind, sink.getvalue().to_pybytes())
    report = ScanReport()
    with pytest.warns(UserWarning) as record:
        df = read("annotation", store_url, report=report)
    assert df.height == 10
    bad = {torn, foreign, junk, other_kind}
    assert set(report.skipped) == bad
    said = "\n".join(str(r.message) for r in record)
    for path in bad:
        assert path in said
    assert "torn" in report.skipped[torn] and "foreign" in report.skipped[foreign] and "'verdict'" in report.skipped[other_kind]


def test_a_newer_major_version_is_refused_with_a_hint(store_url):
    w = _annotations(store_url, 3)
    table = pq.read_table(resolve_store(store_url).fs.open(w.files_written[0], "rb"))
    newer = table.replace_schema_metadata({**table.schema.metadata, META_VERSION: b"2.0"})
    write_table(store_url, "annotation", newer)
    with pytest.raises(NewerSchemaError, match=r"schema 2\.0, newer than this mkb reads \(1\.\d+\)[\s\S]*hint: upgrade mkb"):
        read("annotation", store_url)


def test_an_older_minor_version_reads_with_nulls_and_a_newer_minor_without_its_extra_columns(store_url, schema_v11):
    # written under 1.0 (no `note` column), read by an mkb whose annotation schema is 1.1 with a nullable `note`
    old_rows = example_rows("annotation", 3)
    table = rows_to_table(schema_v11["old"], [dict(r, event_id=f"o{i}", kind="annotation", schema_version="1.0", ts=0, run_id="r", seq=i, writer="w", mkb_version="0") for i, r in enumerate(old_rows)])
    write_table(store_url, "annotation", table)
    schema_v11["activate"]()
    with EventWriter(store_url) as w:
        w.emit("annotation", **dict(example_rows("annotation", 1)[0], note="new"))
    # and a file from the future: minor 1.7 with a column nobody here knows
    cur = schema_for("annotation")
    fut = rows_to_table(cur, [dict(r, event_id="f0", kind="annotation", schema_version="1.7", ts=0, run_id="r", seq=0, writer="w", mkb_version="9", note=None) for r in example_rows("annotation", 1)])
    fut = fut.append_column("from_the_future", pa.array([1.0])).replace_schema_metadata({**fut.schema.metadata, META_VERSION: b"1.7"})
    future_path = write_table(store_url, "annotation", fut)
    report = ScanReport()
    with pytest.warns(UserWarning, match=r"columns \['from_the_future'\] are not read"):
        df = read("annotation", store_url, report=report).sort("event_id")
    assert df.height == 5
    assert "from_the_future" not in df.columns
    assert df.filter(df["schema_version"] == "1.0")["note"].to_list() == [None] * 3
    assert df.filter(df["schema_version"] == "1.1")["note"].to_list() == ["new"]
    assert report.newer_minor == {future_path: "1.7"}


def test_reads_de_duplicate_on_event_id(store_url):
    w = _annotations(store_url, 5)
    store = resolve_store(store_url)
    data = store.fs.cat_file(w.files_written[0])
    store.fs.pipe_file(f"{store.kind_dir('annotation')}/copy.parquet", data)  # e.g. a file copied in twice
    assert read("annotation", store_url, dedupe=False).height == 10
    assert read("annotation", store_url).height == 5


def test_compaction_preserves_rows(store_url):
    for k in range(6):
        _annotations(store_url, 7, start=7 * k, attempt=f"a{k}")
    before = read("annotation", store_url).sort("event_id")
    from mkb.events._compact import compact

    [res] = compact(store_url, target_rows=1000, grace_s=0)
    assert (res.files_before, res.files_after, res.rows) == (6, 1, 42)
    assert len(_names(store_url, "annotation")) == 1, res
    after = read("annotation", store_url).sort("event_id")
    assert after.equals(before)


@pytest.mark.parametrize("kill_at", ["written", "deleted#1", "deleted#3"])
def test_compaction_killed_half_way_changes_nothing_visible(store_url, multiprocess, tmp_path, kill_at):
    for k in range(4):
        _annotations(store_url, 5, start=5 * k, attempt=f"a{k}")
    before = read("annotation", store_url).sort("event_id")
    marker = tmp_path / "stalled"
    child = run_child(
        """
        import sys, time
        from mkb.events._compact import compact_kind
        url, kill_at, marker = sys.argv[1:]
        step, _, nth = kill_at.partition("#")
        seen = {}
        def on_step(name, path):
            seen[name] = seen.get(name, 0) + 1
            if name == step and seen[name] == int(nth or 1):
                open(marker, "w").close()
                time.sleep(120)
        compact_kind("annotation", url, target_rows=1000, grace_s=0, lease_ttl_s=1.0, on_step=on_step)
        """,
        store_url, kill_at, str(marker), wait=False,
    )
    wait_for(marker, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    mid = read("annotation", store_url).sort("event_id")
    assert mid.equals(before)
    from mkb.events._compact import compact_kind

    import time

    deadline = time.time() + 20
    while (res := compact_kind("annotation", store_url, target_rows=1000, grace_s=0)).held_by is not None:  # the dead one's lease expires,
        assert time.time() < deadline
        time.sleep(0.2)
    # then a second run finishes the job
    assert read("annotation", store_url).sort("event_id").equals(before)
    assert len(_names(store_url, "annotation")) == 1, res


# ---------------------------------------------------------------- Lease (exclusive create only)


def test_lease_is_exclusive_until_released_and_tokens_increase(store_url):
    from mkb.events import Lease, LeaseInfo

    assert Lease.peek(store_url, "compact/annotation") is None
    a = Lease.acquire(store_url, "compact/annotation", holder="host-a", ttl_s=30)
    assert a is not None and a.holder == "host-a" and a.token >= 1
    info = Lease.peek(store_url, "compact/annotation")
    assert isinstance(info, LeaseInfo) and (info.holder, info.token, info.name) == ("host-a", a.token, "compact/annotation")
    assert info.expires_at > __import__("time").time() + 20
    assert Lease.acquire(store_url, "compact/annotation", holder="host-b") is None
    assert Lease.acquire(store_url, "compact/annotation", holder="host-a") is None  # even the same holder string
    assert Lease.acquire(store_url, "compact/verdict", holder="host-b") is not None  # names are independent
    a.renew()
    a.renew()
    assert Lease.peek(store_url, "compact/annotation").token == a.token
    a.release()
    assert Lease.peek(store_url, "compact/annotation") is None
    b = Lease.acquire(store_url, "compact/annotation", holder="host-b")
    assert b is not None and b.token > a.token
    with pytest.raises(ValueError, match="lease name"):
        Lease.acquire(store_url, "../escape", holder="x")


def test_lease_expires_and_a_stale_holder_is_fenced_off(store_url):
    import time

    from mkb.events import Lease, LeaseLost

    a = Lease.acquire(store_url, "claim/c1", holder="a", ttl_s=1.0)
    assert Lease.acquire(store_url, "claim/c1", holder="b", ttl_s=1.0) is None
    time.sleep(1.1)
    a.renew()  # expired but nobody took it: renewing still works
    assert Lease.peek(store_url, "claim/c1").holder == "a"
    time.sleep(1.1)
    assert Lease.peek(store_url, "claim/c1") is None
    b = Lease.acquire(store_url, "claim/c1", holder="b", ttl_s=30)
    assert b is not None and b.token > a.token
    with pytest.raises(LeaseLost, match=r"taken over by 'b'[\s\S]*hint:"):
        a.renew()
    assert Lease.peek(store_url, "claim/c1").holder == "b"  # the loser's give-up does not free b's lease
    b.renew()
    a.release()  # a no-op for a lost lease
    assert Lease.peek(store_url, "claim/c1").token == b.token


def test_lease_of_a_killed_holder_expires(store_url, multiprocess, tmp_path):
    import time

    from mkb.events import Lease

    marker = tmp_path / "holding"
    child = run_child(
        """
        import sys, time
        from mkb.events import Lease
        url, marker = sys.argv[1:]
        lease = Lease.acquire(url, "compact/verdict", holder="doomed", ttl_s=1.0)
        assert lease is not None
        open(marker, "w").close()
        while True:
            time.sleep(0.2)
            lease.renew()
        """,
        store_url, str(marker), wait=False,
    )
    wait_for(marker, child)
    held = Lease.peek(store_url, "compact/verdict")
    assert held is not None and held.holder == "doomed"
    time.sleep(1.2)
    assert Lease.acquire(store_url, "compact/verdict", holder="other") is None  # the live holder kept renewing
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    deadline = time.time() + 10
    got = None
    while got is None and time.time() < deadline:
        got = Lease.acquire(store_url, "compact/verdict", holder="other", ttl_s=30)
        time.sleep(0.1)
    assert got is not None and got.token > held.token


def test_racing_acquirers_get_one_holder(store_url):
    import threading

    from mkb.events import Lease

    won, barrier = [], threading.Barrier(6)

    def race(i):
        barrier.wait()
        lease = Lease.acquire(store_url, "claim/race", holder=f"h{i}", ttl_s=30)
        if lease is not None:
            won.append(lease)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert Lease.peek(store_url, "claim/race").holder == won[0].holder


def test_a_late_renewal_racing_a_takeover_leaves_at_most_one_holder(store_url, monkeypatch):
    """The holder renews after its expiry just as another host takes over: whoever checks second backs off."""
    import time

    import mkb.events._lease as L
    from mkb.events import Lease, LeaseLost

    a = Lease.acquire(store_url, "claim/late", holder="a", ttl_s=0.2)
    time.sleep(0.3)
    a.ttl_s = 30  # its renewals from now on last (a loaded test machine must not expire them mid-test)
    real_list, calls = L._list, []

    def list_with_renewal_in_between(store, folder):
        state = real_list(store, folder)
        calls.append(1)
        if len(calls) == 1:  # b has decided a expired; a renews before b creates its token
            a.renew()
        return state

    monkeypatch.setattr(L, "_list", list_with_renewal_in_between)
    b = Lease.acquire(store_url, "claim/late", holder="b", ttl_s=30)
    monkeypatch.setattr(L, "_list", real_list)
    assert b is None  # b saw a's renewal after creating its token, and voided it
    assert Lease.peek(store_url, "claim/late").holder == "a"
    a.renew()  # a still holds
    c = Lease.acquire(store_url, "claim/late", holder="c", ttl_s=30)
    assert c is None
    a.release()
    c = Lease.acquire(store_url, "claim/late", holder="c", ttl_s=30)
    assert c is not None and c.token > a.token
    with pytest.raises(LeaseLost):
        a.renew()


# ---------------------------------------------------------------- an experiment's load: concurrent compaction, hostile files


def _envelope_rows(kind: str, n: int, *, prefix: str, version: str | None = None) -> list[dict]:
    v = version or schema_for(kind).version
    return [dict(r, event_id=f"{prefix}-{i:05d}", kind=kind, schema_version=v, ts=0, run_id="r", seq=i, writer="w", mkb_version="0")
            for i, r in enumerate(example_rows(kind, n))]


def test_concurrent_compactions_with_writers_and_readers(store_url):
    """Three compactors at once (grace 0, the harshest), two writers and two readers: readers never fail,
    never see fewer rows than before nor more than were written; afterwards raw rows equal unique rows."""
    import threading
    import time

    from mkb.events._compact import compact_kind

    n_writers, flushes, per = 2, 6, 5
    total = n_writers * flushes * per
    errors, seen = [], {}
    done = threading.Event()
    first_flush = threading.Event()  # a local store exists from its first write; a reader before it gets "does not exist"

    def writer(k):
        try:
            w = EventWriter(store_url, flush_every=10**9)
            for f in range(flushes):
                for i in range(per):
                    w.emit("annotation", attempt_id=f"w{k}", target_attempt_id=f"t{f}-{i}", label="clean", reason="r", annotator="t")
                w.flush()
                first_flush.set()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(("writer", repr(exc)))

    def compactor(k):
        try:
            while not done.is_set():
                compact_kind("annotation", store_url, target_rows=12, grace_s=0, lease_ttl_s=30)
        except Exception as exc:
            errors.append(("compactor", repr(exc)))

    def reader(k):
        last = 0
        counts = seen.setdefault(k, [])
        try:
            while not done.is_set():
                df = read("annotation", store_url, dedupe=False)
                n = df.height
                assert df["event_id"].n_unique() == n, f"reader {k} saw {n - df['event_id'].n_unique()} duplicated rows"
                assert last <= n <= total, f"reader {k} saw {n} rows after {last} (written {total})"
                last = n
                counts.append(n)
        except Exception as exc:
            errors.append(("reader", repr(exc)))

    writers = [threading.Thread(target=writer, args=(k,)) for k in range(n_writers)]
    others = [threading.Thread(target=compactor, args=(k,)) for k in range(3)] + [threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in writers:
        t.start()
    assert first_flush.wait(30)
    for t in others:
        t.start()
    for t in writers:
        t.join()
    time.sleep(0.5)
    deadline = time.monotonic() + 120  # on a loaded machine a reader may not have finished a read yet: wait for one each
    while time.monotonic() < deadline and not errors and not (len(seen) == 2 and all(seen.values())):
        time.sleep(0.05)
    done.set()
    for t in others:
        t.join()
    assert errors == []
    assert len(seen) == 2 and all(c for c in seen.values())
    compact_kind("annotation", store_url, target_rows=12, grace_s=0)
    raw = read("annotation", store_url, dedupe=False)
    assert raw.height == raw["event_id"].n_unique() == total


def test_a_second_compaction_while_one_holds_the_lease_does_nothing(store_url):
    from mkb.events import Lease
    from mkb.events._compact import compact_kind

    for k in range(3):
        _annotations(store_url, 3, start=3 * k)
    held = Lease.acquire(store_url, "compact/annotation", holder="elsewhere")
    res = compact_kind("annotation", store_url, target_rows=1000, grace_s=0)
    assert res.held_by is not None and res.held_by.holder == "elsewhere" and res.written == [] and res.deleted == []
    held.release()
    res = compact_kind("annotation", store_url, target_rows=1000, grace_s=0)
    assert res.held_by is None and len(res.written) == 1


def test_duplicates_left_by_racing_compactions_of_an_older_mkb_are_healed(store_url):
    """Two lease-less compactions merged the same sources into two files at the target size and deleted the sources."""
    import json

    from mkb.events._compact import compact_kind
    from mkb.events._schema import META_COMPACTED_FROM

    ws = [_annotations(store_url, 5, start=5 * k, attempt=f"a{k}") for k in range(2)]
    store = resolve_store(store_url)
    sources = [p for w in ws for p in w.files_written]
    table = pa.concat_tables([pq.read_table(store.fs.open(p, "rb")) for p in sources])
    for _ in range(2):
        meta = {**table.schema.metadata, META_COMPACTED_FROM: json.dumps([p.rsplit("/", 1)[-1] for p in sources]).encode()}
        write_table(store_url, "annotation", table.replace_schema_metadata(meta))
    for p in sources:
        store.fs.rm_file(p)
    assert read("annotation", store_url, dedupe=False).height == 20  # the defect: raw reads count rows twice
    res = compact_kind("annotation", store_url, target_rows=10, grace_s=0)  # both files are at the target: planning alone never merges them
    assert res.healed == 10
    raw = read("annotation", store_url, dedupe=False)
    assert raw.height == raw["event_id"].n_unique() == 10
    assert len(_names(store_url, "annotation")) == 1


def test_a_reader_whose_files_a_compaction_deleted_lists_again_and_loses_no_row(store_url):
    from mkb.events import scan
    from mkb.events._compact import compact_kind

    for k in range(4):
        _annotations(store_url, 5, start=5 * k, attempt=f"a{k}")
    lazy = scan("annotation", store_url, dedupe=False)  # lists the four sources now
    compact_kind("annotation", store_url, target_rows=1000, grace_s=0)  # merges them and deletes the sources at once
    assert len(_names(store_url, "annotation")) == 1
    df = lazy.collect()
    assert sorted(df["reason"].cast(int).to_list()) == list(range(20))


def test_files_missing_required_columns_or_holding_nulls_are_skipped_and_named(store_url):
    from mkb.events._compact import compact_kind

    _annotations(store_url, 4)
    schema = schema_for("annotation")
    good = rows_to_table(schema, _envelope_rows("annotation", 100, prefix="x"))
    no_id = good.drop_columns(["event_id"])
    no_id = no_id.replace_schema_metadata(good.schema.metadata)
    null_label = good.set_column(good.schema.get_field_index("label"), pa.field("label", pa.string()), pa.array([None] * 100, pa.string()))
    null_label = null_label.replace_schema_metadata(good.schema.metadata)
    store = resolve_store(store_url)
    paths = {}
    for name, t in (("no-event-id", no_id), ("null-label", null_label)):
        sink = pa.BufferOutputStream()
        pq.write_table(t, sink)
        paths[name] = f"{store.kind_dir('annotation')}/{name}.parquet"
        store.fs.pipe_file(paths[name], sink.getvalue().to_pybytes())
    report = ScanReport()
    with pytest.warns(UserWarning) as record:
        df = read("annotation", store_url, report=report)
    assert df.height == 4  # not 4 + 1 (100 id-less rows collapsed into one) nor 104
    assert "required column 'event_id' is missing" in report.skipped[paths["no-event-id"]]
    assert "required column 'label' holds 100 null" in report.skipped[paths["null-label"]]
    said = "\n".join(str(r.message) for r in record)
    assert paths["no-event-id"] in said and paths["null-label"] in said
    res = compact_kind("annotation", store_url, target_rows=1000, grace_s=0)  # does not crash on them, leaves them as they are
    assert set(paths.values()) <= set(res.skipped)
    assert read("annotation", store_url, dedupe=False).height == 4


def test_a_file_carrying_another_layouts_arrow_schema_is_checked_on_its_own_columns(store_url):
    """The footer check caches column positions per ARROW:schema blob; a blob copied onto reordered columns must not borrow them."""
    _annotations(store_url, 4)  # their layout (and blob) is now cached
    read("annotation", store_url)
    schema = schema_for("annotation")
    good = rows_to_table(schema, _envelope_rows("annotation", 100, prefix="y"))
    meta = good.schema.metadata  # mkb.kind and mkb.schema_version
    sink = pa.BufferOutputStream()
    pq.write_table(good, sink)
    arrow_blob = pq.read_metadata(pa.BufferReader(sink.getvalue())).metadata[b"ARROW:schema"]
    names = list(good.column_names)
    i, j = names.index("label"), names.index("attempt_id")  # label (required) where a nullable column sat
    names[i], names[j] = names[j], names[i]
    swapped = good.select(names)
    swapped = swapped.set_column(swapped.schema.get_field_index("label"), pa.field("label", pa.string()), pa.array([None] * 100, pa.string()))
    swapped = swapped.set_column(swapped.schema.get_field_index("attempt_id"), pa.field("attempt_id", pa.string()), pa.array(["a"] * 100))  # no nulls where label sat
    swapped = swapped.replace_schema_metadata({**meta, b"ARROW:schema": arrow_blob})
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, swapped.schema, store_schema=False) as writer:  # no ARROW:schema of its own: the copied one goes in as given
        writer.write_table(swapped)
        writer.add_key_value_metadata({k.decode(): v.decode() for k, v in swapped.schema.metadata.items()})
    assert pq.read_metadata(pa.BufferReader(sink.getvalue())).metadata[b"ARROW:schema"] == arrow_blob
    store = resolve_store(store_url)
    path = f"{store.kind_dir('annotation')}/borrowed-blob.parquet"
    store.fs.pipe_file(path, sink.getvalue().to_pybytes())
    report = ScanReport()
    with pytest.warns(UserWarning):
        df = read("annotation", store_url, report=report)
    assert df.height == 4 and df["label"].null_count() == 0
    assert "required column 'label' holds 100 null(s)" in report.skipped.get(path, ""), report.skipped


def _corrupt_pages(data: bytes) -> bytes:
    """Garbage over the column chunks, the footer intact."""
    footer = int.from_bytes(data[-8:-4], "little") + 8
    body = bytearray(data)
    for i in range(4, len(data) - footer - 1):
        body[i] = (body[i] * 7 + 13) & 0xFF
    return bytes(body)


def test_a_file_with_corrupt_data_pages_is_skipped_and_named(store_url):
    _annotations(store_url, 6)
    w = _annotations(store_url, 3, start=6)
    store = resolve_store(store_url)
    bad = f"{store.kind_dir('annotation')}/corrupt.parquet"
    store.fs.pipe_file(bad, _corrupt_pages(store.fs.cat_file(w.files_written[0])))
    report = ScanReport()
    with pytest.warns(UserWarning, match="corrupt.parquet: corrupt data pages"):
        df = read("annotation", store_url, report=report, dedupe=False)
    assert df.height == 9
    assert "corrupt data pages" in report.skipped[bad]


def test_an_older_major_file_is_upcast_through_registered_upcasters(store_url):
    """A synthetic annotation 0.3 file, whose `why` column became `reason` in 1.0."""
    from mkb.events import register_upcaster
    from mkb.events._upcast import unregister_upcaster

    _annotations(store_url, 2)
    schema = schema_for("annotation")
    t = rows_to_table(schema, _envelope_rows("annotation", 3, prefix="old", version="0.3"))
    t = t.rename_columns(["why" if c == "reason" else c for c in t.column_names])
    old = t.replace_schema_metadata({**schema.arrow().metadata, META_VERSION: b"0.3"})
    path = write_table(store_url, "annotation", old)
    report = ScanReport()
    with pytest.warns(UserWarning, match="no upcaster"):
        assert read("annotation", store_url, report=report).height == 2
    assert "older major schema 0.3" in report.skipped[path]

    @register_upcaster("annotation", 0)
    def rename_why(table: pa.Table) -> pa.Table:
        return table.rename_columns(["reason" if c == "why" else c for c in table.column_names])

    try:
        df = read("annotation", store_url).sort("event_id")
        assert df.height == 5
        assert df.filter(df["schema_version"] == "0.3")["reason"].to_list() == [r["reason"] for r in example_rows("annotation", 3)]
    finally:
        unregister_upcaster("annotation", 0)


def _index_segments(store_url: str, kind: str) -> list[str]:
    from mkb.events._index import index_dir

    store = resolve_store(store_url)
    d = index_dir(store, kind)
    store.fs.invalidate_cache()
    return sorted(str(p) for p in store.fs.ls(d, detail=False)) if store.fs.exists(d) else []


def _count_footers(monkeypatch) -> list[str]:
    """Paths whose own footer the reader parses from now on."""
    import mkb.events._reader as rd

    parsed: list[str] = []
    real = rd._parse_footer
    monkeypatch.setattr(rd, "_parse_footer", lambda path, size, tail: parsed.append(path) or real(path, size, tail))
    return parsed


def test_a_fresh_reader_takes_footers_from_the_index_and_opens_only_new_ones(store_url, monkeypatch):
    import mkb.events._index as idx
    from mkb.events._reader import clear_caches

    monkeypatch.setattr(idx, "MIN_FILES", 3)
    written = [p for k in range(4) for p in _annotations(store_url, 5, start=5 * k, attempt=f"a{k}").files_written]
    clear_caches()
    assert read("annotation", store_url).height == 20
    assert len(_index_segments(store_url, "annotation")) == 1  # the reader parsed 4 footers and left them behind
    new = _annotations(store_url, 5, start=20, attempt="a4").files_written
    parsed = _count_footers(monkeypatch)
    clear_caches()  # as in a fresh process
    report = ScanReport()
    df = read("annotation", store_url, report=report)
    assert sorted(df["reason"].cast(int).to_list()) == list(range(25))
    assert parsed == new  # only the file no segment holds
    assert sorted(report.files) == sorted(written + new) and report.skipped == {}
    assert len(_index_segments(store_url, "annotation")) == 1  # one new footer is below MIN_FILES: no second segment


def test_an_index_entry_that_vouches_for_a_bad_file_is_not_trusted(store_url, monkeypatch):
    """A segment saying a file's required columns are null-free (a file replaced in place at the same size, or a forged
    segment): the rows read show the nulls, the reader falls back to the files' own footers and names the file."""
    import dataclasses

    import mkb.events._index as idx
    from mkb.events._reader import clear_caches, inspect_files

    _annotations(store_url, 4)
    schema = schema_for("annotation")
    good = rows_to_table(schema, _envelope_rows("annotation", 50, prefix="z"))
    bad = good.set_column(good.schema.get_field_index("label"), pa.field("label", pa.string()), pa.array([None] * 50, pa.string()))
    path = write_table(store_url, "annotation", bad.replace_schema_metadata(good.schema.metadata))
    store = resolve_store(store_url)
    info = inspect_files(store, [(path, store.fs.size(path))])[0]
    assert dict(info.null_counts)["label"] == 50
    idx.write(store, "annotation", [dataclasses.replace(info, null_counts=tuple((c, 0) for c, _ in info.null_counts))])
    clear_caches()
    report = ScanReport()
    with pytest.warns(UserWarning, match="holds 50 null"):
        df = read("annotation", store_url, report=report)
    assert df.height == 4 and df["label"].null_count() == 0
    assert "required column 'label' holds 50 null(s)" in report.skipped[path]


def test_a_segment_that_does_not_parse_is_ignored_and_named(store_url):
    from mkb.events._index import index_dir
    from mkb.events._reader import clear_caches

    _annotations(store_url, 3)
    store = resolve_store(store_url)
    junk = f"{index_dir(store, 'annotation')}/junk.arrow"
    store.fs.makedirs(index_dir(store, "annotation"), exist_ok=True)
    store.fs.pipe_file(junk, b"not an index")
    clear_caches()
    with pytest.warns(UserWarning, match="ignoring footer index .*junk.arrow"):
        assert read("annotation", store_url).height == 3


def test_compaction_rewrites_the_index_for_the_files_it_leaves(store_url, monkeypatch):
    import mkb.events._index as idx
    from mkb.events._compact import compact_kind
    from mkb.events._reader import clear_caches

    monkeypatch.setattr(idx, "MIN_FILES", 3)
    for k in range(6):
        _annotations(store_url, 5, start=5 * k, attempt=f"a{k}")
    clear_caches()
    read("annotation", store_url)
    before = _index_segments(store_url, "annotation")
    assert len(before) == 1
    res = compact_kind("annotation", store_url, target_rows=1000)  # default grace: the 6 sources stay beside the merged file
    assert len(res.written) == 1 and len(res.awaiting_grace) == 6
    after = _index_segments(store_url, "annotation")
    assert len(after) == 1 and after != before  # one segment for the 7 files, the reader's segment deleted
    parsed = _count_footers(monkeypatch)
    clear_caches()
    report = ScanReport()
    assert read("annotation", store_url, dedupe=False, report=report).height == 30  # the sources are superseded, not counted twice
    assert parsed == [] and len(report.superseded) == 6
    compact_kind("annotation", store_url, target_rows=1000, grace_s=0)  # deletes the sources: one file is below MIN_FILES
    assert _index_segments(store_url, "annotation") == []
    clear_caches()
    assert read("annotation", store_url, dedupe=False).height == 30
