"""`mkb-run grade` prints a readable verdict and exits 0 only when the kernel passed."""

from __future__ import annotations

from typer.testing import CliRunner

from fake_dsl import TORCH_BASELINE_28
from mkb.cli.run import app


def test_grade_command_prints_the_verdict_and_sets_the_exit_status(tmp_path, fake_dsl, store):
    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\n\ndef solve(x, residual, weight):\n    return torch.zeros_like(x)\n")
    args = ["grade", "--problem", "28", "--dsl", fake_dsl, "--device", "cpu", "--size", "smoke", "--quick", "--store", store]
    r = CliRunner().invoke(app, args + [str(good)])
    assert r.exit_code == 0, r.output
    assert "PASSED" in r.output and "verification" in r.output and "(fake)" in r.output
    r = CliRunner().invoke(app, args + [str(bad)])
    assert r.exit_code == 1
    assert "FAILED" in r.output and "all_zero" in r.output
