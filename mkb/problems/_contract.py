"""The problem contract: the metadata every `problems/<family>/NN_name/problem.py` declares as `META`.

A problem module defines (DESIGN.md, Problem contract):

- ``META = ProblemMeta(...)`` (below).
- ``reference(*inputs)``: the specification. Computes in ``torch.promote_types(dtype, float32)`` so
  that float64 copies of the inputs give the fp64 anchor; only quantisation casts are fixed (roundings
  to the input dtype, as upstream's reference has them, vanish in the anchor and are allowed).
  Returns one tensor or a tuple, in the order of ``META.outputs``. Updates the inputs named in
  ``META.mutates`` in place (and may return them too).
- ``make_inputs(seed, *, device, size="full")`` -> tuple of inputs (tensors, or Python scalars that
  never change), in the order of ``META.inputs``. Shapes, dtypes and scalars depend only on
  ``size``; values depend only on ``seed``, and so does index structure (page assignments,
  sequence cuts, padding) wherever upstream redraws it per draw (``"structure_per_draw"`` in
  ``META.upstream.matches``), so the grader's fresh seeds give every verification draw and every
  timed call a fresh structure of the same shapes. ``size="smoke"`` runs the reference on CPU
  in <= 0.1 s.
- optional ``eager(*inputs)``: what the eager baseline times, when ``reference`` is deliberately
  slow (an exact recurrence). Must agree with ``reference`` within the comparison rules.
- for ``compare="topk"`` outputs: a module function named by ``Output.topk_scores`` taking the
  inputs and returning the full score tensor the selection is made from (indices along
  ``Output.topk_dim`` index into it).
- for ``compare="quantized"`` outputs: a module function named by ``Output.dequantize`` taking the
  full output tuple and returning ``(values, quantum)``: dequantised float values of this output
  and, elementwise, the size of one quantum (format spacing x block scale) at the reference value.
  Optionally ``Output.quantized_from`` names a module function taking the inputs and returning the
  float values the output encodes, before quantisation: their fp64 gap is reported as the output's
  (the encoding is fixed, so it is the rounding before it that can move a code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Family = Literal["attention", "kv_cache", "mlp_norm", "moe", "quantization", "linear_attention"]
FAMILIES: tuple[str, ...] = ("attention", "kv_cache", "mlp_norm", "moe", "quantization", "linear_attention")
CompareMode = Literal["allclose", "exact", "topk", "quantized"]
Peak = Literal["bf16_tc", "fp16_tc", "fp8_tc", "tf32_tc", "fp32_simt", "memory"]


@dataclass(frozen=True)
class Output:
    """One output of `reference`, and how a candidate's value is compared with it."""

    name: str
    compare: CompareMode = "allclose"
    topk_scores: str | None = None  # compare="topk": name of the module's score function
    topk_dim: int = -1
    dequantize: str | None = None  # compare="quantized": name of the module's dequantise function
    quantized_from: str | None = None  # compare="quantized", optional: the module's pre-quantisation values function


UpstreamAspect = Literal[
    "computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness",
]
UPSTREAM_ASPECTS: tuple[str, ...] = (
    "computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness",
)
UPSTREAM_COMMIT = "d90ba28"  # YIGE24/MetaKernelBench, the revision every `Upstream` below was compared against


@dataclass(frozen=True)
class Upstream:
    """How this problem relates to upstream MetaKernelBench's, aspect by aspect, so nothing differs silently.

    Every aspect in `UPSTREAM_ASPECTS` is either in `matches` or has a row in `differs` with the reason
    (a stricter check, an extra check upstream lacks, a recipe that states nothing about it, ...).
    """

    source: Literal["shipped", "recipe"]  # upstream ships problems/<family>/NN_*.py, or only a _sol_execbench recipe
    path: str  # the upstream file compared against, at UPSTREAM_COMMIT
    matches: tuple[UpstreamAspect, ...]
    differs: tuple[tuple[UpstreamAspect, str], ...] = ()  # (aspect, why we differ on purpose)

    def problems(self) -> list[str]:
        """What makes this record incomplete or malformed (empty when every aspect is accounted for once)."""
        out: list[str] = []
        if self.source not in ("shipped", "recipe"):
            out.append(f"source {self.source!r} is not 'shipped' or 'recipe'")
        if not isinstance(self.path, str) or not self.path.strip():
            out.append("path is empty (name the upstream file compared against)")
        seen: list[str] = list(self.matches)
        for row in self.differs:
            if not (isinstance(row, tuple) and len(row) == 2 and isinstance(row[1], str)):
                out.append(f"differs row {row!r} is not (aspect, why)")
                continue
            aspect, why = row
            seen.append(aspect)
            if not why.strip():
                out.append(f"differs row for {aspect!r} gives no reason")
        unknown = sorted({a for a in seen if a not in UPSTREAM_ASPECTS})
        if unknown:
            out.append(f"unknown aspects {unknown} (known: {', '.join(UPSTREAM_ASPECTS)})")
        twice = sorted({a for a in seen if seen.count(a) > 1 and a in UPSTREAM_ASPECTS})
        if twice:
            out.append(f"aspects {twice} are listed more than once (each goes in matches or in differs, once)")
        missing = [a for a in UPSTREAM_ASPECTS if a not in seen]
        if missing:
            out.append(f"aspects {missing} are neither in matches nor in differs")
        return out


@dataclass(frozen=True)
class ProblemMeta:
    """What a problem is, where it comes from, and what it costs at full size.

    `flops` are dense-equivalent FLOPs and `bytes` the minimum HBM traffic (read every input once,
    write every output once) at size="full"; with `peak` they give the speed-of-light time.
    """

    number: int
    name: str  # the directory name without the NN_ prefix, as in problem-catalog.md
    family: Family
    dtypes: tuple[str, ...]
    source_model: str
    source_config: str  # the published config values the shapes come from (hidden size, heads, eps, ...)
    inputs: tuple[str, ...]
    outputs: tuple[Output, ...]
    flops: float
    bytes: float
    peak: Peak
    mutates: tuple[str, ...] = ()  # names from `inputs` updated in place
    exact_reason: str | None = None  # why the fp64 gap is 0 (integer/copy problems); None otherwise
    # inputs that are index structure (page tables, lengths, slot maps, routing), drawn together with each
    # other: the audit does not swap one alone between seeds (it would no longer agree with the rest), and
    # where `upstream` claims structure_per_draw it checks that each of them changes with the seed
    structure_inputs: tuple[str, ...] = ()
    # inputs that upstream's specification makes the same for every seed (a RoPE cos/sin table computed from
    # config constants): exempt from the changes-with-the-seed check, and checked to be the same for two seeds
    fixed_inputs: tuple[str, ...] = ()
    # (input, why): inputs whose redraw can stay within the output tolerance at size="full" under the distribution
    # the specification draws from (a rotary table redrawn as a position shift, to which RoPE scores are invariant;
    # a skip term below the output's bf16 resolution at its scale). The full-size audit records their
    # output_depends_on check as exempt with the reason; the smoke-size audit still requires the dependence.
    insensitive_inputs: tuple[tuple[str, str], ...] = ()
    upstream: Upstream | None = None  # the comparison with upstream MetaKernelBench (issue: upstream fidelity)
    notes: str = ""  # shape choices, deviations, anything a reader of the catalog should know
    extra: dict = field(default_factory=dict, hash=False, compare=False)
