"""`mkb-run schemas` and `mkb-run compact`."""

from __future__ import annotations

from typer.testing import CliRunner

from mkb.cli.run import app
from mkb.events import EventWriter, read
from mkb.events._docs import render_markdown

from events_helpers import REPO


def test_committed_schema_doc_is_up_to_date():
    doc = REPO / "docs" / "schemas.md"
    assert doc.read_text() == render_markdown(), "docs/schemas.md is stale\nhint: run `mkb-run schemas --write`"


def test_schemas_command_prints_every_kind():
    out = CliRunner().invoke(app, ["schemas"])
    assert out.exit_code == 0
    for kind in ("verdict", "attempt_started", "annotation"):
        assert f"## {kind}" in out.output


def test_compact_command_merges_files_and_keeps_rows(tmp_path):
    url = str(tmp_path / "ds")
    for k in range(5):
        with EventWriter(url) as w:
            w.emit("annotation", target_attempt_id=f"t{k}", label="clean", reason="r", annotator="a")
    before = read("annotation", url).sort("event_id")
    out = CliRunner().invoke(app, ["compact", "--store", url, "--kind", "annotation", "--target-rows", "100"])
    assert out.exit_code == 0, out.output
    assert "annotation" in out.output
    assert len(list((tmp_path / "ds" / "kind=annotation").iterdir())) == 1
    assert read("annotation", url).sort("event_id").equals(before)


def test_compact_refuses_a_store_with_a_newer_major_version_and_says_why(tmp_path):
    import pyarrow.parquet as pq

    from mkb.events import write_table
    from mkb.events._schema import META_VERSION

    url = str(tmp_path / "ds")
    with EventWriter(url) as w:
        w.emit("annotation", target_attempt_id="t", label="clean", reason="r", annotator="a")
    table = pq.read_table(w.files_written[0])
    write_table(url, "annotation", table.replace_schema_metadata({**table.schema.metadata, META_VERSION: b"9.0"}))
    out = CliRunner().invoke(app, ["compact", "--store", url])
    assert out.exit_code == 1
    assert "newer than this mkb reads" in out.output and "hint:" in out.output
    assert len(list((tmp_path / "ds" / "kind=annotation").iterdir())) == 2


def test_compact_refuses_an_hf_store_with_a_hint():
    out = CliRunner().invoke(app, ["compact", "--store", "hf://datasets/x/y"])
    assert out.exit_code == 1 and "hint:" in out.output
