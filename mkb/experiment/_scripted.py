"""The demo's model: a scripted agent per attempt that submits the problem's baseline kernel and writes a fixed skill.

Every arm of every coordinate writes the same kernel, so a scripted experiment's lift is zero by construction
(up to timing noise at the R@t thresholds): it shows the pipeline (plan, claims, release order, skills handed
on, gradings, pair re-grade, analysis), not a finding. The script goes through litellm and the agent's real loop.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mkb.agent import AttemptResult, AttemptSpec

SKILL = ("Scripted demo note ({dsl}). One block per row or per independent slice, vectorised loads, the reduction kept in "
         "registers and a single write of each output; the baseline was submitted unchanged, so this note carries no "
         "information learned from the problem.")


def baseline_path(problem: int, dsl: str) -> Path:
    from mkb.experiment._problems import all_problems
    from mkb.problems import discover

    name = all_problems()[problem].name
    for p in discover():
        d = p.parent if p.name == "problem.py" else p
        if d.name == name:
            f = d / f"{dsl}.py"
            if not f.exists():
                raise FileNotFoundError(f"problem {problem} has no {dsl} baseline ({f})\nhint: the scripted demo needs "
                                        "problems with baselines in every DSL (25, 28, 29, 72)")
            return f
    raise FileNotFoundError(f"problem {problem} not found")


def script(problem: int, dsl: str) -> list[dict]:
    def w(path: str, content: str) -> dict:
        return {"name": "write_file", "arguments": {"path": path, "content": content}}

    return [
        {"tool_calls": [w("kernel.py", baseline_path(problem, dsl).read_text())], "reasoning": "Start from a known kernel."},
        {"tool_calls": [{"name": "submit", "arguments": {}}]},
        {"tool_calls": [w("SKILL.md", SKILL.format(dsl=dsl)), {"name": "finish", "arguments": {}}]},
        {"tool_calls": [w("SKILL.md", SKILL.format(dsl=dsl))]},  # the closing turn
    ]


class ScriptedRunner:
    """A Runner: one scripted model server per attempt (its own script), then `mkb.agent.run_attempt`."""

    def __init__(self, *, unsafe_no_sandbox: bool | None = None) -> None:
        if unsafe_no_sandbox is None:
            from mkb.agent._sandbox import probe

            unsafe_no_sandbox = probe() is not None
        self.unsafe = unsafe_no_sandbox

    def __call__(self, spec: AttemptSpec, *, workspace: Path, grader: Any, writer: Any) -> AttemptResult:
        from mkb.agent import run_attempt
        from mkb.agent._scripted import ScriptedModel

        with ScriptedModel(script(spec.problem, spec.target_dsl)) as server:
            model = dataclasses.replace(spec.model, api_base=server.api_base, scripted=True,
                                        request_timeout_s=120.0)
            s = dataclasses.replace(spec, model=model, unsafe_no_sandbox=self.unsafe or spec.unsafe_no_sandbox)
            return run_attempt(s, workspace=workspace, grader=grader, writer=writer)
