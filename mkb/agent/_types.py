"""The coordinates, settings and results of one agent attempt, shared by the agent, the experiment and the harness adapters."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from concurrent.futures import Future

    from mkb.grader import Verdict

ARM_KINDS = ("solo", "transfer", "placebo", "same", "wrong")
# Why an attempt ended (DESIGN "Events": attempt_finished.stop_reason). `status` keeps DESIGN's three coarse values.
STOP_REASONS = ("finished", "submissions", "turns", "output_tokens", "working_time", "wall_clock", "context_exhausted", "infra_error")
HEADERS = ("neutral", "upstream")


def status_of(stop_reason: str) -> str:
    """DESIGN's coarse status for a stop reason: finished, budget_exhausted or infra_error."""
    if stop_reason == "finished":
        return "finished"
    if stop_reason == "infra_error":
        return "infra_error"
    return "budget_exhausted"


@dataclass(frozen=True)
class Budget:
    """What every arm may spend; identical across arms of a coordinate and recorded on attempt_started.

    `working_time_s` (wall minus grading-queue wait minus API backoff) is a safety cap, not a budget the
    arms compete under: provider latency differs between the solo and the later skill arms. `wall_clock_s`
    binds only in the upstream-compatible preset (2400 s). The closing turn's allowance is reserved from the
    start, outside the main budget, for every arm alike.
    """

    submissions: int = 10
    turns: int = 80
    output_tokens: int = 300_000
    working_time_s: float | None = 4 * 3600.0
    closing_tokens: int = 4_000
    wall_clock_s: float | None = None

    @classmethod
    def upstream(cls) -> "Budget":
        """Upstream's harness (Harbor + Terminus-2): 10 submissions and a binding 2400 s wall clock."""
        return cls(wall_clock_s=2400.0)


@dataclass(frozen=True)
class ModelConfig:
    """One model as litellm names it, with its sampling settings (all recorded on attempt_started)."""

    name: str  # litellm model string, e.g. "openai/gpt-5", "anthropic/claude-sonnet-4-5", "hosted_vllm/Qwen/Qwen3-32B"
    api_base: str | None = None
    api_key_env: str | None = None  # name of the environment variable holding the key; the key itself is never recorded
    temperature: float = 1.0
    reasoning_effort: str | None = None
    max_tokens_per_turn: int = 32_000
    scripted: bool = False  # the scripted test/demo model (a local OpenAI-compatible server)
    request_timeout_s: float = 900.0  # hard total timeout of one completion (litellm's default is 6000 s)
    max_retries: int = 6  # mkb's own retries on 429/5xx/timeouts, with exponential backoff; not charged to the budget
    retry_base_s: float = 2.0  # first backoff; doubles per retry (with jitter) up to retry_cap_s
    retry_cap_s: float = 120.0


@dataclass(frozen=True)
class SkillSlot:
    """The SKILL.md an arm is given verbatim (an empty text is allowed: its source wrote none, flagged)."""

    text: str
    sha256: str
    source_attempt: str | None
    flags: tuple[str, ...] = ()

    @classmethod
    def of(cls, text: str, *, source_attempt: str | None = None, flags: tuple[str, ...] = ()) -> "SkillSlot":
        if not text.strip() and "empty" not in flags:
            flags = (*flags, "empty")
        return cls(text=text, sha256=hashlib.sha256(text.encode()).hexdigest(), source_attempt=source_attempt, flags=flags)


@dataclass(frozen=True)
class AttemptSpec:
    """One attempt: a variant (problem, target DSL), an arm's skill slot, a model and a budget."""

    experiment: str
    problem: int
    target_dsl: str
    arm_kind: str  # solo | transfer | placebo | same | wrong
    replicate: int
    source_dsl: str | None
    skill: SkillSlot | None
    model: ModelConfig
    budget: Budget
    seed: int = 0
    attempt_id: str | None = None
    header: str = "neutral"  # how the skill is introduced: "neutral" (one header for every non-solo arm) or "upstream"
    gpu: str = "unknown"
    plan_sha256: str | None = None
    wrong_source_problem: int | None = None
    unsafe_no_sandbox: bool = False  # run bash/check without the sandbox (recorded; the analysis reports such attempts apart)

    def __post_init__(self) -> None:
        if self.arm_kind not in ARM_KINDS:
            raise ValueError(f"arm_kind {self.arm_kind!r} is not one of {', '.join(ARM_KINDS)}")
        if self.header not in HEADERS:
            raise ValueError(f"header {self.header!r} is not one of {', '.join(HEADERS)}")
        if self.arm_kind == "solo" and self.skill is not None:
            raise ValueError("a solo attempt gets no skill slot")
        if self.arm_kind != "solo" and self.skill is None:
            raise ValueError(f"arm_kind {self.arm_kind!r} needs a skill slot (SkillSlot.of('') for an empty one)")


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt left: why it stopped, its final kernel and skill, and what it spent."""

    attempt_id: str
    stop_reason: str
    final_kernel_sha256: str | None
    final_kernel_path: Path | None
    skill_text: str
    skill_sha256: str
    submissions: int
    turns: int
    output_tokens: int
    cost_usd: float | None
    closing_turn: bool = False
    skill_flags: tuple[str, ...] = ()
    best_verdict: dict[str, Any] | None = field(default=None, compare=False)
    error: str | None = None  # why it stopped, for infra_error and context_exhausted

    @property
    def status(self) -> str:
        return status_of(self.stop_reason)


@dataclass(frozen=True)
class GradeJob:
    """One kernel to grade. Mirrors mkb.grader's GradeJob (helper "core"); swap to that class when it lands."""

    problem: int
    dsl: str
    kernel_path: Path
    experiment: str = "default"
    attempt_id: str | None = None
    scope: str = "submission"


@runtime_checkable
class Grader(Protocol):
    """The grading queue as the agent sees it (mkb.grader.GradingQueue satisfies it)."""

    def submit(self, job: GradeJob) -> "Future[Verdict]": ...


class EventSink(Protocol):
    """The writer an attempt appends to: mkb.events.EventWriter's public API."""

    def emit(self, kind: str, *, attempt_id: str | None = None, **payload: Any) -> str: ...

    def flush(self) -> list[str]: ...


@runtime_checkable
class Agent(Protocol):
    """Anything that can run one attempt in a prepared workspace: the built-in loop or an external harness adapter."""

    def run(self, spec: AttemptSpec, *, workspace: Path, grader: Grader, writer: EventSink) -> AttemptResult: ...
