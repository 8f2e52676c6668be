"""An attempt's workspace and its two fixed messages: the system prompt and the first user message.

Layout: `<workspace>/` holds what the model sees (problem/TASK.md and problem/problem.py, docs/ the
DSL doc pack, SKILL.md, kernel.py once written); `<workspace>.state/` beside it holds what the model
must not touch (sandbox HOME, TMPDIR, the runtime copy, submission snapshots, the frozen final kernel).
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from mkb.agent._skill import SKILL_RULES
from mkb.agent._types import AttemptSpec, Budget

NEUTRAL_HEADER = (
    "## Notes from an earlier attempt\n"
    "An agent wrote the notes below after an earlier kernel-writing attempt. They may or may not apply here; "
    "use them as you judge best."
)
# Upstream's wording (it names the source DSL, so it gives the arm away); kept as a recorded option for replication.
UPSTREAM_HEADER = "## Skill\nThe following SKILL.md was written after solving this problem in {source_dsl}. Use it to solve the problem in {target_dsl}."
EMPTY_SLOT = "(The notes are empty: the earlier attempt wrote none.)"


def state_dir(workspace: Path) -> Path:
    return Path(workspace).with_name(Path(workspace).name + ".state")


@dataclass(frozen=True)
class Prepared:
    workspace: Path
    state: Path
    problem_file: Path  # the host copy of problem.py (source of the sandbox runtime)
    problem_name: str
    problem_hash: str
    task_statement: str
    doc_pack_version: str
    dsl_version: str


def prepare(spec: AttemptSpec, workspace: Path) -> Prepared:
    """Create the workspace: task statement, problem.py (no baselines), the doc pack, an empty SKILL.md."""
    from mkb.agent._docpack import doc_pack_dir, doc_pack_version
    from mkb.dsl import get_backend
    from mkb.problems import get_problem
    from mkb.problems._prompts import task_statement

    workspace = Path(workspace)
    if workspace.exists() and any(workspace.iterdir()):
        raise FileExistsError(f"{workspace}: workspace is not empty\nhint: every attempt starts in a fresh folder")
    problem = get_problem(spec.problem)
    backend = get_backend(spec.target_dsl)
    statement = task_statement(problem, spec.target_dsl)
    if statement.placeholder:
        raise ValueError(f"the {spec.target_dsl} task statement is a placeholder\nhint: the backend has no prompt section yet")
    (workspace / "problem").mkdir(parents=True)
    (workspace / "problem" / "TASK.md").write_text(statement.text)
    shutil.copy2(problem.path, workspace / "problem" / "problem.py")
    shutil.copytree(doc_pack_dir(spec.target_dsl), workspace / "docs")
    (workspace / "SKILL.md").write_text("")
    st = state_dir(workspace)
    st.mkdir(parents=True, exist_ok=True)
    return Prepared(workspace.resolve(), st.resolve(), problem.path, problem.name, problem.hash, statement.text,
                    doc_pack_version(spec.target_dsl), backend.version())


def system_prompt(*, dsl_display: str, workspace_view: str) -> str:
    return f"""\
You are an expert GPU kernel engineer. You write one kernel in {dsl_display} for the task in
problem/TASK.md, in the workspace {workspace_view} (all paths are relative to it).

## Workspace
- problem/TASK.md: the task statement; problem/problem.py: the reference, its inputs and metadata (read-only).
- docs/: the {dsl_display} documentation pack (read-only).
- kernel.py: your solution (`solve(...)`), graded on an NVIDIA GPU.
- SKILL.md: your notes (see below).

## Tools
- read_file, write_file, edit_file: files in the workspace.
- bash: a sandboxed shell in the workspace: no network and no GPU; Python with torch and the DSL is on PATH.
- check: free; runs the static rules and compiles kernel.py on the CPU (no GPU run, no timing).
- submit: grades kernel.py on the GPU: correctness on fresh inputs, then timing against eager PyTorch.
  Each call uses one of your limited submissions.
- finish: ends the attempt; kernel.py as it is then is your final kernel.
Call tools to act; a reply without a tool call is answered with a reminder and still uses a turn.

## Rules
Follow the solution contract in problem/TASK.md. Do not try to read the grader, other attempts, or
anything outside the workspace; the sandbox does not allow it and attempts that try are audited.

{SKILL_RULES}"""


def budget_text(b: Budget) -> str:
    lines = [f"- submissions (submit): {b.submissions}", f"- turns: {b.turns}", f"- output tokens (reasoning included): {b.output_tokens:,}"]
    if b.wall_clock_s:
        lines.append(f"- wall clock: {b.wall_clock_s:.0f} s")
    return "## Budget\n" + "\n".join(lines) + (
        "\nWhen it runs out, kernel.py is frozen as your final kernel and you get one last turn to update SKILL.md.\n")


def first_message(spec: AttemptSpec, statement: str) -> str:
    parts = [statement.rstrip()]
    if spec.skill is not None:
        header = NEUTRAL_HEADER if spec.header == "neutral" else UPSTREAM_HEADER.format(source_dsl=spec.source_dsl, target_dsl=spec.target_dsl)
        body = spec.skill.text if spec.skill.text.strip() else EMPTY_SLOT
        parts.append(f"{header}\n\n<notes>\n{body.rstrip()}\n</notes>")
    parts.append(budget_text(spec.budget))
    return "\n\n".join(parts) + "\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
