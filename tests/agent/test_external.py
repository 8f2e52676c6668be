"""The external-harness adapter: same workspace, `mkb-run submit` through the adapter, same budget accounting, reported tokens."""

from __future__ import annotations

import json
import sys
import textwrap

from mkb.agent import Budget
from mkb.agent._external import ExternalAgent, client_submit

from agent_helpers import GOOD, WRONG, FakeGrader

HARNESS = textwrap.dedent(f"""
    import json, subprocess, sys, pathlib
    def submit():
        r = subprocess.run([sys.executable, "-m", "mkb.cli.run", "submit"], capture_output=True, text=True)
        return r.returncode, r.stdout
    assert pathlib.Path("problem/TASK.md").is_file() and pathlib.Path("INSTRUCTIONS.md").is_file()
    pathlib.Path("kernel.py").write_text({WRONG!r})
    first = submit()
    pathlib.Path("kernel.py").write_text({GOOD!r})
    second = submit()
    third = submit()
    pathlib.Path("SKILL.md").write_text("A row per block with vector loads was fastest.")
    pathlib.Path("mkb_tokens.json").write_text(json.dumps({{"output_tokens": 1234, "turns": 7}}))
    print(json.dumps([first, second, third]))
""")


def _run(runner, command, **kw):
    agent = ExternalAgent(command, name="test-harness")
    return runner.run([], agent=agent, **kw)


def test_external_harness_submits_through_the_adapter(runner):
    res = _run(runner, [sys.executable, "-c", HARNESS], budget=Budget(submissions=2))
    assert res.submissions == 2 and res.stop_reason == "submissions"
    assert runner.grader.sources == [WRONG, GOOD]
    assert res.skill_text.startswith("A row per block")
    log = (runner.tmp / f"ws{runner.n}" / "workspace.state" / "harness.log").read_text()
    codes = json.loads(log.strip().splitlines()[-1])
    assert [c[0] for c in codes] == [1, 0, 2] and "no submissions left" in codes[2][1]
    started = runner.events("attempt_started").to_dicts()[0]
    assert started["attempt_kind"] == "external" and started["unsafe_no_sandbox"]
    fin = runner.events("attempt_finished").to_dicts()[0]
    assert json.loads(fin["harness_tokens_reported"]) == {"output_tokens": 1234, "turns": 7}
    assert fin["output_tokens"] == 0 and fin["best_passed"]
    assert runner.events("submission")["kernel_source"].to_list() == [WRONG, GOOD]
    assert runner.events("tool_call")["counted"].to_list() == [True, True]


def test_external_harness_killed_at_the_working_time_cap(runner):
    res = _run(runner, [sys.executable, "-c", "import time; open('kernel.py','w').write('x'); time.sleep(600)"], budget=Budget(working_time_s=2.0))
    assert res.stop_reason == "working_time" and res.final_kernel_sha256 is not None


def test_submit_outside_an_adapter_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("MKB_SUBMIT_SOCKET", raising=False)
    code, text = client_submit(tmp_path)
    assert code == 2 and "MKB_SUBMIT_SOCKET is not set" in text and "hint:" in text
