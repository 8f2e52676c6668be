"""The agent: one attempt of any arm, with any model (through litellm) or harness, under a matched budget."""

from mkb.agent._types import (
    ARM_KINDS, STOP_REASONS, Agent, AttemptResult, AttemptSpec, Budget, EventSink, GradeJob, Grader, ModelConfig,
    SkillSlot, status_of,
)


def run_attempt(spec, *, workspace, grader, writer, agent=None):
    """Run one attempt with `agent` (default: the built-in litellm loop)."""
    from mkb.agent._attempt import run_attempt as _run

    return _run(spec, workspace=workspace, grader=grader, writer=writer, agent=agent)


__all__ = [
    "ARM_KINDS", "Agent", "AttemptResult", "AttemptSpec", "Budget", "EventSink", "GradeJob", "Grader", "ModelConfig",
    "STOP_REASONS", "SkillSlot", "run_attempt", "status_of",
]
