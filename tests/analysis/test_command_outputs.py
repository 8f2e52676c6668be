"""--json and --csv on the commands that write things (report, export, synth) and on transcript: what each produced."""

import json
from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from mkb.cli.analyze import app
from mkb.events import read, schemas

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_synth_json_and_csv_say_what_was_planted_and_written(tmp_path):
    store = tmp_path / "ds"
    r = runner.invoke(app, ["synth", "--store", str(store), "--models", "2", "--problems", "6", "--replicates", "2", "--json", "-",
                            "--csv", str(tmp_path / "s.csv")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # pure JSON on stdout: the human lines are not printed
    assert doc["spec"]["n_problems"] == 6 and doc["spec"]["replicates"] == 2 and doc["store"] == str(store)
    assert doc["events"] == sum(read(k, str(store)).height for k in schemas())
    planted = doc["tables"]["planted"]
    assert len(planted) == 4 and {p["direction"] for p in planted} == {"cute->tirx", "tirx->cute"}
    files = doc["tables"]["files"]
    assert sorted(f["path"] for f in files) == sorted(str(p) for p in store.rglob("*.parquet"))
    assert all(Path(f["path"]).stat().st_size == f["bytes"] for f in files)
    assert pl.read_csv(tmp_path / "s.csv").height == 4 and pl.read_csv(tmp_path / "s.files.csv").height == len(files)


def test_export_json_lists_rows_per_kind_and_every_file(planted_lift, tmp_path):
    out = tmp_path / "hf"
    r = runner.invoke(app, ["export", "--store", planted_lift.store, "--out", str(out), "--json", str(tmp_path / "e.json"),
                            "--csv", str(tmp_path / "e.csv")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "e.json").read_text())
    kinds = {row["kind"]: row["rows"] for row in doc["tables"]["kinds"]}
    assert kinds["attempt_started"] == 2 * 74 * 3 * 10 and kinds == {k: read(k, planted_lift.store).height for k in kinds}
    paths = {f["path"]: f["bytes"] for f in doc["tables"]["files"]}
    assert f"{out}/README.md" in paths and f"{out}/derived/lift.csv" in paths
    assert all(Path(p).stat().st_size == b for p, b in paths.items())
    assert pl.read_csv(tmp_path / "e.csv")["rows"].sum() == sum(kinds.values())


def test_report_json_lists_the_page_and_every_file_beside_it(planted_lift, tmp_path):
    out = tmp_path / "rep"
    r = runner.invoke(app, ["report", "--store", planted_lift.store, "--out", str(out), "--resamples", "200", "--json", "-"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    listed = {f["path"] for f in doc["tables"]["files"]}
    assert doc["report"] == str(out / "report.html") and doc["bootstrap"]["resamples"] == 200
    assert listed == {str(p) for p in out.iterdir()}  # every file the report wrote, and nothing else


def test_transcript_json_holds_the_attempts_events(tmp_path):
    store = str(ROOT / "events" / "h200-agent-demo")
    aid = read("turn", store)["attempt_id"][0]
    r = runner.invoke(app, ["transcript", aid, "--store", store, "--json", "-", "--csv", str(tmp_path / "t.csv")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    turns = read("turn", store).filter(pl.col("attempt_id") == aid)
    assert doc["attempt_id"] == aid and len(doc["tables"]["turns"]) == turns.height > 0
    assert doc["tables"]["attempt_started"][0]["attempt_id"] == aid
    assert pl.read_csv(tmp_path / "t.csv").height == turns.height


def test_long_tables_print_every_cell_as_plain_aligned_lines(capsys):
    from mkb.cli import analyze as cli

    tbl = cli.Table(title="Big")
    for c, j in (("model", "left"), ("n", "right"), ("ok", "left")):
        tbl.add_column(c, justify=j)
    rows = [(f"m-{i}", str(i * 7), "[red]no[/red]" if i % 2 else "yes") for i in range(cli.Table.FAST_ROWS + 5)]
    for r in rows:
        tbl.add_row(*r)
    cli.console.quiet = False
    cli._print_table(tbl)
    lines = capsys.readouterr().out.splitlines()
    body = [ln for ln in lines if ln.startswith("│")]
    assert len(body) == len(rows) and lines[0].strip() == "Big"
    assert len({len(ln) for ln in lines[1:]}) == 1  # every line as wide as the box
    for ln, (m, n, ok) in zip(body, rows):
        cells = [c.strip() for c in ln.strip("│").split("│")]
        assert cells == [m, n, "no" if "red" in ok else ok]  # markup dropped, nothing else
    assert body[0].split("│")[2].endswith(" 0 ")  # right-justified
