"""`mkb-run plan | run | status | reproduce | import-upstream`: outputs and one-line errors (no tracebacks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mkb.cli.run import app
from mkb.experiment import build_plan
from mkb.experiment._executor import Executor
from mkb.experiment._fake import FakeGrader, FakeRunner, demo_config

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_plan_dry_run_prints_estimates_and_how():
    r = runner.invoke(app, ["plan", str(ROOT / "configs" / "example.toml"), "--dry-run"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    for figure in ("attempts", "gradings", "GPU-hours", "output tokens", "cost USD", "wall-clock hours"):
        assert figure in r.output
    assert "4,440" in r.output and "assumption" in r.output and "litellm's bundled price map" in r.output


@pytest.mark.parametrize("args, msg", [
    (["plan", "nope.toml", "--dry-run"], "no such config file"),
    (["run", "configs/demo.toml", "--store", "hf://datasets/x/y", "--grader", "none"], "not a live append target"),
    (["run", "configs/demo.toml", "--grader", "replay:/nonexistent"], "no replay index"),
    (["run", "configs/demo.toml", "--grader", "tpu"], "expected gpu (this host's GPUs), gpu:confined"),
    (["run", "configs/demo.toml", "--rerun", "--grader", "none"], "--rerun needs a --subset"),
    (["import-upstream", "nope.json"], "no such file"),
])
def test_errors_are_one_line(args, msg, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MKB_STORE", str(tmp_path / "s"))
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output


def test_a_confined_grader_is_refused_in_one_line_on_a_kernel_without_landlock(monkeypatch, tmp_path):
    from mkb.grader import _confine

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MKB_STORE", str(tmp_path / "s"))
    monkeypatch.setattr(_confine, "landlock_abi", lambda: 0)
    r = runner.invoke(app, ["run", "configs/demo.toml", "--grader", "gpu:confined"])
    assert r.exit_code == 2 and "has no Landlock" in r.output and "Traceback" not in r.output, r.output


def test_status_and_reproduce_dry_run(tmp_path):
    store = str(tmp_path / "s")
    plan = build_plan(demo_config("cli", arms=("solo", "transfer")))
    ex = Executor(plan, store=store, runner=FakeRunner(), versions={"v": 1}, poll_s=0.05, sleep=lambda s: None)
    ex.grader = FakeGrader(ex.writer)
    ex.run()
    r = runner.invoke(app, ["status", "--store", store], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "experiment cli" in r.output and "provisional lift over 8 complete block(s)" in r.output
    r = runner.invoke(app, ["reproduce", store, "--dry-run"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and f"plan {plan.sha256[:12]}" in r.output and "note:" not in r.output, r.output
