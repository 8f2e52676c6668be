"""Replay of a recorded attempt: its model replies, rebuilt from `turn` events, served again by the scripted model.

The tools, the sandbox and the grader run again for real, so a replay re-checks what the recorded
replies lead to under the current mkb (a new grader version, a fixed sandbox) without calling the
model provider. The spec comes from the attempt's `attempt_started` event and the skill text from its
source attempt's `skill` event (a replay refuses to guess a skill it cannot find).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mkb.agent._types import AttemptSpec, Budget, ModelConfig, SkillSlot


class ReplayError(ValueError):
    """The recorded attempt cannot be replayed (not found, or its skill text is not in the store)."""


def _rows(kind: str, store, attempt_id: str) -> list[dict[str, Any]]:
    from mkb.events import read

    try:
        df = read(kind, store)
    except Exception:  # noqa: BLE001 - a kind with no files
        return []
    if df.height == 0:
        return []
    return df.filter(df["attempt_id"] == attempt_id).sort("seq").to_dicts()


def replay_script(store, attempt_id: str) -> list[dict]:
    """The scripted-model steps that reproduce the attempt's replies, closing turn included."""
    steps = []
    for t in _rows("turn", store, attempt_id):
        if not t.get("reply"):
            continue  # a failed call produced no reply; the replay simply does not fail there
        msg = json.loads(t["reply"])
        step: dict[str, Any] = {"content": msg.get("content"),
                                "usage": {"completion_tokens": t.get("completion_tokens") or 1, "reasoning_tokens": t.get("reasoning_tokens") or 0}}
        if msg.get("reasoning_content"):
            step["reasoning"] = msg["reasoning_content"]
        calls = []
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            calls.append({"id": tc.get("id"), "name": fn.get("name", ""), "arguments": fn.get("arguments", "")})
        if calls:
            step["tool_calls"] = calls
        steps.append(step)
    if not steps:
        raise ReplayError(f"attempt {attempt_id} has no recorded replies in {store}\nhint: `mkb-analyze attempts --store URL` lists attempts")
    return steps


def replay_spec(store, attempt_id: str, *, model: ModelConfig, new_attempt_id: str | None = None) -> AttemptSpec:
    started = _rows("attempt_started", store, attempt_id)
    if not started:
        raise ReplayError(f"attempt {attempt_id} has no attempt_started event in {store}")
    s = started[0]
    skill = None
    if s["arm_kind"] != "solo":
        src = s.get("skill_source_attempt")
        rows = _rows("skill", store, src) if src else []
        text = rows[-1]["text"] if rows else ("" if s.get("skill_empty") else None)
        if text is None:
            raise ReplayError(f"the skill of attempt {attempt_id} (from {src}) is not in {store}\nhint: replay from the store that holds its source attempt")
        skill = SkillSlot.of(text, source_attempt=src)
        if s.get("skill_sha256") and skill.sha256 != s["skill_sha256"]:
            raise ReplayError(f"the skill found for {attempt_id} does not match its recorded sha256")
    budget = Budget(submissions=s["budget_submissions"], turns=s["budget_turns"], output_tokens=s["budget_output_tokens"],
                    working_time_s=s.get("budget_working_time_s"), closing_tokens=s.get("budget_closing_tokens") or Budget().closing_tokens,
                    wall_clock_s=s.get("budget_wall_clock_s"))
    return AttemptSpec(experiment=s["experiment"], problem=s["problem"], target_dsl=s["target_dsl"], arm_kind=s["arm_kind"], replicate=s["replicate"],
                       source_dsl=s.get("source_dsl"), skill=skill, model=model, budget=budget, seed=s.get("seed") or 0, attempt_id=new_attempt_id,
                       header=s.get("skill_header") or "neutral", gpu=s.get("gpu") or "unknown", plan_sha256=s.get("plan_sha256"),
                       wrong_source_problem=s.get("wrong_source_problem"), unsafe_no_sandbox=bool(s.get("unsafe_no_sandbox")))


def replay_attempt(store, attempt_id: str, *, workspace: Path, grader, writer, progress=None):
    """Run the recorded attempt again from its events (model replies scripted; tools, sandbox and grader live)."""
    from mkb.agent._attempt import run_attempt
    from mkb.agent._loop import BuiltinAgent
    from mkb.agent._scripted import ScriptedModel

    steps = replay_script(store, attempt_id)
    with ScriptedModel(steps) as server:
        model = ModelConfig(name="openai/replay", api_base=server.api_base, scripted=True)
        spec = replay_spec(store, attempt_id, model=model)
        return run_attempt(spec, workspace=workspace, grader=grader, writer=writer,
                           agent=BuiltinAgent(progress=progress, attempt_kind="replay", replay_of=attempt_id))
