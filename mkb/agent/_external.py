"""Your own harness: run an external agent (a lab's agent, mini-swe-agent, a terminal agent) on the same workspace and budget.

The harness is started as a command in the prepared workspace with `MKB_SUBMIT_SOCKET` set; inside,
`mkb-run submit` grades kernel.py through this adapter, which counts submissions against the same
budget and writes the same `submission`/`tool_call` events as the built-in loop. What mkb can see is
accounted the same way (submissions, wall and working time: the harness is killed at the cap); what
only the harness knows (turns, tokens) it may report in `mkb_tokens.json` in the workspace, recorded
as reported (`harness_tokens_reported`), never mixed with measured counts. The harness runs with its
own environment and network (it must reach its model), so mkb does not sandbox it: its attempts are
recorded with `unsafe_no_sandbox` and the analysis reports them apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import socketserver
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from mkb._procs import kill_group
from mkb.agent._attempt import Counters, SafeWriter, emit_skill, file_sha256, finished_payload, freeze_kernel, grader_version, read_skill, started_payload
from mkb.agent._tools import KERNEL, cap_text, resolve_in, snapshot
from mkb.agent._types import AttemptResult, AttemptSpec, EventSink, GradeJob, Grader
from mkb.agent._workspace import first_message, prepare, sha256, system_prompt

SOCKET_ENV = "MKB_SUBMIT_SOCKET"
TOKENS_FILE = "mkb_tokens.json"


def client_submit(cwd: Path) -> tuple[int, str]:
    """`mkb-run submit`: ask the adapter to grade kernel.py. Exit code 0 passed, 1 failed, 2 could not submit."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return 2, f"error: {SOCKET_ENV} is not set\nhint: `mkb-run submit` works inside a workspace started by mkb's external-harness adapter"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall(json.dumps({"cwd": str(cwd)}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        return 2, f"error: cannot reach the mkb adapter at {path}: {exc}"
    try:
        reply = json.loads(data)
    except json.JSONDecodeError:
        return 2, "error: the mkb adapter sent no answer (the attempt may have ended)"
    return int(reply.get("code", 2)), str(reply.get("text", ""))


class ExternalAgent:
    """Runs `command` (argv, or a shell string) as the agent; implements the `Agent` protocol."""

    def __init__(self, command: list[str] | str, *, name: str = "external", env: dict[str, str] | None = None, poll_s: float = 0.2) -> None:
        self.command = command
        self.name = name
        self.env = dict(env or {})
        self.poll_s = poll_s

    def run(self, spec: AttemptSpec, *, workspace: Path, grader: Grader, writer: EventSink) -> AttemptResult:
        from mkb.dsl import get_backend
        from mkb.events import uuid7
        from mkb.problems import get_problem

        attempt_id = spec.attempt_id or uuid7()
        w = SafeWriter(writer)
        prep = prepare(spec, Path(workspace))
        backend = get_backend(spec.target_dsl)
        system = system_prompt(dsl_display=backend.display_name, workspace_view=str(prep.workspace))
        task = first_message(spec, prep.task_statement)
        (prep.workspace / "INSTRUCTIONS.md").write_text(system + "\n\n" + task + "\nSubmit with `mkb-run submit` in this folder.\n")
        w.emit("attempt_started", attempt_id=attempt_id, **started_payload(
            spec, problem_name=prep.problem_name, family=get_problem(spec.problem).family, problem_hash=prep.problem_hash,
            dsl_version=prep.dsl_version, doc_pack_version=prep.doc_pack_version, grader_version=grader_version(), attempt_kind="external",
            extra={"system_prompt_sha256": sha256(system), "task_prompt_sha256": sha256(task), "sandbox": f"external harness {self.name} (not sandboxed by mkb)",
                   "unsafe_no_sandbox": True}))
        c = Counters()
        lock = threading.Lock()
        t0 = time.monotonic()
        import tempfile

        sock_dir = tempfile.mkdtemp(prefix="mkb-submit-")  # a unix socket path must stay under ~100 bytes
        sock_path = os.path.join(sock_dir, "submit.sock")

        def handle(req: dict) -> dict:
            with lock:
                if c.submissions >= spec.budget.submissions:
                    return {"code": 2, "text": "error: no submissions left"}
                try:
                    k = resolve_in(prep.workspace, KERNEL, write=False)
                    if (prep.workspace / KERNEL).is_symlink() or not k.is_file():
                        raise ValueError
                except Exception:  # noqa: BLE001
                    return {"code": 2, "text": "error: kernel.py does not exist (or is not a regular file)"}
                index = c.submissions + 1
                snap = snapshot(k, prep.state / "submissions", index)
                ts = time.monotonic()
                try:
                    v = grader.submit(GradeJob(spec.problem, spec.target_dsl, snap, spec.experiment, attempt_id, "submission")).result()
                except Exception as exc:  # noqa: BLE001
                    c.extra["infra"] = f"grader failed: {type(exc).__name__}: {exc}"
                    return {"code": 2, "text": "error: the grader failed (infra); the attempt ends"}
                wait = getattr(v, "queue_wait_s", None) or 0.0
                c.queue_wait_s += wait
                c.submissions = index
                c.tool_calls += 1
                c.saw_verdict(v.passed, v.speedup, v.reason)
                text = (f"passed: {str(v.passed).lower()}\nreason: {v.reason or 'none'}\nspeedup: {v.speedup}\n"
                        f"message: {cap_text(v.message or '', 4096)[0]}\nsubmissions left: {spec.budget.submissions - index}")
                text = w.redact(text)  # what a kernel printed of the runner's environment goes back to no harness
                w.emit("submission", attempt_id=attempt_id, submission_index=index, kernel_source=snap.read_text(errors="replace"),
                       kernel_sha256=hashlib.sha256(snap.read_bytes()).hexdigest(), kernel_bytes=snap.stat().st_size, evaluation_id=v.evaluation_id)
                w.emit("tool_call", attempt_id=attempt_id, turn=0, phase="main", call_id=f"external-{index}", name="submit", arguments="{}",
                       result=text, result_bytes=len(text.encode()), bytes_elided=0, ok=True, exit_code=0 if v.passed else 1,
                       duration_s=time.monotonic() - ts, counted=True, queue_wait_s=wait, evaluation_id=v.evaluation_id, sandboxed=False)
                return {"code": 0 if v.passed else 1, "text": text}

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    req = json.loads(self.rfile.readline(1 << 16) or b"{}")
                except json.JSONDecodeError:
                    req = {}
                self.wfile.write(json.dumps(handle(req)).encode() + b"\n")

        server = socketserver.ThreadingUnixStreamServer(sock_path, Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="mkb-submit").start()
        env = {**os.environ, **self.env, SOCKET_ENV: sock_path, "MKB_ATTEMPT_ID": attempt_id}
        stop, error = "finished", None
        proc = subprocess.Popen(self.command, cwd=prep.workspace, env=env, shell=isinstance(self.command, str), start_new_session=True,
                                stdout=open(prep.state / "harness.log", "wb"), stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                wall = time.monotonic() - t0
                working = wall - c.queue_wait_s
                if spec.budget.wall_clock_s is not None and wall >= spec.budget.wall_clock_s:
                    stop = "wall_clock"
                elif spec.budget.working_time_s is not None and working >= spec.budget.working_time_s:
                    stop = "working_time"
                elif "infra" in c.extra:
                    stop, error = "infra_error", c.extra["infra"]
                if stop != "finished":
                    kill_group(proc)
                    break
                time.sleep(self.poll_s)
            if stop == "finished" and "infra" in c.extra:
                stop, error = "infra_error", c.extra["infra"]
            elif stop == "finished" and c.submissions >= spec.budget.submissions:
                stop = "submissions"
            if stop == "finished" and proc.returncode not in (0, None):
                error = f"harness exited with {proc.returncode} (see {prep.state / 'harness.log'})"
        finally:
            kill_group(proc)
            server.shutdown()
            server.server_close()
            import shutil

            shutil.rmtree(sock_dir, ignore_errors=True)
            final = freeze_kernel(prep.workspace, prep.state)
            reported = _read_tokens(prep.workspace)
            skill_text = read_skill(prep.workspace)
            chk = emit_skill(w, attempt_id, spec, text=skill_text, problem_name=prep.problem_name,
                             kernel_source=final.read_text(errors="replace") if final else "")
            wall = time.monotonic() - t0
            w.emit("attempt_finished", attempt_id=attempt_id, **finished_payload(
                stop, c, working_s=wall - c.queue_wait_s, wall_s=wall, final_sha=file_sha256(final), skill_sha=chk.sha256, closing=False,
                closing_skipped="external harness (no closing turn)", error=error, unsafe=True, harness_tokens=reported))
            w.flush()
        return AttemptResult(attempt_id=attempt_id, stop_reason=stop, final_kernel_sha256=file_sha256(final), final_kernel_path=final,
                             skill_text=chk.text, skill_sha256=chk.sha256, submissions=c.submissions, turns=0, output_tokens=0, cost_usd=None,
                             skill_flags=chk.flags, best_verdict={"passed": c.best_passed, "speedup": c.best_speedup}, error=error)


def _read_tokens(workspace: Path) -> dict[str, Any] | None:
    p = workspace / TOKENS_FILE
    if p.is_symlink() or not p.is_file():
        return None
    try:
        data = json.loads(p.read_bytes()[:65536])
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"invalid": True}
    return data if isinstance(data, dict) else {"invalid": True}
