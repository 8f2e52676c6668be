"""Hostile model output: each script is contained by the sandbox and the tools, or ends the attempt with a clear stop reason.

These tests fail (never skip) in CI when bubblewrap is missing: a sandbox that silently is not
there is the failure they exist to catch.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from mkb.agent._sandbox import Limits, Sandbox
from mkb.agent._loop import BuiltinAgent

from agent_helpers import GOOD

pytestmark = pytest.mark.usefixtures("sandbox_available")

ROOT = Path(__file__).resolve().parents[2]


def bash(cmd, timeout_s=60):
    return {"name": "bash", "arguments": {"command": cmd, "timeout_s": timeout_s}}


def run_hostile(runner, calls, **kw):
    """One attempt whose model makes `calls` in one turn, then finishes; returns (result, the tool_call rows of that turn)."""
    res = runner.run([{"tool_calls": calls, "usage": {"completion_tokens": 100}}, {"tool_calls": [{"name": "finish", "arguments": {}}]},
                      {"tool_calls": [{"name": "write_file", "arguments": {"path": "SKILL.md", "content": "notes"}}]}], **kw)
    rows = runner.events("tool_call", res.attempt_id).to_dicts()
    assert res.stop_reason == "finished", res
    # nothing lost: every event of the attempt is there, in order
    assert runner.events("attempt_finished", res.attempt_id).height == 1 and runner.events("skill", res.attempt_id).height == 1
    assert [r["name"] for r in rows[: len(calls)]] == [c["name"] for c in calls]
    return res, rows[: len(calls)]


@pytest.fixture
def sandbox(tmp_path):
    problem_file = next(ROOT.glob("problems/mlp_norm/28_*/problem.py"))
    ws = tmp_path / "a" / "workspace"
    (ws / "problem").mkdir(parents=True)
    return Sandbox(ws, tmp_path / "a" / "workspace.state", problem_file=problem_file, limits=Limits(processes=64))


def test_baselines_are_not_in_the_sandbox(runner):
    _, rows = run_hostile(runner, [
        bash("find / -xdev \\( -name cute.py -o -name tirx.py \\) 2>/dev/null | grep -v /dsl/ ; echo END"),
        bash("python -c \"from mkb._resources import data_dir; import os; d=data_dir('problems'); print(sorted(os.walk(d))[-1])\""),
        {"name": "read_file", "arguments": {"path": "/work/main/problems/mlp_norm"}},
    ])
    found = [ln for ln in rows[0]["result"].splitlines() if ln.strip() and ln != "END"]
    assert found == [], found
    assert "problem.py" in rows[1]["result"] and "cute.py" not in rows[1]["result"] and "tirx.py" not in rows[1]["result"]
    assert not rows[2]["ok"] and "outside the workspace" in rows[2]["result"]


def test_only_the_attempts_own_doc_pack_is_in_the_sandbox(runner):
    # the runtime mkb package would otherwise carry every DSL's primer and worked examples (mkb/dsl/docs)
    _, rows = run_hostile(runner, [
        bash("find / \\( -path /proc -o -path /dev -o -path /sys \\) -prune -o \\( -name PROMPT.md -o -name patterns.md \\) -print "
             "2>/dev/null; echo END", timeout_s=120),
    ])
    found = sorted(ln for ln in rows[0]["result"].splitlines() if ln.strip() and ln != "END")
    assert found and all(f.startswith("/workspace/docs/") for f in found), found


def test_event_store_and_sibling_workspace_are_invisible(runner, tmp_path):
    sibling = tmp_path / "ws_other" / "workspace"
    sibling.mkdir(parents=True)
    (sibling / "kernel.py").write_text("SIBLING-SECRET")
    _, rows = run_hostile(runner, [
        bash(f"ls {runner.store} 2>&1; cat {sibling}/kernel.py 2>&1; ls {tmp_path} 2>&1; ls /workspace/.. ; echo END"),
        {"name": "read_file", "arguments": {"path": "../../ws_other/workspace/kernel.py"}},
        {"name": "read_file", "arguments": {"path": str(sibling / "kernel.py")}},
    ])
    assert "SIBLING-SECRET" not in json.dumps(rows, default=str)
    assert "No such file" in rows[0]["result"] and "kind=" not in rows[0]["result"]
    assert not rows[1]["ok"] and not rows[2]["ok"]


def test_symlink_escape_through_read_and_write_file(runner, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("HOST-ONLY")
    _, rows = run_hostile(runner, [
        bash(f"ln -s /etc/passwd pw; ln -s {outside} out; ln -s .. up; mkdir -p d; ln -s ../../.. d/root; echo ok"),
        {"name": "read_file", "arguments": {"path": "pw"}},
        {"name": "read_file", "arguments": {"path": "out"}},
        {"name": "read_file", "arguments": {"path": "up/workspace.state/final_kernel.py"}},
        {"name": "write_file", "arguments": {"path": "out", "content": "overwritten"}},
        {"name": "write_file", "arguments": {"path": "d/root/escape.txt", "content": "x"}},
        {"name": "write_file", "arguments": {"path": "problem/TASK.md", "content": "easier task"}},
    ])
    assert rows[0]["ok"]
    for r in rows[1:4]:
        assert not r["ok"] and "outside the workspace" in r["result"], r
    assert outside.read_text() == "HOST-ONLY"
    assert not rows[5]["ok"] and not rows[6]["ok"] and "read-only" in rows[6]["result"]
    assert "HOST-ONLY" not in json.dumps(rows, default=str) and "root:x:0" not in json.dumps(rows, default=str)


def test_kernel_symlink_is_not_submitted_or_frozen(runner, tmp_path):
    outside = tmp_path / "host_kernel.py"
    outside.write_text("HOST-FILE")
    res, rows = run_hostile(runner, [bash(f"ln -sf {outside} kernel.py; ln -sf /etc/hostname SKILL.md"), {"name": "submit", "arguments": {}}])
    assert not rows[1]["ok"] and not rows[1]["counted"] and runner.grader.jobs == []
    assert res.final_kernel_path is None and res.final_kernel_sha256 is None


def test_home_ssh_and_environment_hold_nothing(runner, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-123456")
    _, rows = run_hostile(runner, [bash("echo HOME=$HOME; ls -la ~ ~/.ssh /root/.ssh 2>&1; env; cat /proc/1/environ 2>&1 | tr '\\0' '\\n'")])
    out = rows[0]["result"]
    assert "HOME=/home/agent" in out and "aws-secret-value" not in out and "AWS_SECRET" not in out
    assert "id_rsa" not in out and "PYTHONPATH=/opt/mkb-runtime" in out


def test_writes_outside_the_workspace_do_not_land(runner, tmp_path):
    marker = f"mkb-hostile-{os.getpid()}"
    _, rows = run_hostile(runner, [bash(f"touch /tmp/{marker} && echo tmp-ok; touch /usr/{marker} 2>&1; touch /opt/mkb-runtime/mkb/{marker} 2>&1; "
                                        f"echo x > problem/problem.py 2>&1; mkdir -p /work && touch /work/{marker} 2>&1; echo END")])
    assert "tmp-ok" in rows[0]["result"]  # its own tmpfs
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/usr/{marker}").exists() and not Path(f"/work/{marker}").exists()
    ws = runner.tmp / f"ws{runner.n}" / "workspace"
    assert "def reference" in (ws / "problem" / "problem.py").read_text()
    assert "Read-only file system" in rows[0]["result"] or "Permission denied" in rows[0]["result"]


def test_no_network_not_even_the_model_server(runner):
    _, rows = run_hostile(runner, [
        bash("python - <<'EOF'\nimport socket, os\nport = int(os.environ.get('P', '0'))\n"
             "for host in ('127.0.0.1', '8.8.8.8', 'pypi.org'):\n"
             "    try:\n        socket.create_connection((host, 80), timeout=3); print('CONNECTED', host)\n"
             "    except OSError as e:\n        print('refused', host, type(e).__name__)\nEOF"),
        bash("cat /proc/net/route; ip addr 2>/dev/null || cat /sys/class/net/*/address 2>&1; echo END"),
    ])
    assert "CONNECTED" not in rows[0]["result"] and rows[0]["result"].count("refused") == 3


def test_model_server_port_unreachable(sandbox):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = sandbox.run(f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')\" 2>&1 | tail -1",
                        timeout_s=60)
    finally:
        srv.close()
    assert "CONNECTED" not in r.output and "Connection refused" in r.output


def test_no_gpu_device_nodes(sandbox):
    r = sandbox.run("ls /dev; ls /dev/nvidia* 2>&1; nvidia-smi 2>&1; ls /sys 2>&1 | head -3; echo END", timeout_s=30)
    assert "nvidia0" not in r.output and "nvidiactl" not in r.output and "No such file" in r.output
    assert r.output.rstrip().endswith("END")


def test_fork_bomb_is_limited_and_killed(sandbox):
    r = sandbox.run(":(){ :|:& };: ; sleep 100", timeout_s=8)
    assert r.duration_s < 60
    # nothing of it survives: no process of the sandbox user is left once run() returns
    left = [p for p in os.listdir("/proc") if p.isdigit() and _is_sandbox_process(p, sandbox)]
    assert left == []


def _is_sandbox_process(pid: str, sandbox) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(sandbox.workspace).encode() in cmd


def test_kill_the_parent_reaches_only_the_sandbox(runner):
    me = os.getpid()
    res, rows = run_hostile(runner, [bash(f"kill -9 $PPID 1 {me} {os.getppid()} 2>&1; echo alive"), bash("pkill -9 -f python; kill -9 -1; echo x")])
    # the sandbox's own init refuses; host pids do not exist in its PID namespace; the test process (and the loop) lives on
    assert os.getpid() == me and "alive" in rows[0]["result"] and "Operation not permitted" in rows[0]["result"]
    assert rows[1]["exit_code"] == 137  # it killed itself, nothing else


def test_fork_bomb_through_the_loop_ends_cleanly(runner):
    agent = BuiltinAgent(limits=Limits(processes=64))
    res, rows = run_hostile(runner, [bash(":(){ :|:& };:", timeout_s=5), {"name": "write_file", "arguments": {"path": "kernel.py", "content": GOOD}}],
                            agent=agent)
    assert rows[0]["duration_s"] < 60 and rows[1]["ok"]  # the bomb's processes died with the sandbox's PID namespace
    assert [p for p in os.listdir("/proc") if p.isdigit() and str(runner.tmp).encode() in _cmdline(p)] == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_invalid_json_and_huge_arguments(runner):
    huge = "x" * 3_000_000
    _, rows = run_hostile(runner, [{"name": "bash", "arguments": '{"command": "echo hi"'}, {"name": "write_file", "arguments": {"path": "big.txt", "content": huge}},
                                   {"name": "read_file", "arguments": {"path": "big.txt"}}, {"name": "bash", "arguments": {"command": 12}}])
    assert not rows[0]["ok"] and "not valid JSON" in rows[0]["result"]
    assert rows[1]["ok"] and rows[2]["bytes_elided"] > 2_900_000
    assert not rows[3]["ok"]
