"""`mkb-run grade --problems-root`: a run (CLI, worker processes) grades against another root in the catalog's format."""

from __future__ import annotations

from typer.testing import CliRunner

from mkb.cli.run import app
from mkb.dsl import get_backend
from mkb.problems._loader import PROBLEMS_ROOT_ENV

AXPBY = "import torch\n\n\ndef solve(x, y, alpha, beta):\n    return alpha * x + beta * y\n"
WRONG = "import torch\n\n\ndef solve(x, y, alpha, beta):\n    return alpha * x - beta * y\n"


def test_grade_against_a_doc_pack_examples_root(tmp_path, fake_dsl, store, monkeypatch):
    root = get_backend("cute").doc_pack() / "examples"
    monkeypatch.setenv(PROBLEMS_ROOT_ENV, "")  # restored after the test: the CLI sets it for its run
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(AXPBY)
    bad.write_text(WRONG)
    args = ["grade", "--problems-root", str(root), "--problem", "91", "--dsl", fake_dsl, "--device", "cpu",
            "--size", "smoke", "--quick", "--store", store]
    r = CliRunner().invoke(app, args + [str(good)])
    assert r.exit_code == 0, r.output
    assert "PASSED" in r.output and "problem 91" in r.output
    r = CliRunner().invoke(app, args + [str(bad)])
    assert r.exit_code == 1 and "wrong_output" in r.output, r.output


def test_a_missing_problems_root_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv(PROBLEMS_ROOT_ENV, "")
    r = CliRunner().invoke(app, ["grade", "--baselines", "--problems-root", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output, r.output
