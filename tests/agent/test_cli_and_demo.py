"""`mkb-run attempt` end to end with the scripted model, its one-line errors, and the GPU demo script's flow on a CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("sandbox_available")
ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd, env=None, timeout=300):
    import os

    return subprocess.run([sys.executable, "-m", "mkb.cli.run", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_attempt_cli_with_the_scripted_model(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps([
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "kernel.py", "content": "def solve(*x):\n    return x[0]\n"}}]},
        {"content": "thinking"}, {"tool_calls": [{"name": "finish", "arguments": {}}]},
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "SKILL.md", "content": "Short notes."}}]}]))
    r = run_cli("attempt", "--problem", "28", "--dsl", "tirx", "--script", str(script), "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stop_reason"] == "finished" and out["turns"] == 3 and out["submissions"] == 0
    assert "turn 3/80" in r.stderr  # the live progress line
    ws = tmp_path / out["workspace"]
    assert (ws / "SKILL.md").read_text() == "Short notes." and (ws / "docs" / "API.md").is_file()
    # no baseline reaches the workspace; the only kernel files are the tirx doc pack's own worked examples
    kernels = [p.relative_to(ws) for p in ws.rglob("*.py") if p.name in ("cute.py", "tirx.py")]
    assert all(k.parts[:2] == ("docs", "examples") and k.name == "tirx.py" for k in kernels), kernels


@pytest.mark.parametrize("args,needle", [
    (["--arm", "transfer"], "needs --skill FILE"),
    (["--model", "openai/gpt-5", "--api-key-env", "MKB_TEST_UNSET_KEY"], "MKB_TEST_UNSET_KEY is not set"),
    (["--script", "missing.json"], "missing.json"),
])
def test_attempt_cli_errors_are_one_line(tmp_path, args, needle):
    r = run_cli("attempt", "--problem", "28", "--dsl", "tirx", *args, cwd=tmp_path)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_gpu_demo_flow_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_agent_demo.py"), "--out", str(tmp_path), "--fake-grader", "--no-check"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(a["arm"], a["dsl"]) for a in summary["attempts"]] == [("solo", "cute"), ("solo", "tirx"), ("transfer", "tirx"), ("transfer", "cute")]
    assert all(a["submissions"] == 2 and a["best"]["passed"] for a in summary["attempts"])
    assert summary["event_counts"]["turn"] > 0 and summary["event_counts"]["tool_call"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.tar.gz", "summary.json", "workspaces.tar.gz"]
