"""`mkb-run schemas` and `mkb-run compact`."""

from __future__ import annotations

from typer.testing import CliRunner

from mkb.cli._exit import BAD_INPUT, CHECK_FAILED, ERROR, NO_DATA
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
    out = CliRunner().invoke(app, ["compact", "--store", url, "--kind", "annotation", "--target-rows", "100", "--grace-s", "0"])
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
    assert out.exit_code == ERROR
    assert "newer than this mkb reads" in out.output and "hint:" in out.output and "Traceback" not in out.output
    assert len(list((tmp_path / "ds" / "kind=annotation").iterdir())) == 2


def test_compact_refuses_an_hf_store_with_a_hint():
    out = CliRunner().invoke(app, ["compact", "--store", "hf://datasets/x/y"])
    assert out.exit_code == BAD_INPUT and "hint:" in out.output


def _store_with_rows(tmp_path, n=3):
    url = str(tmp_path / "ds")
    for k in range(n):
        with EventWriter(url) as w:
            w.emit("annotation", target_attempt_id=f"t{k}", label="clean", reason="r", annotator="a")
    return url, w


def test_verify_reads_every_page_and_lists_bad_files(tmp_path):
    url, w = _store_with_rows(tmp_path)
    out = CliRunner().invoke(app, ["verify", "--store", url])
    assert out.exit_code == 0, out.output
    assert "read 3 files, 3 rows; 0 bad" in out.output
    data = open(w.files_written[0], "rb").read()
    footer = int.from_bytes(data[-8:-4], "little") + 8
    bad = tmp_path / "ds" / "kind=annotation" / "bad.parquet"
    bad.write_bytes(data[:4] + bytes((b * 7 + 13) & 0xFF for b in data[4:len(data) - footer - 1]) + data[len(data) - footer - 1:])
    out = CliRunner().invoke(app, ["verify", "--store", url])
    assert out.exit_code == CHECK_FAILED
    assert f"bad: {bad}: corrupt data pages" in out.output


def test_store_commands_name_a_path_that_does_not_exist(tmp_path):
    for cmd in ("verify", "compact"):
        out = CliRunner().invoke(app, [cmd, "--store", str(tmp_path / "typo")])
        assert out.exit_code == BAD_INPUT, out.output
        assert f"store {tmp_path / 'typo'} does not exist" in out.output and "Traceback" not in out.output


def test_verify_of_an_empty_store_says_no_data(tmp_path):
    (tmp_path / "empty").mkdir()
    out = CliRunner().invoke(app, ["verify", "--store", str(tmp_path / "empty")])
    assert out.exit_code == NO_DATA


def test_compaction_on_a_full_disk_or_read_only_store_is_one_line_and_loses_nothing(tmp_path, monkeypatch):
    import errno

    import mkb.events._commit as c
    from mkb.events import read

    url, _ = _store_with_rows(tmp_path, 4)
    before = read("annotation", url).sort("event_id")
    for code, words in ((errno.ENOSPC, "free space"), (errno.EROFS, "read-only")):
        def refuse(fd, data, code=code):
            raise OSError(code, __import__("os").strerror(code), str(tmp_path / ".staging" / "x.partial"))

        monkeypatch.setattr(c, "_write_fully", refuse)
        out = CliRunner().invoke(app, ["compact", "--store", url, "--grace-s", "0"])
        assert out.exit_code == ERROR, out.output
        assert "x.partial" in out.output and words in out.output and "Traceback" not in out.output
        monkeypatch.undo()
        assert read("annotation", url).sort("event_id").equals(before)


def test_mkb_analyze_names_a_store_path_that_does_not_exist(tmp_path, monkeypatch, capsys):
    import pytest

    from mkb.cli import analyze

    monkeypatch.setattr("sys.argv", ["mkb-analyze", "lift", "--store", str(tmp_path / "typo")])
    with pytest.raises(SystemExit) as exit_:
        analyze.main()
    assert exit_.value.code == BAD_INPUT
    err = capsys.readouterr().err
    assert f"store {tmp_path / 'typo'} does not exist" in err and "Traceback" not in err
