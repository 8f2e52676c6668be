"""The built-in agent: a native tool-calling loop through litellm, under the budget, with the closing SKILL.md turn."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from mkb.agent import _llm
from mkb.agent._attempt import (
    Counters, SafeWriter, emit_skill, file_sha256, finished_payload, freeze_kernel, grader_version, read_skill, started_payload,
)
from mkb.agent._sandbox import Limits, Sandbox, SandboxUnavailable
from mkb.agent._skill import tokenizer_id
from mkb.agent._tools import CLOSING_TOOLS, KERNEL, MAIN_TOOLS, ToolBox, ToolError, ToolOutcome, cap_text, resolve_in, snapshot, toolset, toolset_sha256
from mkb.agent._types import AttemptResult, AttemptSpec, EventSink, GradeJob, Grader
from mkb.agent._workspace import first_message, prepare, sha256, system_prompt

NUDGE = "No tool was called. Continue the task by calling a tool (call finish when you are done)."
CLOSING_PROMPT = (
    "The attempt's main budget has ended ({reason}). kernel.py is now frozen as your final kernel. You have this one turn "
    "and only the write_file tool: bring SKILL.md up to date (path \"SKILL.md\") following the SKILL.md rules, or leave it as it is."
)
ELIDED = "[mkb: this tool output was elided to fit the context window ({n} bytes)]"
CHECK_TIMEOUT_S = 300.0


def _canon(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()


def _speedup_text(v: Any) -> str:
    parts = [f"passed: {str(bool(v.passed)).lower()}", f"reason: {v.reason or 'none'}"]
    if v.eager_median_us is not None:
        parts.append(f"eager median: {v.eager_median_us:.1f} us")
    if v.candidate_median_us is not None:
        parts.append(f"kernel median: {v.candidate_median_us:.1f} us")
    if v.speedup is not None:
        parts.append(f"speedup: {v.speedup:.3f}x")
    msg = (v.message or "").strip()
    if msg:
        parts.append("message:\n" + cap_text(msg, 4096)[0])
    return "\n".join(parts)


class _Stop(Exception):
    def __init__(self, reason: str, error: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


class BuiltinAgent:
    """mkb's own agent. One instance can run many attempts (it keeps no per-attempt state)."""

    def __init__(self, *, progress: Callable[[Counters, Any], None] | None = None, gpu_arch: str = "sm_90a",
                 limits: Limits = Limits(), clock: Callable[[], float] = time.monotonic, attempt_kind: str = "builtin",
                 replay_of: str | None = None) -> None:
        self.attempt_kind = attempt_kind
        self.replay_of = replay_of
        self.progress = progress
        self.gpu_arch = gpu_arch
        self.limits = limits
        self.clock = clock

    def run(self, spec: AttemptSpec, *, workspace: Path, grader: Grader, writer: EventSink) -> AttemptResult:
        return _Run(self, spec, Path(workspace), grader, writer).run()


class _Run:
    """The state of one attempt (kept off the agent so that an agent is reusable and thread-safe)."""

    def __init__(self, agent: BuiltinAgent, spec: AttemptSpec, workspace: Path, grader: Grader, writer: EventSink) -> None:
        from mkb.events import uuid7

        self.a = agent
        self.spec = spec
        self.grader = grader
        self.attempt_id = spec.attempt_id or uuid7()
        key = spec.model.api_key_env
        import os

        extra = {os.environ[key]: key} if key and os.environ.get(key) else {}
        self.w = SafeWriter(writer, extra_secrets=extra)
        self.workspace = workspace
        self.c = Counters()
        self.messages: list[dict] = []
        self.sent = 0  # messages already recorded on a turn event
        self.elided = 0
        self.t0 = agent.clock()
        self.finished = False
        self.turn_index = 0  # turn events number main and closing turns in one sequence; c.turns counts main turns only

    # --- accounting ---------------------------------------------------------------------------------
    def working_s(self) -> float:
        return self.a.clock() - self.t0 - self.c.backoff_s - self.c.queue_wait_s

    def wall_s(self) -> float:
        return self.a.clock() - self.t0

    def _tick(self) -> None:
        if self.a.progress:
            self.a.progress(self.c, self.spec.budget)

    def budget_stop(self) -> str | None:
        b, c = self.spec.budget, self.c
        if b.wall_clock_s is not None and self.wall_s() >= b.wall_clock_s:
            return "wall_clock"
        if b.working_time_s is not None and self.working_s() >= b.working_time_s:
            return "working_time"
        if c.turns >= b.turns:
            return "turns"
        if c.output_tokens >= b.output_tokens:
            return "output_tokens"
        if c.submissions >= b.submissions:
            return "submissions"
        return None

    # --- the attempt --------------------------------------------------------------------------------
    def run(self) -> AttemptResult:
        spec = self.spec
        prep = prepare(spec, self.workspace)
        self.prep = prep
        try:
            self.sandbox = Sandbox(prep.workspace, prep.state, problem_file=prep.problem_file, unsafe=spec.unsafe_no_sandbox, limits=self.a.limits)
        except SandboxUnavailable as exc:
            raise SandboxUnavailable(f"attempt not started: {exc}") from None
        from mkb.dsl import get_backend
        from mkb.problems import get_problem

        self.backend = get_backend(spec.target_dsl)
        self.tools = ToolBox(prep.workspace, sandbox=self.sandbox, check_fn=self._check, submit_fn=self._submit,
                             on_write=lambda p: self.sandbox.own(p))
        system = system_prompt(dsl_display=self.backend.display_name, workspace_view=self.sandbox.workspace_view)
        task = first_message(spec, prep.task_statement)
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        sandbox_desc = "unsafe-no-sandbox" if spec.unsafe_no_sandbox else _bwrap_version()
        self.w.emit("attempt_started", attempt_id=self.attempt_id, **started_payload(
            spec, problem_name=prep.problem_name, family=get_problem(spec.problem).family, problem_hash=prep.problem_hash,
            dsl_version=prep.dsl_version, doc_pack_version=prep.doc_pack_version, grader_version=grader_version(), attempt_kind=self.a.attempt_kind,
            extra={"litellm_version": _llm.litellm_version(), "price_map": _llm.price_map_revision(), "system_prompt_sha256": sha256(system),
                   "task_prompt_sha256": sha256(task), "toolset_sha256": toolset_sha256(MAIN_TOOLS), "tokenizer": tokenizer_id(),
                   "sandbox": sandbox_desc, "replay_of": self.a.replay_of}))
        stop, error = "infra_error", None
        closing, closing_skipped = False, None
        final: Path | None = None
        try:
            try:
                self._main_loop()
            except _Stop as s:
                stop, error = s.reason, s.error
            final = freeze_kernel(prep.workspace, prep.state)
            if stop in ("infra_error", "context_exhausted"):
                closing_skipped = stop
            else:
                closing = True
                try:
                    self._closing_turn(stop)
                except _Stop as s:
                    closing_skipped = f"closing turn failed: {s.reason}"
                    error = error or s.error
                    closing = False
        except Exception as exc:  # noqa: BLE001 - an attempt never dies without its attempt_finished event
            stop, error = "infra_error", f"{type(exc).__name__}: {exc}"
            final = final or freeze_kernel(prep.workspace, prep.state)
        finally:
            self._restore_kernel(final)
            skill_text = read_skill(prep.workspace)
            kernel_source = final.read_text(errors="replace") if final else ""
            chk = emit_skill(self.w, self.attempt_id, spec, text=skill_text, problem_name=prep.problem_name, kernel_source=kernel_source)
            final_sha = file_sha256(final)
            self.w.emit("attempt_finished", attempt_id=self.attempt_id, **finished_payload(
                stop, self.c, working_s=self.working_s(), wall_s=self.wall_s(), final_sha=final_sha, skill_sha=chk.sha256, closing=closing,
                closing_skipped=closing_skipped, error=error, unsafe=spec.unsafe_no_sandbox))
            self.w.flush()
        self._tick()
        return AttemptResult(
            attempt_id=self.attempt_id, stop_reason=stop, final_kernel_sha256=final_sha, final_kernel_path=final, skill_text=chk.text,
            skill_sha256=chk.sha256, submissions=self.c.submissions, turns=self.c.turns, output_tokens=self.c.output_tokens,
            cost_usd=self.c.cost_usd, closing_turn=closing, skill_flags=chk.flags,
            best_verdict={"passed": self.c.best_passed, "speedup": self.c.best_speedup}, error=error)

    def _restore_kernel(self, final: Path | None) -> None:
        """kernel.py in the workspace is the frozen one, whatever happened after the freeze."""
        if final is None:
            return
        k = self.prep.workspace / KERNEL
        if k.is_symlink() or not k.is_file() or k.read_bytes() != final.read_bytes():
            if k.is_symlink() or k.exists() and not k.is_file():
                k.unlink()
            k.write_bytes(final.read_bytes())

    def _main_loop(self) -> None:
        while True:
            reason = self.budget_stop()
            if reason:
                raise _Stop(reason)
            left = self.spec.budget.output_tokens - self.c.output_tokens
            comp = self._turn("main", MAIN_TOOLS, max_tokens=min(self.spec.model.max_tokens_per_turn, left))
            self._run_tools(comp, "main", MAIN_TOOLS)
            if self.finished:
                raise _Stop("finished")

    def _closing_turn(self, reason: str) -> None:
        self.c.phase = "closing"
        self.tools.frozen = {KERNEL}
        self.tools.write_only = "SKILL.md"
        self.messages.append({"role": "user", "content": CLOSING_PROMPT.format(reason=reason)})
        comp = self._turn("closing", CLOSING_TOOLS, max_tokens=self.spec.budget.closing_tokens)
        self._run_tools(comp, "closing", CLOSING_TOOLS)

    def _turn(self, phase: str, tool_names: tuple[str, ...], *, max_tokens: int) -> _llm.Completion:
        """One completion (with elision on context overflow) and its `turn` event; counts the turn."""
        while True:
            prefix = _canon(self.messages[: self.sent])
            new = self.messages[self.sent:]
            try:
                comp = _llm.complete(self.spec.model, self.messages, toolset(tool_names), max_tokens=max(1, max_tokens), seed=self.spec.seed)
            except _llm.ContextExhausted as exc:
                if self._elide():
                    continue
                self._turn_event(phase, prefix, new, None, max_tokens, error=f"context_exhausted: {exc}")
                raise _Stop("context_exhausted", str(exc)) from None
            except _llm.InfraError as exc:
                self._turn_event(phase, prefix, new, None, max_tokens, error=str(exc))
                raise _Stop("infra_error", str(exc)) from None
            break
        self.c.backoff_s += comp.backoff_s
        self.turn_index += 1
        if phase == "closing":
            self.c.closing_output_tokens += comp.completion_tokens
        else:
            self.c.turns += 1
            self.c.output_tokens += comp.completion_tokens
        self.c.reasoning_tokens += comp.reasoning_tokens or 0
        self.c.input_tokens += comp.prompt_tokens or 0
        self.c.add_cost(comp.cost_usd)
        if comp.served_model and comp.served_model not in self.c.served_models:
            self.c.served_models.append(comp.served_model)
        self.messages.append(comp.message)
        self._turn_event(phase, prefix, new, comp, max_tokens)
        self.sent = len(self.messages)
        self._tick()
        return comp

    def _turn_event(self, phase: str, prefix: str, new: list[dict], comp: _llm.Completion | None, max_tokens: int, *, error: str | None = None) -> None:
        turn = self.turn_index if comp is not None else self.turn_index + 1
        self.w.emit("turn", attempt_id=self.attempt_id, turn=turn, phase=phase, model=self.spec.model.name,
                    served_model=comp.served_model if comp else None, system_fingerprint=comp.system_fingerprint if comp else None,
                    prefix_sha256=prefix, request_messages=json.dumps(new, default=str), reply=json.dumps(comp.message, default=str) if comp else None,
                    finish_reason=comp.finish_reason if comp else None, n_tool_calls=len(comp.tool_calls) if comp else 0, max_tokens=max_tokens,
                    prompt_tokens=comp.prompt_tokens if comp else None, completion_tokens=comp.completion_tokens if comp else None,
                    reasoning_tokens=comp.reasoning_tokens if comp else None, cached_tokens=comp.cached_tokens if comp else None,
                    cost_usd=comp.cost_usd if comp else None, latency_s=comp.latency_s if comp else 0.0, retries=comp.retries if comp else 0,
                    backoff_s=comp.backoff_s if comp else 0.0, error=error, elided_tool_messages=self.elided)

    def _elide(self) -> bool:
        """Fixed rule: replace the oldest half (at least one) of the not-yet-elided tool results; False when none is left."""
        live = [m for m in self.messages if m.get("role") == "tool" and not str(m.get("content", "")).startswith("[mkb: this tool output was elided")]
        if not live:
            return False
        for m in live[: max(1, len(live) // 2)]:
            m["content"] = ELIDED.format(n=len(str(m.get("content", "")).encode()))
            self.elided += 1
        self.sent = 0  # the prefix changed: the next turn event records the whole conversation again
        return True

    def _run_tools(self, comp: _llm.Completion, phase: str, allowed: tuple[str, ...]) -> None:
        if not comp.tool_calls:
            if phase == "main":
                self.messages.append({"role": "user", "content": NUDGE})
            return
        for call in comp.tool_calls:
            t = self.a.clock()
            outcome = self.tools.call(call["name"], call["arguments"], allowed=allowed)
            duration = self.a.clock() - t
            text, full, elided = cap_text(self.w.redact(outcome.result))  # the model never reads a credential either
            self.c.tool_calls += 1
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            self.w.emit("tool_call", attempt_id=self.attempt_id, turn=self.turn_index, phase=phase, call_id=call["id"] or "", name=call["name"],
                        arguments=call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"]), result=text,
                        result_bytes=full, bytes_elided=elided, ok=outcome.ok, exit_code=outcome.exit_code, duration_s=duration,
                        counted=outcome.counted, queue_wait_s=outcome.queue_wait_s, evaluation_id=outcome.evaluation_id,
                        sandboxed=outcome.sandboxed)
            if outcome.finish:
                self.finished = True
        self._tick()

    # --- check and submit ---------------------------------------------------------------------------
    def _kernel_path(self) -> Path:
        try:
            p = resolve_in(self.prep.workspace, KERNEL, write=False)
        except ToolError as exc:
            raise ToolError(f"kernel.py: {exc}") from None
        if (self.prep.workspace / KERNEL).is_symlink() or not p.is_file():
            raise ToolError("kernel.py does not exist (or is not a regular file): write it first")
        return p

    def _check(self) -> ToolOutcome:
        path = self._kernel_path()
        source = path.read_text(errors="replace")
        findings = self.backend.static_rules(source)
        if findings:
            lines = [f"kernel.py:{f.line or 0}: [{f.rule}] {f.message}" for f in findings]
            return ToolOutcome("check failed (static rules):\n" + "\n".join(lines), ok=False, exit_code=1)
        env = self.backend.environment(self.a.gpu_arch)
        r = self.sandbox.run([sys.executable, "-m", "mkb.dsl._check", self.spec.target_dsl, f"{self.sandbox.workspace_view}/{KERNEL}", str(self.spec.problem)],
                             timeout_s=CHECK_TIMEOUT_S, env=env)
        verdict = None
        for line in reversed(r.output.splitlines()):
            if line.startswith("MKB_CHECK "):
                try:
                    verdict = json.loads(line[len("MKB_CHECK "):])
                except json.JSONDecodeError:
                    pass
                break
        if verdict is None:
            tail = cap_text(r.output, 4096)[0]
            why = "timed out" if r.timed_out else f"exit {r.exit_code}"
            return ToolOutcome(f"check failed: the compile process ended without a result ({why})\n{tail}", ok=False, exit_code=r.exit_code,
                               sandboxed=not self.sandbox.unsafe)
        msgs = "\n".join(verdict.get("messages", []))
        return ToolOutcome(("check ok" if verdict.get("ok") else "check failed") + (f":\n{msgs}" if msgs else ""), ok=bool(verdict.get("ok")),
                           exit_code=r.exit_code, sandboxed=not self.sandbox.unsafe)

    def _submit(self) -> ToolOutcome:
        if self.c.submissions >= self.spec.budget.submissions:
            return ToolOutcome("error: no submissions left", ok=False)
        path = self._kernel_path()
        index = self.c.submissions + 1
        snap = snapshot(path, self.prep.state / "submissions", index)
        job = GradeJob(problem=self.spec.problem, dsl=self.spec.target_dsl, kernel_path=snap, experiment=self.spec.experiment,
                       attempt_id=self.attempt_id, scope="submission")
        t = self.a.clock()
        try:
            verdict = self.grader.submit(job).result()
        except Exception as exc:  # noqa: BLE001 - the grader (GPU) failing is infra, not the model's fault
            raise _Stop("infra_error", f"grader failed: {type(exc).__name__}: {exc}") from None
        elapsed = self.a.clock() - t
        wait = getattr(verdict, "queue_wait_s", None)
        self.c.queue_wait_s += wait if wait is not None else 0.0
        self.c.submissions = index
        self.c.saw_verdict(verdict.passed, verdict.speedup, verdict.reason)
        source = snap.read_text(errors="replace")
        self.w.emit("submission", attempt_id=self.attempt_id, submission_index=index, kernel_source=source,
                    kernel_sha256=hashlib.sha256(snap.read_bytes()).hexdigest(), kernel_bytes=snap.stat().st_size, evaluation_id=verdict.evaluation_id)
        left = self.spec.budget.submissions - index
        return ToolOutcome(_speedup_text(verdict) + f"\nsubmissions left: {left}", ok=True, counted=True,
                           queue_wait_s=wait if wait is not None else None, evaluation_id=verdict.evaluation_id, verdict=verdict,
                           extra={"elapsed_s": elapsed})


def _bwrap_version() -> str:
    import subprocess

    from mkb.agent._sandbox import bwrap_path

    exe = bwrap_path()
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip() if exe else ""
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "bubblewrap"
