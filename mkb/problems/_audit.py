"""The problem audit: at smoke size on the CPU, checks that a problem cannot be passed by a trivial output.

DESIGN (Problem contract, Audit): all-zeros, a constant and a copy of an input must fail the
comparison; outputs must change with every input and with the seed (inputs declared fixed must not
change, structure inputs must change where the problem claims upstream's per-draw structure; an input declared in
META.insensitive_inputs is exempt at full size, with its reason, and still checked at smoke size); the fp64 gap (for top-k
indices, that of their scores) must be > 0 unless the problem says why it is exact, and then it
must be 0; the smoke reference runs in <= 0.1 s on the CPU; `eager` agrees with `reference`.
A problem that fails gets better inputs, never a looser check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from mkb.measure import as_tuple, clone_inputs, compare, expect, inputs_unchanged
from mkb.problems._loader import Problem

SMOKE_LIMIT_S = 0.1
# a second seed's input set up to this size is kept for the per-input swaps; a larger one (full size) is made
# again for each input swapped, so that only the swapped tensor of it is alive beside the first set
KEEP_SECOND_SET_BYTES = 2**28


def _nbytes(values: Sequence[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@dataclass(frozen=True)
class AuditCheck:
    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class AuditReport:
    problem: int
    slug: str
    checks: tuple[AuditCheck, ...]
    reference_s: float  # fastest of a few smoke reference runs on the CPU
    fp64_gap: float | None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> str:
        return "\n".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() and a.element_size() == 1:
            a, b = a.float(), b.float()
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b)) if a.is_floating_point() else (a == b)).all())
    return type(a) is type(b) and a == b


def _run(problem: Problem, fn, inputs: Sequence[Any], *, copy_all: bool = True):
    """Call fn on copies of inputs; returns (outputs, the copies after the call).

    copy_all=False copies only the inputs META.mutates declares (the rest are passed as they are): for calls after
    the reference has been seen to change no other input (`reference_mutates_only_declared_inputs`), where a copy of
    a full-size set (12 GB for 50's expert weights) would only add to the peak.
    """
    if copy_all:
        args = clone_inputs(inputs)
    else:
        mut = set(problem.meta.mutates)
        args = tuple(v.detach().clone() if isinstance(v, torch.Tensor) and n in mut else v
                     for n, v in zip(problem.meta.inputs, inputs))
    return fn(*args), args


def _differs(problem: Problem, exp, fn, inputs, *, copy_all: bool = True) -> tuple[bool, str]:
    """Whether fn(inputs) fails the comparison against `exp` (i.e. is distinguishable from it)."""
    out, after = _run(problem, fn, inputs, copy_all=copy_all)
    res = compare(exp, out, inputs_after=after, input_names=problem.meta.inputs)
    del out
    return (not res.ok), res.message


def _degenerate_candidates(ref: torch.Tensor, inputs: Sequence[Any], names: Sequence[str]):
    yield "all zeros", torch.zeros_like(ref)
    if ref.is_floating_point():
        finite = ref[torch.isfinite(ref)] if ref.element_size() > 1 else ref.float()
        mean = finite.float().mean() if finite.numel() else torch.tensor(1.0)
        yield "a constant (the mean)", torch.full_like(ref, float(mean) if float(mean) != 0 else 1.0)
    else:
        yield "a constant (1)", torch.ones_like(ref)
    for name, v in zip(names, inputs):
        if isinstance(v, torch.Tensor) and v.numel() == ref.numel():
            try:
                yield f"a copy of input {name}", v.reshape(ref.shape).to(ref.dtype).clone()
            except (RuntimeError, TypeError):
                continue


def audit_problem(problem: Problem, *, seeds: tuple[int, int] = (0, 1), smoke_limit_s: float = SMOKE_LIMIT_S,
                  size: str = "smoke", device: str = "cpu") -> AuditReport:
    """Run every audit check on `problem` (smoke size on the CPU by default); never raises for a problem's fault.

    At size="full" (on the GPU host) the same checks run on full-size inputs, except the smoke-speed one:
    DESIGN asks every problem to pass the audit at both sizes.
    """
    checks: list[AuditCheck] = []
    try:
        return _audit(problem, seeds, smoke_limit_s, checks, size=size, device=device)
    except Exception as exc:  # a check that crashes is a failed check, reported with what was found so far
        checks.append(AuditCheck("audit_crashed", False, f"{type(exc).__name__}: {exc}"))
        return AuditReport(problem.number, problem.slug, tuple(checks), float("nan"), None)


def _audit(problem: Problem, seeds, smoke_limit_s, checks: list[AuditCheck], *, size: str, device: str) -> AuditReport:
    m = problem.meta
    add = lambda name, ok, detail="": checks.append(AuditCheck(name, bool(ok), detail))  # noqa: E731
    ref_s, gap = float("nan"), None
    try:
        a = problem.make_inputs(seeds[0], device=device, size=size)
        a2 = problem.make_inputs(seeds[0], device=device, size=size)
        b = problem.make_inputs(seeds[1], device=device, size=size)
    except Exception as exc:
        add("make_inputs", False, f"{type(exc).__name__}: {exc}")
        return AuditReport(m.number, problem.slug, tuple(checks), ref_s, gap)
    add("make_inputs_count", len(a) == len(m.inputs), f"{len(a)} values for {len(m.inputs)} names in META.inputs")
    add("make_inputs_deterministic", all(_same(x, y) for x, y in zip(a, a2)), "the same seed gave different inputs")
    # Full-size input sets reach 12 GB (fp32 expert weights; 24 GB as fp64 anchor inputs), so at most the sets a
    # step needs are alive: the second seed's set is dropped while the expectation and the reference run and made
    # again (make_inputs is deterministic, checked above) for the checks that swap its inputs in.
    del a2
    shapes_a = [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in a]
    shapes_b = [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in b]
    add("shapes_depend_only_on_size", shapes_a == shapes_b, "shapes, dtypes or scalars differ between seeds")
    # structure (page assignments, sequence cuts, padding) is redrawn with the seed where the problem says it
    # follows upstream in this: a structure fixed per size would let a kernel specialise on one layout
    if m.upstream is not None and "structure_per_draw" in m.upstream.matches:
        for name in m.structure_inputs:
            k = m.inputs.index(name)
            add(f"structure_redrawn[{name}]", not _same(a[k], b[k]),
                "META.upstream says structure is drawn per seed, but this structure input is the same for two seeds; "
                "hint: draw it from the seed, or move an input that is the same for every seed by specification "
                "to META.fixed_inputs")
    del b
    try:
        exp = expect(problem.module, a)
        ref_out, ref_after = _run(problem, problem.reference, a)
        ref_out = as_tuple(ref_out)
    except Exception as exc:
        add("reference", False, f"{type(exc).__name__}: {exc}")
        return AuditReport(m.number, problem.slug, tuple(checks), ref_s, gap)
    # the reference passes its own comparison, and changes no input outside META.mutates
    res = compare(exp, ref_out, inputs_after=ref_after, input_names=m.inputs)
    add("reference_self_consistent", res.ok, res.message)
    res = inputs_unchanged(a, ref_after, names=m.inputs, mutates=m.mutates)
    add("reference_mutates_only_declared_inputs", res.ok, res.message)
    lean = res.ok  # later calls copy only the declared in-place inputs (a reference seen to change no other)
    if lean:  # the copies it left unchanged are bitwise the first set: keep one of the two alive, not both
        ref_after = tuple(v if n in m.mutates else x for n, v, x in zip(m.inputs, ref_after, a))
    for name, v in zip(m.mutates, exp.reference[exp.n_outputs:]):
        k = m.inputs.index(name)
        add(f"mutates_changes[{name}]", not _same(v, a[k]), "the reference leaves this declared input unchanged")
    # degenerate outputs fail
    for k, o in enumerate(m.outputs):
        ref = ref_out[k]
        if not isinstance(ref, torch.Tensor):
            continue
        flat = ref.reshape(-1).float() if ref.is_floating_point() or ref.dtype == torch.bool else ref.reshape(-1)
        nonzero = bool(flat.ne(0).any()) if flat.numel() else False
        constant = flat.numel() > 1 and bool((flat == flat[0]).all())
        add(f"reference_nontrivial[{o.name}]", nonzero and not constant, "the reference output itself is all zero or constant")
        for what, cand in _degenerate_candidates(ref, a, m.inputs):
            outs = list(ref_out)
            outs[k] = cand
            r = compare(exp, tuple(outs) if len(outs) > 1 else outs[0], inputs_after=ref_after, input_names=m.inputs)
            add(f"fails_on[{o.name}: {what}]", not r.ok, "the comparison accepted it")
    # a candidate that leaves a mutated input untouched fails
    for name in m.mutates:
        k = m.inputs.index(name)
        after = list(ref_after)
        after[k] = a[k].clone()
        r = compare(exp, tuple(ref_out) if len(ref_out) > 1 else ref_out[0], inputs_after=after, input_names=m.inputs)
        add(f"fails_on[{name} not updated]", not r.ok, "the comparison accepted an un-updated input")
    ref_out = ref_after = ref = outs = after = cand = None  # let the reference's outputs and inputs go (see above)
    # outputs change with every input and with the seed. Only the swapped input of the second seed's set is kept
    # (its set is made for each input in turn, deterministic): with the expectation (50: 12 GB of gradients and
    # 24 GB of fp64 anchors), the first set, the reference's outputs and the comparison's fp64 temporaries, a
    # whole second set did not fit an H200 (events/h200-characterisation-3; benchmarks/full_size_memory.py --audit)
    b = problem.make_inputs(seeds[1], device=device, size=size)
    if _nbytes(b) > KEEP_SECOND_SET_BYTES:
        b = None
    for k, name in enumerate(m.inputs):
        if not isinstance(a[k], torch.Tensor):
            continue
        if name in m.structure_inputs:
            continue
        b_k = b[k] if b is not None else problem.make_inputs(seeds[1], device=device, size=size)[k]
        if name in m.fixed_inputs:  # the same for every seed by specification
            add(f"fixed_input_is_fixed[{name}]", _same(a[k], b_k), "a declared fixed input changes with the seed")
            continue
        if _same(a[k], b_k):
            add(f"input_changes_with_seed[{name}]", False,
                "this input is identical for two seeds; draw its values from the seed, or declare it in "
                "META.fixed_inputs (the same for every seed by specification)")
            continue
        x = list(a)
        x[k] = b_k
        try:
            differs, _ = _differs(problem, exp, problem.reference, x, copy_all=not lean)
        except Exception as exc:
            differs = False
            add(f"output_depends_on[{name}]", False, f"reference raised on swapped input: {type(exc).__name__}: {exc}")
            continue
        why = dict(m.insensitive_inputs).get(name)
        if why is not None and size != "smoke" and not differs:
            add(f"output_depends_on[{name}]", True, f"exempt at size={size} (META.insensitive_inputs): {why}")
            continue
        add(f"output_depends_on[{name}]", differs, "redrawing this input leaves every output within tolerance")
    x = b_k = None
    a = None  # the first set is made again for the eager check: only one set is alive at a time
    if b is None:
        b = problem.make_inputs(seeds[1], device=device, size=size)
    differs, _ = _differs(problem, exp, problem.reference, b, copy_all=not lean)
    add("output_depends_on_seed", differs, "two seeds give outputs within tolerance of each other")
    del b
    a = problem.make_inputs(seeds[0], device=device, size=size)
    # fp64 gap
    gaps = exp.fp64_gap()
    gap = max(gaps.values()) if gaps else None
    if m.exact_reason:  # a claim that nothing is rounded: a measured gap > 0 refutes it
        add("fp64_gap", not gap,
            f"exact: {m.exact_reason}" if not gap else
            f"META.exact_reason says the problem is exact, but its fp64 gap is {gap:.3g} ({gaps}); "
            "hint: remove exact_reason, the measured gap is what the audit wants")
    else:
        add("fp64_gap", gap is not None and gap > 0,
            f"fp64 gap is {gap}: the reference's dtype loses nothing, so the tolerance is set by eps alone; "
            "give a reason in META.exact_reason or make the numerics non-trivial")
    if size == "smoke":  # smoke speed (the full size has the eager band, measured by characterisation)
        times = []
        for _ in range(3):
            args = clone_inputs(a)
            t0 = time.perf_counter()
            problem.reference(*args)
            times.append(time.perf_counter() - t0)
        ref_s = min(times)
        add("smoke_reference_fast", ref_s <= smoke_limit_s, f"smoke reference took {ref_s * 1e3:.1f} ms (limit {smoke_limit_s * 1e3:.0f} ms)")
    # eager agrees
    if problem.has_eager:
        try:
            out, after = _run(problem, problem.module.eager, a, copy_all=not lean)
            r = compare(exp, out, inputs_after=after, input_names=m.inputs)
            del out
            add("eager_agrees", r.ok, r.message)
        except Exception as exc:
            add("eager_agrees", False, f"{type(exc).__name__}: {exc}")
    return AuditReport(m.number, problem.slug, tuple(checks), ref_s, gap)


def audit_many(problems: Sequence[Problem], *, size: str = "smoke", device: str = "cpu", budget_s: float | None = None,
               on_report=None) -> list[tuple[Problem, AuditReport | None, float]]:
    """Audit each problem in turn: (problem, report or None when the budget ran out first, seconds taken).

    Full-size input sets are large (several GB for the paged-attention pools), so memory is released
    between problems; `on_report(problem, report, seconds)` sees each result as it comes (progress logs).
    """
    import gc

    t0 = time.perf_counter()
    out: list[tuple[Problem, AuditReport | None, float]] = []
    for p in problems:
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            out.append((p, None, 0.0))
            if on_report:
                on_report(p, None, 0.0)
            continue
        t = time.perf_counter()
        rep = audit_problem(p, size=size, device=device)
        gc.collect()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        dt = time.perf_counter() - t
        out.append((p, rep, dt))
        if on_report:
            on_report(p, rep, dt)
    return out
