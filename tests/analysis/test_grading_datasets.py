"""A store of stand-alone gradings (verdicts, no attempts) is summarised rather than refused."""

from typer.testing import CliRunner

from mkb.analysis import verdicts_table
from mkb.cli.analyze import app
from mkb.events import EventWriter


def _write_verdicts(store: str) -> None:
    with EventWriter(store) as w:
        w.emit("verdict", scope="submission", problem=28, dsl="cute", passed=True, speedup=13.5,
               candidate_median_us=82.5, eager_median_us=1119.2, s=100.0, gpu="NVIDIA H200")
        w.emit("verdict", scope="submission", problem=28, dsl="tirx", passed=False, reason="integrity_stream",
               s=0.0, gpu="NVIDIA H200")


def test_verdicts_table_lists_every_grading_oldest_first(tmp_path):
    store = str(tmp_path / "ds")
    _write_verdicts(store)
    v = verdicts_table(store)
    assert v["dsl"].to_list() == ["cute", "tirx"]
    assert v["reason"].to_list() == [None, "integrity_stream"]


def test_lift_on_a_grading_dataset_shows_its_verdicts_instead_of_nothing(tmp_path):
    store = str(tmp_path / "ds")
    _write_verdicts(store)
    out = CliRunner().invoke(app, ["lift", "--store", store], terminal_width=200)
    assert "grading dataset" in out.output
    assert "integrity_stream" in out.output and "1 passed" in out.output
