"""The agent: one attempt of any arm, with any model (through litellm) or harness, under a matched budget.

The only package that imports litellm (lazily, on the first model call).
"""

from mkb.agent._attempt import Counters, run_attempt
from mkb.agent._external import ExternalAgent
from mkb.agent._loop import BuiltinAgent
from mkb.agent._replay import ReplayError, replay_attempt
from mkb.agent._sandbox import Limits, SandboxUnavailable
from mkb.agent._scripted import ScriptedModel
from mkb.agent._types import (
    ARM_KINDS, STOP_REASONS, Agent, AttemptResult, AttemptSpec, Budget, EventSink, GradeJob, Grader, ModelConfig,
    SkillSlot, status_of,
)

__all__ = [
    "ARM_KINDS", "Agent", "AttemptResult", "AttemptSpec", "Budget", "BuiltinAgent", "Counters", "EventSink", "ExternalAgent", "GradeJob",
    "Grader", "Limits", "ModelConfig", "ReplayError", "STOP_REASONS", "SandboxUnavailable", "ScriptedModel", "SkillSlot", "replay_attempt",
    "run_attempt", "status_of",
]
