"""Comparison rules: whether a candidate's outputs match a problem's reference (DESIGN, Grader/Correctness).

The expected values are computed once per input draw (`expect`), before any candidate code is
imported, and a candidate's outputs are then checked against them (`compare`). Float outputs are
judged against the fp64 anchor (the reference run on float64 copies of the inputs): the error must
stay within 3 x max(reference error vs anchor, eps(dtype) x max|anchor|), so the tolerance is as
tight as the reference's own rounding allows and no looser than one ulp of the output's scale.
Top-k index outputs are judged on the scores they select from (the module's `topk_scores`), with
the same rule applied to those scores; the fp64 gap of such an output is its scores' gap, taken
from the same measurement as its tolerance. A quantized output's gap is that of the values it
encodes, before quantisation, where the problem names them (`Output.quantized_from`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from mkb.reasons import Reason

TOL_FACTOR = 3.0
QUANTIZED_MAX_OFF_FRACTION = 0.001  # at most 0.1% of elements one quantum off
# positions kept per sampled output (DESIGN, Problem contract, full-size memory): 2^24 x (reference + fp64 anchor)
# is 192 MiB for an fp32 output, against 12 GiB for one of 2^30 elements kept whole
SAMPLE_POSITIONS = 2**24
# bound at import, before any candidate code exists: `math` is not a watched space (mkb.grader._guards), this module is
_isfinite = math.isfinite
_SEED_STEP = 0x9E3779B97F4A7C15  # per-output seeds of one expectation: seed + (j + 1) x this, mod 2^63


@dataclass(frozen=True)
class OutputCheck:
    """The verdict on one output (or one mutated input)."""

    name: str
    ok: bool
    reason: Reason | None = None
    message: str = ""
    max_abs_err: float | None = None
    tolerance: float | None = None


@dataclass(frozen=True)
class Comparison:
    """The verdict on a whole call: ok only if every output and every input check is ok."""

    ok: bool
    reason: Reason | None
    message: str
    checks: tuple[OutputCheck, ...] = ()

    @staticmethod
    def of(checks: Sequence[OutputCheck]) -> "Comparison":
        bad = next((c for c in checks if not c.ok), None)
        if bad is None:
            return Comparison(True, None, "all outputs match", tuple(checks))
        return Comparison(False, bad.reason, f"{bad.name}: {bad.message}", tuple(checks))


@dataclass(frozen=True, eq=False)
class SampledOutput:
    """An allclose output kept at `k` secret positions: the whole output's facts the comparison needs (shape, dtype,
    device, the reference's non-finite positions, whether it is all zero or constant; its tolerance stays in
    `Expected.tolerance`) and the reference and fp64 anchor values there.

    The positions are not stored: `positions()` makes them again from `seed`, so the kept record is a seed and
    2 x k values (DESIGN, Problem contract, full-size memory: the 17 whole expectations of problems 34, 38 and 50
    exceed an H200). Drawn with replacement, so an output wrong in n of its N elements escapes one check with
    probability (1 - k/N)^n.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    seed: int = field(repr=False)
    k: int
    reference: torch.Tensor = field(repr=False)  # (k,) the reference's values at the positions
    anchor: torch.Tensor = field(repr=False)  # (k,) float64, the anchor's values at the positions
    nonfinite: torch.Tensor | None = field(repr=False)  # flat positions where the reference is NaN/Inf; None: > k
    nonfinite_count: int
    all_zero: bool
    constant: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def positions(self) -> torch.Tensor:
        """The k flat positions, made again from the seed on the output's device."""
        return _positions(self.seed, self.numel, self.k, self.device)


def _positions(seed: int, numel: int, k: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randint(numel, (k,), generator=g, device=device)


@dataclass(frozen=True)
class ReferenceFacts:
    """What the full rules read of one whole allclose entry's reference and anchor, read once when the expectation
    is made (the trusted phase, which a prefetch makes ahead of the grading).

    Why: with them, `compare` decides a passing output in one device round trip over the candidate's output and the
    anchor (`_quick_pass`) instead of about ten reductions with a host sync each; on the H200 the re-checks inside
    the candidate loop took most of its `after` part (0.05-0.10 s a grading, events/h200-grader-bench-2-21).
    """

    finite: bool  # the reference and the fp64 anchor are finite everywhere
    all_zero: bool  # the reference is all zero (`_all_zero`)
    constant: bool  # every element of the reference is equal (`_constant`)


@dataclass(frozen=True, eq=False)
class Expected:
    """What a correct call returns for one input draw, with per-output modes and tolerances.

    Entries are the reference's outputs in `META.outputs` order followed by the inputs named in
    `META.mutates` (their state after the reference ran).
    """

    names: tuple[str, ...]
    modes: tuple[str, ...]
    reference: tuple[Any, ...]
    anchor: tuple[torch.Tensor | None, ...]
    ref_error: tuple[float | None, ...]
    tolerance: tuple[float | None, ...]
    n_outputs: int
    mutated: tuple[str, ...] = ()  # input names (META.mutates) whose updated state follows the outputs
    topk: dict = field(default_factory=dict)  # name -> (dim, scores_anchor, score_tolerance)
    dequantize: dict = field(default_factory=dict)  # name -> (fn(outputs) -> (values, quantum), index)
    # per entry, max|anchor| over the finite entries the error was measured on (for a topk output: its
    # scores); ref_error and tolerance of a topk output are in score units, as its OutputCheck reports
    anchor_scale: tuple[float | None, ...] = ()
    # mutated input name -> index of the same-named output whose mode has no per-element float rule
    # (quantized, topk): the updated input must be bitwise the candidate's own (checked) output
    same_as_output: dict = field(default_factory=dict)
    # entry index -> SampledOutput for allclose outputs kept at secret positions (`sample`); their `reference` and
    # `anchor` entries are None
    sampled: dict = field(default_factory=dict)
    # per entry, the ReferenceFacts of a whole allclose entry with an anchor (None elsewhere; () from an older maker)
    facts: tuple[ReferenceFacts | None, ...] = ()

    def nbytes(self) -> int:
        """Bytes of the tensors this expectation keeps alive (a grading keeps one per draw, re-check and final set)."""
        held = [*self.reference, *self.anchor, *(v[1] for v in self.topk.values()),
                *(x for v in self.dequantize.values() for x in v[2:]),
                *(x for s in self.sampled.values() for x in (s.reference, s.anchor, s.nonfinite))]
        seen: dict[int, int] = {}
        for t in held:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())

    def sampled_positions(self) -> dict[str, int]:
        """Output name -> positions kept, for the outputs compared at sampled positions (empty: all whole)."""
        return {self.names[k]: s.k for k, s in sorted(self.sampled.items())}

    def fp64_gap(self) -> dict[str, float]:
        """Per-output max|reference - anchor| / max|anchor| over finite entries (0 where the anchor is all zero).

        A topk output's gap is that of the scores it selects from (reference vs anchor `topk_scores`),
        since the indices themselves carry no rounding; the swap tolerance comes from the same scores.
        """
        out = {}
        for k, (name, e) in enumerate(zip(self.names, self.ref_error)):
            if e is None:
                continue
            scale = self.anchor_scale[k] if k < len(self.anchor_scale) else None
            if scale is None:
                a = self.anchor[k]
                if a is None:
                    continue
                scale = _finite_scale(a)
            out[name] = e / scale if scale > 0 else e
        return out


def as_tuple(result: Any) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def to_fp64(value: Any) -> Any:
    """A float64 copy of a floating tensor (the anchor's inputs); other values are cloned or kept."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).clone() if value.is_floating_point() else value.detach().clone()
    return value


def clone_inputs(inputs: Sequence[Any]) -> tuple:
    return tuple(v.detach().clone() if isinstance(v, torch.Tensor) else v for v in inputs)


def _eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def _finite_scale(anchor: torch.Tensor) -> float:
    finite = torch.isfinite(anchor)
    return float(anchor[finite].abs().max()) if bool(finite.any()) else 0.0


def _anchored(ref: torch.Tensor, anchor: torch.Tensor) -> tuple[float, float, float]:
    """(max|ref - anchor|, max|anchor|, tolerance) over the entries finite in both: the one place a tolerance
    and the fp64 gap (error / scale) are derived, for float outputs and for top-k scores alike."""
    finite = torch.isfinite(anchor) & torch.isfinite(ref.to(torch.float64))
    if not bool(finite.any()):
        return 0.0, 0.0, 0.0
    a = anchor[finite]
    err = float((ref.to(torch.float64)[finite] - a).abs().max())
    scale = float(a.abs().max())
    return err, scale, TOL_FACTOR * max(err, _eps(ref.dtype) * scale)


def expect(module: ModuleType, inputs: Sequence[Any], *, anchor: bool = True) -> Expected:
    """Run the reference (and, for float outputs, the fp64 anchor) on copies of `inputs`.

    `inputs` themselves are left untouched, so the caller can hand them to a candidate afterwards.
    Top-k outputs always get their scores and the scores' anchor (the comparison needs them); `anchor`
    gates the float outputs' anchor and the quantized outputs' pre-quantisation gap.
    """
    meta = module.META
    ref_inputs = clone_inputs(inputs)
    outs = as_tuple(module.reference(*ref_inputs))
    if len(outs) != len(meta.outputs):
        raise ValueError(
            f"problem {meta.number}: reference returned {len(outs)} values but META.outputs names {len(meta.outputs)}\n"
            "hint: return one value per META.outputs entry, in order"
        )
    mut_idx = [meta.inputs.index(n) for n in meta.mutates]
    values = list(outs) + [ref_inputs[i] for i in mut_idx]
    names = [o.name for o in meta.outputs] + [f"input {n}" for n in meta.mutates]
    modes = [o.compare for o in meta.outputs] + [
        "allclose" if isinstance(ref_inputs[i], torch.Tensor) and ref_inputs[i].is_floating_point() else "exact"
        for i in mut_idx
    ]
    modes = [
        "exact" if m == "allclose" and isinstance(v, torch.Tensor) and not v.is_floating_point() else m
        for m, v in zip(modes, values)
    ]
    # A cache updated in place and also returned under its own name (e.g. an fp8 cache compared as
    # `quantized`) must not fall back to a loose float tolerance on its in-place copy.
    out_names = [o.name for o in meta.outputs]
    same_as_output = {}
    for j, n in enumerate(meta.mutates):
        if n in out_names and meta.outputs[out_names.index(n)].compare in ("quantized", "topk"):
            same_as_output[n] = out_names.index(n)
            modes[len(outs) + j] = "same_as_output"
    anchors: list[torch.Tensor | None] = [None] * len(values)
    errs: list[float | None] = [None] * len(values)
    tols: list[float | None] = [None] * len(values)
    scales: list[float | None] = [None] * len(values)
    if anchor and any(m == "allclose" for m in modes):
        # full-size input sets reach 12 GB (fp32 expert weights) and their fp64 copies twice that: the copies the
        # reference ran on are let go before the anchor's are made (`values` keeps the mutated ones), and the
        # anchor's inputs once it has run (all but the mutated ones, which are its expected in-place values)
        del ref_inputs
        a_inputs = list(to_fp64(v) for v in inputs)
        a_outs = as_tuple(module.reference(*a_inputs))
        a_values = list(a_outs) + [a_inputs[i] for i in mut_idx]
        del a_inputs, a_outs
        for k, (m, v, a) in enumerate(zip(modes, values, a_values)):
            if m == "allclose" and isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor):
                a64 = a.detach().to(torch.float64)
                anchors[k] = a64
                errs[k], scales[k], tols[k] = _anchored(v, a64)
    topk = {}
    dequant = {}
    for k, o in enumerate(meta.outputs):
        if o.compare == "topk":
            fn = getattr(module, o.topk_scores)
            s = fn(*clone_inputs(inputs))
            s64 = fn(*(to_fp64(v) for v in inputs)).to(torch.float64)
            errs[k], scales[k], tols[k] = _anchored(s, s64)
            topk[o.name] = (o.topk_dim, s64, tols[k])
        elif o.compare == "quantized":
            fn = getattr(module, o.dequantize)
            rv, rq = fn(outs)
            dequant[o.name] = (fn, k, rv.to(torch.float64), rq.to(torch.float64))
            if anchor and o.quantized_from is not None:  # the gap of the values before the (fixed) encoding
                pre = getattr(module, o.quantized_from)
                v = pre(*clone_inputs(inputs))
                v64 = pre(*(to_fp64(x) for x in inputs)).to(torch.float64)
                errs[k], scales[k], _ = _anchored(v, v64)
    facts = tuple(reference_facts(v, a) if m == "allclose" and isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor)
                  else None for m, v, a in zip(modes, values, anchors))
    return Expected(tuple(names), tuple(modes), tuple(values), tuple(anchors), tuple(errs), tuple(tols),
                    len(outs), tuple(meta.mutates), topk, dequant, tuple(scales), same_as_output, facts=facts)


def sample(expected: Expected, *, seed: int, positions: int = SAMPLE_POSITIONS) -> Expected:
    """`expected` with every allclose output of more than `positions` elements kept at `positions` secret positions.

    The expectation was computed whole (its tolerance and fp64 gap come from the whole output); exact, topk and
    quantized outputs and smaller ones stay whole. `seed` is the expectation's secret (the grader draws it from
    its trusted rng); each output's positions come from it and its index, so they differ between outputs,
    expectations and gradings.
    """
    if positions < 1:
        raise ValueError(f"sample: positions must be >= 1, not {positions}")
    refs, anchors, kept = list(expected.reference), list(expected.anchor), dict(expected.sampled)
    for j, (mode, ref, a) in enumerate(zip(expected.modes, refs, anchors)):
        if mode != "allclose" or not isinstance(ref, torch.Tensor) or not isinstance(a, torch.Tensor) \
                or ref.numel() <= positions:
            continue
        flat = _wide(ref.detach()).reshape(-1)
        bad = ~torch.isfinite(flat)
        n_bad = int(bad.sum())
        nonfinite = bad.nonzero().reshape(-1) if 0 < n_bad <= positions else None
        del bad
        all_zero = not bool(((flat != 0) & ~torch.isnan(flat)).any())
        constant = bool((flat == flat[0]).all())
        s_seed = (seed + (j + 1) * _SEED_STEP) % 2**63
        idx = _positions(s_seed, ref.numel(), positions, ref.device)
        kept[j] = SampledOutput(shape=tuple(ref.shape), dtype=ref.dtype, device=ref.device, seed=s_seed, k=positions,
                                reference=ref.detach().reshape(-1)[idx], anchor=a.reshape(-1)[idx], nonfinite=nonfinite,
                                nonfinite_count=n_bad, all_zero=all_zero, constant=constant)
        refs[j] = anchors[j] = None
        del flat, idx
    return dataclasses.replace(expected, reference=tuple(refs), anchor=tuple(anchors), sampled=kept)


def _structure(name: str, cand: Any, ref: Any) -> OutputCheck | None:
    if not isinstance(ref, torch.Tensor):
        if cand != ref:
            return OutputCheck(name, False, Reason.WRONG_OUTPUT, f"expected {ref!r}, got {cand!r}")
        return OutputCheck(name, True)
    if type(cand) is not torch.Tensor:
        return OutputCheck(name, False, Reason.WRONG_TYPE, f"expected a plain torch.Tensor, got {type(cand).__name__}")
    if cand.shape != ref.shape or cand.dtype != ref.dtype or cand.device != ref.device:
        return OutputCheck(
            name, False, Reason.WRONG_SHAPE,
            f"expected {tuple(ref.shape)} {ref.dtype} on {ref.device}, got {tuple(cand.shape)} {cand.dtype} on {cand.device}",
        )
    return None


def _wide(t: torch.Tensor) -> torch.Tensor:
    """fp8 and other 1-byte floats lack most CPU ops; compare them as float32 (exact for their values)."""
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


def _numbers(t: torch.Tensor) -> torch.Tensor:
    """`t` with bool viewed as bytes, so the degenerate-output rules compare and sum it as numbers."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def _all_zero(t: torch.Tensor) -> bool:
    """No element is nonzero (NaN counts as not nonzero); `t` widened (`_wide`)."""
    t = _numbers(t)
    return not bool(t.to(torch.float64).abs().gt(0).any()) if t.is_floating_point() else not bool(t.ne(0).any())


def _constant(t: torch.Tensor) -> bool:
    """Every element equals the first (a tensor of more than one element; NaN equals nothing)."""
    flat = _numbers(t).reshape(-1)
    return bool((flat == flat[0]).all())


def _degenerate(name: str, cand: torch.Tensor, ref: torch.Tensor) -> OutputCheck | None:
    """NaN/Inf the reference lacks, all-zero or constant outputs the reference is not."""
    if cand.numel() == 0:
        return None
    cand, ref = _wide(cand), _wide(ref)
    if cand.is_floating_point():
        bad_c, bad_r = ~torch.isfinite(cand), ~torch.isfinite(ref)
        if bool((bad_c & ~bad_r).any()):
            n = int((bad_c & ~bad_r).sum())
            return OutputCheck(name, False, Reason.NAN, f"{n} NaN/Inf values where the reference is finite")
        if bool((bad_r & ~bad_c).any()):
            return OutputCheck(name, False, Reason.WRONG_OUTPUT, "finite values where the reference has NaN/Inf")
    if _all_zero(cand) and not _all_zero(ref):
        return OutputCheck(name, False, Reason.ALL_ZERO, "all zeros where the reference is not")
    if cand.numel() > 1 and _constant(cand) and not _constant(ref):
        first = _numbers(cand).reshape(-1)[0]
        return OutputCheck(name, False, Reason.CONSTANT, f"every element equals {first.item()!r}; the reference varies")
    return None


def reference_facts(ref: torch.Tensor, anchor: torch.Tensor) -> ReferenceFacts:
    """The `ReferenceFacts` of one whole allclose entry (its reference and fp64 anchor)."""
    r = _wide(ref.detach())
    return ReferenceFacts(finite=bool(torch.isfinite(r).all()) and bool(torch.isfinite(anchor).all()),
                          all_zero=_all_zero(r), constant=r.numel() > 1 and _constant(r))


def _quick_pass(name: str, mode: str, cand: torch.Tensor, ref: torch.Tensor, anchor: torch.Tensor | None,
                tol: float | None, facts: ReferenceFacts | None) -> OutputCheck | None:
    """A pass decided in one device round trip, or None: the full rules decide.

    Called only where `_structure` passed (a plain tensor of the reference's shape, dtype and device). It passes
    only what the full rules pass, with the same figures, and leaves every failure, and every case it cannot vouch
    for, to them, so a failing verdict's reason and message are theirs (tests/measure/test_compare_quick.py checks
    both against the full rules):
    - exact: bitwise equal to the reference (`torch.equal`, no NaN) is what `_degenerate` and `_exact` pass, since
      equal values share their non-finite positions, their zeros and their constancy;
    - allclose, the reference and its anchor finite everywhere (`facts`): the output's min and max and those of its
      difference to the anchor (float64, as `_allclose` computes it), NaN propagating: all finite means no NaN/Inf
      (where the reference has none); max |difference| is `_allclose`'s error; min == max == 0 is `_all_zero`, and
      min == max is `_constant`.
    """
    if cand.numel() == 0 or cand.layout is not torch.strided or type(cand) is not torch.Tensor:
        return None  # empty, sparse or a subclass: the full rules decide (and word any error) as before 2.22
    if mode == "exact":
        try:
            same = torch.equal(_wide(cand), _wide(ref))
        except (RuntimeError, TypeError):  # a dtype this build cannot compare at once: the full rules do
            return None
        return OutputCheck(name, True, None, "", 0.0, 0.0) if same else None
    if mode != "allclose" or facts is None or not facts.finite or anchor is None or tol is None:
        return None
    c = _wide(cand.detach())
    if not c.is_floating_point():
        return None
    c_lo, c_hi = torch.aminmax(c)
    d_lo, d_hi = torch.aminmax(c - anchor)  # float64: the candidate widened exactly, as `_allclose`'s c.to(float64)
    lo, hi, dlo, dhi = torch.stack((c_lo.to(torch.float64), c_hi.to(torch.float64), d_lo, d_hi)).tolist()
    if not (_isfinite(lo) and _isfinite(hi) and _isfinite(dlo) and _isfinite(dhi)):
        return None
    err = max(abs(dlo), abs(dhi))
    if not err <= tol:
        return None
    if lo == 0 and hi == 0 and not facts.all_zero:
        return None
    if c.numel() > 1 and lo == hi and not facts.constant:
        return None
    return OutputCheck(name, True, None, "", err, tol)


def _allclose(name: str, cand: torch.Tensor, anchor: torch.Tensor, tol: float) -> OutputCheck:
    c = cand.to(torch.float64)
    finite = torch.isfinite(anchor)
    if bool((~finite).any()):
        same = (c[~finite] == anchor[~finite]) | (torch.isnan(c[~finite]) & torch.isnan(anchor[~finite]))
        if not bool(same.all()):
            return OutputCheck(name, False, Reason.WRONG_OUTPUT, "NaN/Inf positions or signs differ from the anchor")
    err = float((c[finite] - anchor[finite]).abs().max()) if bool(finite.any()) else 0.0
    if not err <= tol:  # also catches err = nan
        return OutputCheck(name, False, Reason.WRONG_OUTPUT, f"max |error| {err:.4g} vs fp64 anchor exceeds tolerance {tol:.4g}", err, tol)
    return OutputCheck(name, True, None, "", err, tol)


def _sampled(name: str, cand: Any, s: SampledOutput, tol: float) -> OutputCheck:
    """A sampled output: the candidate's whole output checked for type, shape, dtype, NaN/Inf, all-zero and constant
    against the whole reference's facts (as `_structure` and `_degenerate`), its values at the kept positions
    against the anchor with the whole output's tolerance (as `_allclose`). Boolean temporaries only: a 2^30-element
    output is not copied to float64."""
    if type(cand) is not torch.Tensor:
        return OutputCheck(name, False, Reason.WRONG_TYPE, f"expected a plain torch.Tensor, got {type(cand).__name__}")
    if tuple(cand.shape) != s.shape or cand.dtype != s.dtype or cand.device != s.device:
        return OutputCheck(
            name, False, Reason.WRONG_SHAPE,
            f"expected {s.shape} {s.dtype} on {s.device}, got {tuple(cand.shape)} {cand.dtype} on {cand.device}",
        )
    c = _wide(cand.detach()).reshape(-1)
    idx = s.positions()
    bad_c = ~torch.isfinite(c)
    if s.nonfinite_count == 0:
        if bool(bad_c.any()):
            return OutputCheck(name, False, Reason.NAN, f"{int(bad_c.sum())} NaN/Inf values where the reference is finite")
    elif s.nonfinite is not None:
        bad_r = torch.zeros_like(bad_c)
        bad_r[s.nonfinite] = True
        if bool((bad_c & ~bad_r).any()):
            n = int((bad_c & ~bad_r).sum())
            return OutputCheck(name, False, Reason.NAN, f"{n} NaN/Inf values where the reference is finite")
        if bool((bad_r & ~bad_c).any()):
            return OutputCheck(name, False, Reason.WRONG_OUTPUT, "finite values where the reference has NaN/Inf")
        del bad_r
    else:  # more non-finite reference values than positions: their count, and the kept positions' own values
        n_c = int(bad_c.sum())
        bad_rs, bad_cs = ~torch.isfinite(_wide(s.reference)), bad_c[idx]
        if n_c > s.nonfinite_count or bool((bad_cs & ~bad_rs).any()):
            return OutputCheck(name, False, Reason.NAN,
                               f"NaN/Inf values where the reference is finite ({n_c} in all, the reference has "
                               f"{s.nonfinite_count})")
        if n_c < s.nonfinite_count or bool((bad_rs & ~bad_cs).any()):
            return OutputCheck(name, False, Reason.WRONG_OUTPUT, "finite values where the reference has NaN/Inf")
    del bad_c
    if not bool(((c != 0) & ~torch.isnan(c)).any()) and not s.all_zero:
        return OutputCheck(name, False, Reason.ALL_ZERO, "all zeros where the reference is not")
    if c.numel() > 1 and bool((c == c[0]).all()) and not s.constant:
        return OutputCheck(name, False, Reason.CONSTANT, f"every element equals {c[0].item()!r}; the reference varies")
    check = _allclose(name, c[idx], s.anchor, tol)
    where = f"at {s.k} sampled positions of {s.numel}"
    return dataclasses.replace(check, message=f"{check.message} ({where})" if check.message else where)


def _exact(name: str, cand: torch.Tensor, ref: torch.Tensor) -> OutputCheck:
    cand, ref = _wide(cand), _wide(ref)
    if cand.is_floating_point():
        same = (cand == ref) | (torch.isnan(cand) & torch.isnan(ref))
    else:
        same = cand == ref
    if not bool(same.all()):
        n = int((~same).sum())
        return OutputCheck(name, False, Reason.WRONG_OUTPUT, f"{n} of {cand.numel()} elements differ (exact comparison)")
    return OutputCheck(name, True, None, "", 0.0, 0.0)


def _topk(name: str, cand: torch.Tensor, ref: torch.Tensor, dim: int, scores: torch.Tensor, tol: float) -> OutputCheck:
    """Index sets equal up to swaps of entries whose scores are within tolerance (order within a set is free)."""
    if cand.is_floating_point():
        return OutputCheck(name, False, Reason.WRONG_SHAPE, f"top-k indices must be integers, got {cand.dtype}")
    n = scores.shape[dim]
    c = cand.long()
    if bool(((c < 0) | (c >= n)).any()):
        return OutputCheck(name, False, Reason.WRONG_OUTPUT, f"indices outside [0, {n})")
    srt = c.sort(dim=dim).values
    if srt.shape[dim] > 1 and bool((srt.diff(dim=dim) == 0).any()):
        return OutputCheck(name, False, Reason.WRONG_OUTPUT, "an index appears twice in one top-k set")
    sc = torch.gather(scores, dim, c).sort(dim=dim, descending=True).values
    sr = torch.gather(scores, dim, ref.long()).sort(dim=dim, descending=True).values
    err = float((sc - sr).abs().max()) if sc.numel() else 0.0
    if not err <= tol:
        return OutputCheck(name, False, Reason.WRONG_OUTPUT,
                           f"selected scores differ from the reference selection by {err:.4g} > tolerance {tol:.4g}", err, tol)
    return OutputCheck(name, True, None, "", err, tol)


def _quantized(name: str, cv: torch.Tensor, rv: torch.Tensor, quantum: torch.Tensor) -> OutputCheck:
    """Dequantised values equal, except at most 0.1% of elements one quantum off."""
    diff = (cv.to(torch.float64) - rv).abs()
    q = quantum.expand_as(diff)
    if bool(torch.isnan(diff).any()):
        return OutputCheck(name, False, Reason.NAN, "dequantised candidate has NaN")
    beyond = diff > q * 1.001 + 1e-300
    if bool(beyond.any()):
        return OutputCheck(name, False, Reason.WRONG_OUTPUT,
                           f"{int(beyond.sum())} elements more than one quantum off (max |error| {float(diff.max()):.4g})",
                           float(diff.max()))
    off = diff > q * 0.01
    n_off, allowed = int(off.sum()), int(QUANTIZED_MAX_OFF_FRACTION * diff.numel())
    if n_off > allowed:
        return OutputCheck(name, False, Reason.WRONG_OUTPUT,
                           f"{n_off} elements one quantum off; at most {allowed} (0.1%) allowed", float(diff.max()))
    return OutputCheck(name, True, None, f"{n_off} elements one quantum off", float(diff.max()) if diff.numel() else 0.0)


def compare(expected: Expected, outputs: Any, *, inputs_after: Sequence[Any] | None = None,
            input_names: Sequence[str] | None = None) -> Comparison:
    """Check a candidate's return value (and, for `mutates` problems, its updated inputs) against `expected`.

    `inputs_after` are the inputs the candidate was called with, as they are after the call, in
    `META.inputs` order (`input_names`); they are needed only when the problem mutates inputs.
    """
    outs = as_tuple(outputs)
    if len(outs) != expected.n_outputs:
        return Comparison(False, Reason.WRONG_SHAPE, f"expected {expected.n_outputs} outputs, got {len(outs)}")
    values = list(outs)
    mutated = expected.mutated
    if mutated:
        if inputs_after is None or input_names is None:
            raise ValueError("this problem mutates inputs: pass inputs_after and input_names to compare()")
        values += [inputs_after[list(input_names).index(n)] for n in mutated]
    checks = []
    for k, (name, mode, ref, cand) in enumerate(zip(expected.names, expected.modes, expected.reference, values)):
        if k in expected.sampled:
            checks.append(_sampled(name, cand, expected.sampled[k], expected.tolerance[k]))
            continue
        check = _structure(name, cand, ref)
        if check is None:
            check = _quick_pass(name, mode, cand, ref, expected.anchor[k], expected.tolerance[k],
                                expected.facts[k] if k < len(expected.facts) else None)
        if check is None:
            check = _degenerate(name, cand, ref)
        if check is None:
            if mode == "allclose":
                check = _allclose(name, cand, expected.anchor[k], expected.tolerance[k])
            elif mode == "exact":
                check = _exact(name, cand, ref)
            elif mode == "same_as_output":
                own = outs[expected.same_as_output[name.removeprefix("input ")]]
                same = isinstance(own, torch.Tensor) and own.shape == cand.shape and own.dtype == cand.dtype \
                    and torch.equal(own.view(torch.uint8) if own.element_size() == 1 else own, cand.view(torch.uint8) if cand.element_size() == 1 else cand)
                check = OutputCheck(name, same, None if same else Reason.WRONG_OUTPUT,
                                    "" if same else "the input updated in place differs from the returned output of the same name")
            elif mode == "topk":
                dim, scores, stol = expected.topk[name]
                check = _topk(name, cand, ref, dim, scores, stol)
            elif mode == "quantized":
                fn, idx, rv, rq = expected.dequantize[name]
                try:
                    cv, _ = fn(tuple(outs))
                except Exception as exc:  # a malformed candidate output breaks dequantisation
                    check = OutputCheck(name, False, Reason.WRONG_OUTPUT, f"cannot dequantise: {exc}")
                else:
                    check = _quantized(name, cv, rv, rq)
            else:
                raise ValueError(f"unknown compare mode {mode!r} for output {name!r}")
        checks.append(check)
    return Comparison.of(checks)


def inputs_unchanged(pristine: Sequence[Any], after: Sequence[Any], *, names: Sequence[str],
                     mutates: Sequence[str] = ()) -> Comparison:
    """Inputs not in `mutates` must be bitwise what they were before the call."""
    checks = []
    for name, before, now in zip(names, pristine, after):
        if name in mutates or not isinstance(before, torch.Tensor):
            continue
        if type(now) is not torch.Tensor or now.shape != before.shape or now.dtype != before.dtype:
            checks.append(OutputCheck(name, False, Reason.INPUT_MUTATED, "input replaced by a different object"))
            continue
        a, b = _wide(before.reshape(-1)), _wide(now.reshape(-1))
        if torch.equal(a, b):  # bitwise the same values (no NaN): what the rule below passes, in one round trip
            checks.append(OutputCheck(name, True))
            continue
        if a.is_floating_point():
            same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        else:
            same = a == b
        if not bool(same.all()):
            checks.append(OutputCheck(name, False, Reason.INPUT_MUTATED, f"{int((~same).sum())} elements changed; it is not in META.mutates"))
        else:
            checks.append(OutputCheck(name, True))
    return Comparison.of(checks)
