"""The comparison's quick pass (grader 2.22) gives the full rules' verdict on every output: a pass only where they
pass, with the same figures, and every failure left to them (same reason, same message)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import mkb.measure._compare as C
from mkb.measure import compare, expect, inputs_unchanged
from mkb.problems import Output
from mkb.reasons import Reason
from test_compare import _module  # the one fake problem of the comparison tests


def _full_rules(monkeypatch_ctx, exp, out, **kw):
    """The verdict with the quick pass switched off (the rules as before grader 2.22)."""
    with monkeypatch_ctx.context() as mp:
        mp.setattr(C, "_quick_pass", lambda *a, **k: None)
        return compare(exp, out, **kw)


def _same_verdict(a, b) -> None:
    assert (a.ok, a.reason, a.message) == (b.ok, b.reason, b.message)
    for x, y in zip(a.checks, b.checks, strict=True):
        assert dataclasses.astuple(x) == dataclasses.astuple(y)


def _softmax(dtype):
    def reference(x):
        return torch.softmax(x.to(torch.float32) * 3.0, dim=-1).to(x.dtype)
    return reference


def _outputs_of(ref: torch.Tensor, tol: float, device: str):
    """Right and wrong outputs around `ref` (each a new tensor): every branch of the full rules, and the edges."""
    g = torch.Generator(device="cpu").manual_seed(1)
    noise = lambda scale: (torch.rand(ref.shape, generator=g) - 0.5).to(device) * 2 * scale  # noqa: E731
    r64 = ref.to(torch.float64)
    yield "itself", ref.clone()
    yield "within", (r64 + noise(0.2 * tol)).to(ref.dtype)
    yield "beyond", (r64 + noise(50 * tol)).to(ref.dtype)
    one_off = ref.clone().reshape(-1)
    one_off[7] += 1.0
    yield "one element off", one_off.reshape(ref.shape)
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = ref.clone().reshape(-1)
        t[-1] = bad
        yield f"one {bad}", t.reshape(ref.shape)
    yield "all nan", torch.full_like(ref, float("nan"))
    yield "zeros", torch.zeros_like(ref)
    yield "negative zeros", torch.full_like(ref, -0.0)
    yield "constant", torch.full_like(ref, 0.5)
    yield "constant at the mean", torch.full_like(ref, float(r64.mean()))
    yield "shape", ref[..., :-1].clone()
    yield "dtype", ref.to(torch.float32) if ref.dtype != torch.float32 else ref.to(torch.float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_output_gets_the_full_rules_verdict_allclose(dtype, monkeypatch):
    m = _module(_softmax(dtype), inputs=("x",), outputs=(Output("y"),))
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    exp = expect(m, (x,))
    assert exp.facts[0] == C.ReferenceFacts(finite=True, all_zero=False, constant=False)
    ref, tol = exp.reference[0], exp.tolerance[0]
    seen = set()
    for what, out in _outputs_of(ref, tol, "cpu"):
        got, want = compare(exp, out), _full_rules(monkeypatch, exp, out)
        _same_verdict(got, want)
        seen.add((what, want.ok, want.reason))
    # the cases reach the full rules' pass and each of their failures
    assert {r for _, ok, r in seen} >= {None, Reason.WRONG_OUTPUT, Reason.NAN, Reason.ALL_ZERO, Reason.CONSTANT,
                                         Reason.WRONG_SHAPE}


@pytest.mark.parametrize("kind", ["zeros", "constant", "nan", "inf", "tiny"])
def test_references_of_every_shape_the_facts_describe(kind, monkeypatch):
    """A reference that is all zero, constant, non-finite somewhere or tiny (a tolerance below one ulp of some
    outputs): the quick pass agrees with the full rules on every output, and stands aside where it cannot vouch."""
    def reference(x):
        if kind == "zeros":
            return torch.zeros_like(x)
        if kind == "constant":
            return torch.full_like(x, 0.25)
        y = x * 1e-30 if kind == "tiny" else x.clone()
        if kind in ("nan", "inf"):
            y.reshape(-1)[3] = float(kind)
        return y

    m = _module(reference, inputs=("x",), outputs=(Output("y"),))
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(2))
    exp = expect(m, (x,))
    facts = exp.facts[0]
    assert facts.finite is (kind not in ("nan", "inf"))
    assert facts.all_zero is (kind == "zeros") and facts.constant is (kind in ("zeros", "constant"))
    for _, out in _outputs_of(exp.reference[0], exp.tolerance[0] or 1e-6, "cpu"):
        _same_verdict(compare(exp, out), _full_rules(monkeypatch, exp, out))


def test_exact_outputs_and_mutated_inputs_get_the_full_rules_verdict(monkeypatch):
    def reference(idx, cache):
        cache[idx] = 7
        return idx.flip(0), cache.sum().reshape(1)

    m = _module(reference, inputs=("idx", "cache"), outputs=(Output("r"), Output("s")), mutates=("cache",))
    idx, cache = torch.arange(10), torch.zeros(20, dtype=torch.int64)
    exp = expect(m, (idx, cache))
    assert exp.facts == (None, None, None)  # integer entries are compared exactly, no facts needed
    right_cache = cache.clone()
    right_cache[idx] = 7
    cases = [
        ((idx.flip(0), right_cache.sum().reshape(1)), right_cache),
        ((idx, right_cache.sum().reshape(1)), right_cache),  # wrong order
        ((torch.zeros(10, dtype=torch.int64), right_cache.sum().reshape(1)), right_cache),
        ((torch.full((10,), 3), right_cache.sum().reshape(1)), right_cache),
        ((idx.flip(0), right_cache.sum().reshape(1)), cache.clone()),  # the in-place update missing
    ]
    for out, after in cases:
        kw = dict(inputs_after=(idx, after), input_names=("idx", "cache"))
        _same_verdict(compare(exp, out, **kw), _full_rules(monkeypatch, exp, out, **kw))


def test_a_passing_output_is_decided_without_the_full_rules(monkeypatch):
    """The point of it: a right output never reaches `_degenerate` or `_allclose` (about ten synced reductions)."""
    m = _module(_softmax(torch.bfloat16), inputs=("x",), outputs=(Output("y"),))
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    exp = expect(m, (x,))

    def boom(*a, **k):
        raise AssertionError("the full rules ran")

    monkeypatch.setattr(C, "_degenerate", boom)
    monkeypatch.setattr(C, "_allclose", boom)
    res = compare(exp, m.reference(x))
    assert res.ok and res.checks[0].max_abs_err is not None and res.checks[0].tolerance == exp.tolerance[0]
    with pytest.raises(AssertionError, match="full rules"):  # and a wrong one does
        compare(exp, torch.zeros_like(m.reference(x)))


def test_an_expectation_without_facts_takes_the_full_rules(monkeypatch):
    """An `Expected` made without facts (an older maker, or a test building one by hand) is still compared."""
    m = _module(_softmax(torch.float32), inputs=("x",), outputs=(Output("y"),))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    exp = dataclasses.replace(expect(m, (x,)), facts=())
    assert compare(exp, m.reference(x)).ok
    assert compare(exp, torch.zeros(4, 8)).reason == Reason.ALL_ZERO


def test_min_and_max_propagate_nan_as_the_quick_pass_relies_on():
    t = torch.tensor([1.0, -3.0, float("nan"), 5.0])
    assert all(torch.isnan(v) for v in torch.aminmax(t))
    t64 = torch.tensor([1.0, 2.0], dtype=torch.bfloat16) - torch.tensor([1.0, float("nan")], dtype=torch.float64)
    assert t64.dtype == torch.float64 and torch.isnan(torch.aminmax(t64).max)


def test_inputs_unchanged_keeps_its_verdicts():
    a = torch.tensor([1.0, float("nan"), -0.0])
    same_nan = inputs_unchanged((a,), (a.clone(),), names=("x",))
    assert same_nan.ok  # NaN where it was: not equal by torch.equal, still unchanged by the rule
    assert inputs_unchanged((a,), (torch.tensor([1.0, float("nan"), 0.0]),), names=("x",)).ok  # -0.0 == 0.0
    changed = inputs_unchanged((a,), (torch.tensor([2.0, float("nan"), 0.0]),), names=("x",))
    assert not changed.ok and changed.reason == Reason.INPUT_MUTATED and "1 elements changed" in changed.message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_the_gpu_every_output_gets_the_full_rules_verdict(dtype, monkeypatch):
    m = _module(_softmax(dtype), inputs=("x",), outputs=(Output("y"),))
    x = torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)).to(dtype).cuda()
    exp = expect(m, (x,))
    assert exp.facts[0].finite
    n = 0
    for _, out in _outputs_of(exp.reference[0], exp.tolerance[0], "cuda"):
        _same_verdict(compare(exp, out), _full_rules(monkeypatch, exp, out))
        n += 1
    assert n >= 14


# Degenerate outputs within tolerance and a reference non-finite where its anchor is not: what the quick pass must leave
# to the full rules (found in review: the file above passed with each of those guards removed from `_quick_pass`).
def test_a_constant_output_within_tolerance_of_a_varying_reference_gets_constant(monkeypatch):
    x = torch.linspace(0.0, 0.01, 64, dtype=torch.float64).reshape(4, 16)
    exp = expect(_module(lambda x: (1.0 + x).to(torch.bfloat16), inputs=("x",), outputs=(Output("y"),)), (x,))
    assert not exp.facts[0].constant
    out = torch.ones(4, 16, dtype=torch.bfloat16)  # within the reference's own bf16 error of it
    full = _full_rules(monkeypatch, exp, out)
    assert full.reason == Reason.CONSTANT
    _same_verdict(compare(exp, out), full)


def test_an_all_zero_output_within_tolerance_of_a_reference_that_is_not_zero_gets_all_zero(monkeypatch):
    # x in [2.1, 2.5]: bf16 (x + 600) - 600 is 4 everywhere, 1.5-1.9 off the fp64 anchor, so the tolerance exceeds |anchor|
    x = torch.linspace(2.1, 2.5, 64, dtype=torch.float64).reshape(4, 16).to(torch.bfloat16)
    exp = expect(_module(lambda x: (x + 600) - 600, inputs=("x",), outputs=(Output("y"),)), (x,))
    assert not exp.facts[0].all_zero and exp.tolerance[0] >= float(exp.anchor[0].abs().max())
    out = torch.zeros(4, 16, dtype=torch.bfloat16)
    full = _full_rules(monkeypatch, exp, out)
    assert full.reason == Reason.ALL_ZERO
    _same_verdict(compare(exp, out), full)


def test_a_reference_non_finite_where_its_anchor_is_finite_leaves_the_verdict_to_the_full_rules(monkeypatch):
    x = (torch.full((4, 16), 300.0, dtype=torch.float64) + torch.arange(64, dtype=torch.float64).reshape(4, 16))
    exp = expect(_module(lambda x: x * x / x, inputs=("x",), outputs=(Output("y"),)), (x.to(torch.float16),))  # fp16 x*x overflows
    assert not exp.facts[0].finite
    out = exp.anchor[0].to(torch.float16)  # the right values, finite
    full = _full_rules(monkeypatch, exp, out)
    assert not full.ok
    _same_verdict(compare(exp, out), full)
