"""Task statements: one per problem, rendered for each DSL, identical outside the DSL's own section.

The problem-specific part comes from the problem module (docstring, META, the signature of
`reference`) and the solution contract from DESIGN.md; the DSL part is exactly
`mkb.dsl.get_backend(name).prompt_section()`, fenced by markers so a test (and a reader) can check
that two variants of a problem differ nowhere else.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from mkb.dsl import dsl_names, get_backend
from mkb.measure import speed_of_light
from mkb.problems._catalog import describe_inputs, format_shape, si
from mkb.problems._loader import Problem, shared_helpers

DSL_BEGIN = "<!-- mkb:dsl-section:begin -->"
DSL_END = "<!-- mkb:dsl-section:end -->"

SOLUTION_CONTRACT = """\
## What to write
Write `kernel.py` defining `solve({args})`. It must return what the reference returns (same
number of outputs, shapes, dtypes and device){mutates_clause}.

Rules (static checks enforce what they can, the grader the rest):
- Every call of `solve` launches at least one kernel written in the DSL named below, and the
  outputs depend on it.
- Forbidden: torch.compile, torch.jit, Triton, raw CUDA or C++ extensions, ctypes, subprocess,
  threads, CUDA graphs, kernels imported from DSL libraries, calling the reference or
  make_inputs, caching input-dependent results between calls, writing os.environ or global torch
  numerics flags (e.g. TF32), inspecting the grader.
- Outputs are plain torch.Tensor objects (no subclasses, no lazy values).

## How it is judged
- Correctness: at least 5 input draws with fresh secret seeds; each seed draws the values and, where
  the problem says so, the index structure (page assignments, sequence cuts, padding). Float outputs must be within
  3 x max(reference error vs an fp64 anchor, eps(dtype) x max|anchor|) of the anchor (the reference
  run on float64 copies of the inputs); integer outputs exactly equal; NaN/Inf, all-zero and
  constant outputs fail; inputs not listed as updated must be left unchanged.
- Speed: end-to-end time per call (synchronize, event, solve, device-wide synchronize, event)
  with fresh input values at fresh addresses every call and L2 flushed between calls; at least
  10 warm-ups and 50 timed calls; the median is compared with the eager PyTorch baseline on the
  same GPU. Random timed calls are re-checked for correctness.
"""


@dataclass(frozen=True)
class TaskStatement:
    problem: int
    dsl: str
    text: str
    placeholder: bool  # the DSL section is a placeholder (the backend does not exist yet)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _output_shapes(problem: Problem) -> list[str] | None:
    """Output shapes at full size, from the reference on meta tensors (None if it needs real values)."""
    try:
        inputs = problem.make_inputs(0, device="meta", size="full")
        out = problem.reference(*inputs)
    except Exception:
        return None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    res = []
    for o, v in zip(problem.meta.outputs, outs):
        if isinstance(v, torch.Tensor):
            res.append(f"{o.name}: {str(v.dtype).removeprefix('torch.')}[{', '.join(map(str, v.shape))}]")
        else:
            res.append(f"{o.name}: {type(v).__name__}")
    return res


_COMPARE_TEXT = {
    "allclose": "fp64-anchored tolerance",
    "exact": "exactly equal",
    "topk": "index set equal up to swaps of entries whose scores are within tolerance (order free)",
    "quantized": "compared dequantised: at most 0.1% of elements one quantum off, the rest equal",
}


def common_statement(problem: Problem) -> str:
    """Everything of the task statement except the DSL section (the part both variants share)."""
    m = problem.meta
    args = ", ".join(m.inputs)
    sol = speed_of_light(flops=m.flops, bytes=m.bytes, peak=m.peak, gpu="H200")
    lines = [f"# Problem {m.number:02d}: {m.name}", "", problem.docstring.strip(), ""]
    lines += ["## The problem module (problem.py: `reference` is the specification)", "```python",
              problem.path.read_text().rstrip(), "```", ""]
    for helper in shared_helpers(problem.path):  # part of the specification too (encodings, page tables, routing)
        lines += [f"## Imported by problem.py: mkb/problems/{helper.name}", "```python", helper.read_text().rstrip(), "```", ""]
    lines += ["## Inputs at full size (what the grader uses)"]
    lines += [f"- {format_shape(s)}" for s in describe_inputs(problem, size="full")]
    lines += ["", "## Outputs"]
    shapes = _output_shapes(problem)
    for k, o in enumerate(m.outputs):
        desc = shapes[k] if shapes else o.name
        lines.append(f"- {desc} ({_COMPARE_TEXT[o.compare]})")
    if m.mutates:
        lines.append(f"- updated in place: {', '.join(m.mutates)} (compared after the call)")
    lines += ["", "## Source", f"- model: {m.source_model}", f"- config: {m.source_config}"]
    if m.notes:
        lines.append(f"- notes: {m.notes}")
    lines += ["", "## Cost at full size",
              f"- {si(m.flops, 'FLOP')}, {si(m.bytes, 'B')} minimum memory traffic; peak class `{m.peak}`",
              f"- speed of light on an H200: {sol.us:.1f} us ({sol.bound}-bound)", ""]
    mut = f", and update {', '.join(m.mutates)} in place as the reference does" if m.mutates else ""
    lines.append(SOLUTION_CONTRACT.format(args=args, mutates_clause=mut))
    return "\n".join(lines)


def dsl_section(dsl: str) -> tuple[str, bool]:
    """The backend's prompt section, or a clearly labelled placeholder while the backend is not written."""
    if dsl not in dsl_names():
        raise ValueError(f"unknown DSL {dsl!r}\nhint: known DSLs are {', '.join(dsl_names())}")
    try:
        return get_backend(dsl).prompt_section().strip(), False
    except (ImportError, AttributeError, NotImplementedError):
        return (
            f"## DSL: {dsl}\n[PLACEHOLDER: the {dsl} section of this task statement is not written yet; "
            f"mkb/dsl/{dsl}.py provides it through DslBackend.prompt_section(). Do not run experiments "
            f"with this text.]"
        ), True


def task_statement(problem: Problem, dsl: str) -> TaskStatement:
    """The full task statement of `problem` for `dsl`."""
    section, placeholder = dsl_section(dsl)
    text = f"{common_statement(problem).rstrip()}\n\n{DSL_BEGIN}\n{section}\n{DSL_END}\n"
    return TaskStatement(problem.number, dsl, text, placeholder)


def split_dsl_section(text: str) -> tuple[str, str, str]:
    """(before, DSL section, after) of a rendered statement."""
    head, sep, rest = text.partition(DSL_BEGIN)
    body, sep2, tail = rest.partition(DSL_END)
    if not sep or not sep2:
        raise ValueError("task statement lacks the DSL section markers")
    return head, body, tail
