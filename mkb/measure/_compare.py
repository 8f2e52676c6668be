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

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from mkb.reasons import Reason

TOL_FACTOR = 3.0
QUANTIZED_MAX_OFF_FRACTION = 0.001  # at most 0.1% of elements one quantum off


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
    return Expected(tuple(names), tuple(modes), tuple(values), tuple(anchors), tuple(errs), tuple(tols),
                    len(outs), tuple(meta.mutates), topk, dequant, tuple(scales), same_as_output)


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
    c = cand.view(torch.uint8) if cand.dtype == torch.bool else cand
    r = ref.view(torch.uint8) if ref.dtype == torch.bool else ref
    c_zero = not bool(c.to(torch.float64).abs().gt(0).any()) if c.is_floating_point() else not bool(c.ne(0).any())
    r_zero = not bool(r.to(torch.float64).abs().gt(0).any()) if r.is_floating_point() else not bool(r.ne(0).any())
    if c_zero and not r_zero:
        return OutputCheck(name, False, Reason.ALL_ZERO, "all zeros where the reference is not")
    if cand.numel() > 1:
        flat_c, flat_r = c.reshape(-1), r.reshape(-1)
        if bool((flat_c == flat_c[0]).all()) and not bool((flat_r == flat_r[0]).all()):
            return OutputCheck(name, False, Reason.CONSTANT, f"every element equals {flat_c[0].item()!r}; the reference varies")
    return None


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
        check = _structure(name, cand, ref)
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
        if a.is_floating_point():
            same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        else:
            same = a == b
        if not bool(same.all()):
            checks.append(OutputCheck(name, False, Reason.INPUT_MUTATED, f"{int((~same).sum())} elements changed; it is not in META.mutates"))
        else:
            checks.append(OutputCheck(name, True))
    return Comparison.of(checks)
