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
