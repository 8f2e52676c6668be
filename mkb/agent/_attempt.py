"""What every agent shares around its loop: secret-safe event emission, attempt_started/finished, the skill event, run_attempt."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkb._secrets import redact, secret_values
from mkb.agent._types import Agent, AttemptResult, AttemptSpec, EventSink, Grader, status_of


class SafeWriter:
    """Emits through `writer` with every environment secret replaced by `[redacted:NAME]`.

    A model can echo a key it somehow learned, a harness can leak one into a tool result; whatever
    the source, no value of a credential-looking environment variable (nor the model's API key) is
    written to an event. Emission errors never stop an attempt silently: they propagate.
    """

    def __init__(self, writer: EventSink, *, extra_secrets: dict[str, str] | None = None) -> None:
        self.writer = writer
        self.secrets = {**secret_values(), **(extra_secrets or {})}

    def redact(self, value: Any) -> Any:
        """`value` with every secret replaced: also what goes back to the model (a graded kernel can read the parent's
        environment through /proc and print it into its verdict's message)."""
        return redact(value, self.secrets)

    def emit(self, kind: str, *, attempt_id: str | None = None, **payload: Any) -> str:
        return self.writer.emit(kind, attempt_id=attempt_id, **{k: self.redact(v) for k, v in payload.items()})

    def flush(self) -> list[str]:
        return self.writer.flush()


@dataclass
class Counters:
    """What an attempt has spent so far (the live progress line reads it)."""

    turns: int = 0
    submissions: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    input_tokens: int = 0
    closing_output_tokens: int = 0
    tool_calls: int = 0
    cost_usd: float | None = None
    backoff_s: float = 0.0
    queue_wait_s: float = 0.0
    best_passed: bool = False
    best_speedup: float | None = None
    last_reason: str | None = None
    phase: str = "main"
    served_models: list[str] = field(default_factory=list)  # what the provider said served the turns, in first-seen order
    extra: dict[str, Any] = field(default_factory=dict)

    def add_cost(self, c: float | None) -> None:
        if c is not None:
            self.cost_usd = (self.cost_usd or 0.0) + c

    def saw_verdict(self, passed: bool, speedup: float | None, reason: str | None) -> None:
        self.last_reason = reason
        if passed:
            self.best_passed = True
            if speedup is not None and (self.best_speedup is None or speedup > self.best_speedup):
                self.best_speedup = speedup

    def line(self, budget) -> str:
        best = "none passed" if not self.best_passed else f"passed, best {self.best_speedup:.2f}x" if self.best_speedup else "passed"
        return (f"turn {self.turns}/{budget.turns}  tokens {self.output_tokens:,}/{budget.output_tokens:,}  "
                f"submissions {self.submissions}/{budget.submissions}  {best}" + (f"  [{self.phase}]" if self.phase != "main" else ""))


def started_payload(spec: AttemptSpec, *, problem_name: str, family: str | None, problem_hash: str, dsl_version: str,
                    doc_pack_version: str, grader_version: str, attempt_kind: str, extra: dict[str, Any]) -> dict[str, Any]:
    b = spec.budget
    wall = b.wall_clock_s if b.wall_clock_s is not None else b.working_time_s if b.working_time_s is not None else float("inf")
    skill = spec.skill
    return {
        "experiment": spec.experiment, "model": spec.model.name, "problem": spec.problem, "problem_name": problem_name, "family": family,
        "problem_hash": problem_hash, "target_dsl": spec.target_dsl, "source_dsl": spec.source_dsl, "arm_kind": spec.arm_kind,
        "replicate": spec.replicate, "gpu": spec.gpu, "budget_submissions": b.submissions, "budget_turns": b.turns,
        "budget_output_tokens": b.output_tokens, "budget_wall_s": wall, "grader_version": grader_version, "dsl_version": dsl_version,
        "doc_pack_version": doc_pack_version, "skill_sha256": skill.sha256 if skill else None,
        "skill_source_attempt": skill.source_attempt if skill else None, "skill_empty": (not skill.text.strip()) if skill else None,
        "wrong_source_problem": spec.wrong_source_problem, "plan_sha256": spec.plan_sha256,
        "attempt_kind": attempt_kind, "budget_closing_tokens": b.closing_tokens, "budget_working_time_s": b.working_time_s,
        "budget_wall_clock_s": b.wall_clock_s, "model_api_base": spec.model.api_base, "temperature": spec.model.temperature,
        "reasoning_effort": spec.model.reasoning_effort, "max_tokens_per_turn": spec.model.max_tokens_per_turn,
        "request_timeout_s": spec.model.request_timeout_s, "seed": spec.seed, "skill_header": spec.header,
        "skill_flags": list(skill.flags) if skill else None, "unsafe_no_sandbox": spec.unsafe_no_sandbox, **extra,
    }


def grader_version() -> str:
    try:
        from mkb.grader import GRADER_VERSION

        return str(GRADER_VERSION)
    except Exception:  # noqa: BLE001 - recorded as unknown rather than failing the attempt
        return "unknown"


def file_sha256(path: Path | None) -> str | None:
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def freeze_kernel(workspace: Path, state: Path) -> Path | None:
    """Copy kernel.py (a regular file inside the workspace, not a link) to `<state>/final_kernel.py`."""
    from mkb.agent._tools import ToolError, resolve_in

    try:
        src = resolve_in(workspace, "kernel.py", write=False)
    except ToolError:
        return None
    if (workspace / "kernel.py").is_symlink() or not src.is_file():
        return None
    dest = state / "final_kernel.py"
    shutil.copyfile(src, dest)
    return dest


def read_skill(workspace: Path, limit: int = 1 << 20) -> str:
    """SKILL.md as the model left it ('' when missing, a link, or not a regular file)."""
    p = workspace / "SKILL.md"
    if p.is_symlink() or not p.is_file():
        return ""
    with p.open("rb") as f:
        return f.read(limit).decode(errors="replace")


def emit_skill(writer: SafeWriter, attempt_id: str, spec: AttemptSpec, *, text: str, problem_name: str, kernel_source: str):
    from mkb.agent._skill import check_skill, tokenizer_id

    chk = check_skill(text, dsl=spec.target_dsl, problem_number=spec.problem, problem_name=problem_name, kernel_source=kernel_source)
    writer.emit("skill", attempt_id=attempt_id, text=chk.text, sha256=chk.sha256, token_length=chk.token_length, tokenizer=tokenizer_id(),
                hygiene_flags=list(chk.flags), source_attempt=attempt_id, original_token_length=chk.original_token_length,
                text_untruncated=text if chk.text != text else None)
    return chk


def finished_payload(stop_reason: str, c: Counters, *, working_s: float, wall_s: float, final_sha: str | None, skill_sha: str,
                     closing: bool, closing_skipped: str | None, error: str | None, unsafe: bool, harness_tokens: dict | None = None) -> dict:
    return {
        "status": status_of(stop_reason), "submissions_used": c.submissions, "turns_used": c.turns, "input_tokens": c.input_tokens,
        "output_tokens": c.output_tokens, "cost_usd": c.cost_usd, "wall_s": wall_s - c.queue_wait_s, "final_kernel_sha256": final_sha,
        "error": error, "stop_reason": stop_reason, "closing_turn": closing, "closing_skipped_reason": closing_skipped,
        "closing_output_tokens": c.closing_output_tokens, "reasoning_tokens": c.reasoning_tokens, "tool_calls": c.tool_calls,
        "working_s": working_s, "backoff_s": c.backoff_s, "queue_wait_s": c.queue_wait_s, "best_passed": c.best_passed,
        "best_speedup": c.best_speedup, "skill_sha256": skill_sha, "unsafe_no_sandbox": unsafe,
        "harness_tokens_reported": json.dumps(harness_tokens) if harness_tokens is not None else None,
        "served_model": "|".join(c.served_models) or None,
    }


def run_attempt(spec: AttemptSpec, *, workspace: Path, grader: Grader, writer: EventSink, agent: Agent | None = None) -> AttemptResult:
    """Run one attempt of `spec` in a fresh `workspace` with `agent` (default: the built-in litellm loop)."""
    if agent is None:
        from mkb.agent._loop import BuiltinAgent

        agent = BuiltinAgent()
    return agent.run(spec, workspace=Path(workspace), grader=grader, writer=writer)
