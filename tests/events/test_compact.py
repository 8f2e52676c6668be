"""Compaction rules that the contract suite does not cover: what it leaves alone, and how groups are cut."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from mkb.events import EventWriter, read, write_table
from mkb.events._compact import compact_kind, plan_groups
from mkb.events._reader import FileInfo
from mkb.events._schema import META_VERSION


def test_files_of_a_newer_minor_version_are_left_as_is_so_their_columns_survive(tmp_path):
    url = str(tmp_path / "ds")
    for k in range(3):
        with EventWriter(url) as w:
            w.emit("annotation", target_attempt_id=f"t{k}", label="clean", reason="r", annotator="a")
    table = pq.read_table(w.files_written[0])
    newer = table.append_column("later_column", pa.array(["kept"]))
    newer = newer.replace_schema_metadata({**table.schema.metadata, META_VERSION: b"1.99"})
    newer_path = write_table(url, "annotation", newer.set_column(0, "event_id", pa.array(["newer-row"])))
    res = compact_kind("annotation", url, target_rows=1000)
    assert newer_path in res.skipped and "newer minor" in res.skipped[newer_path]
    assert pq.read_table(newer_path).column("later_column").to_pylist() == ["kept"]
    assert read("annotation", url).height == 4


def test_groups_are_consecutive_runs_under_the_target_and_large_files_stay():
    def f(name, rows):
        return FileInfo(path=f"d/{name}", size=rows * 10, kind="k", version="1.0", rows=rows, types=())

    files = [f("a", 40), f("b", 40), f("c", 40), f("d", 500), f("e", 10), f("f", 10)]
    groups = plan_groups(files, target_rows=100)
    assert [[x.name for x in g] for g in groups] == [["a", "b"], ["c", "e", "f"]]
