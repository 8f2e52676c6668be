"""The comparison rules, each shown to accept a correct output and reject the wrong ones."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from mkb.reasons import Reason
from mkb.measure import compare, expect, inputs_unchanged
from mkb.problems import Output, ProblemMeta


def _module(reference, *, inputs, outputs, mutates=(), **fns):
    m = types.ModuleType("fake_problem")
    m.META = ProblemMeta(number=99, name="fake", family="mlp_norm", dtypes=("bf16",), source_model="x",
                         source_config="x", inputs=inputs, outputs=outputs, flops=1.0, bytes=1.0, peak="memory",
                         mutates=mutates)
    m.reference = reference
    for k, v in fns.items():
        setattr(m, k, v)
    return m


def _softmax_problem(dtype=torch.bfloat16):
    def reference(x):
        ct = torch.promote_types(x.dtype, torch.float32)
        return torch.softmax(x.to(ct) * 3.0, dim=-1).to(x.dtype)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g).to(dtype)
    return _module(reference, inputs=("x",), outputs=(Output("y"),)), (x,)


def test_reference_itself_passes_within_fp64_anchored_tolerance():
    m, inputs = _softmax_problem()
    exp = expect(m, inputs)
    res = compare(exp, m.reference(*inputs))
    assert res.ok, res.message
    assert exp.tolerance[0] >= 3 * exp.ref_error[0] > 0


def test_tolerance_is_at_least_three_eps_of_the_anchor_scale():
    def reference(x):
        return (x.to(torch.promote_types(x.dtype, torch.float32)) * 2).to(x.dtype)  # exact in any dtype

    x = torch.randn(32, 32).to(torch.bfloat16)
    exp = expect(_module(reference, inputs=("x",), outputs=(Output("y"),)), (x,))
    assert exp.ref_error[0] == 0
    assert exp.tolerance[0] == pytest.approx(3 * torch.finfo(torch.bfloat16).eps * float((x.double() * 2).abs().max()))


def test_an_error_just_beyond_tolerance_fails_and_just_within_passes():
    m, inputs = _softmax_problem(torch.float32)
    exp = expect(m, inputs)
    anchor, tol = exp.anchor[0], exp.tolerance[0]
    ok = (anchor + 0.9 * tol).to(torch.float32)
    bad = anchor.clone()
    bad[3, 7] += 1.5 * tol
    assert compare(exp, ok).ok
    res = compare(exp, bad.to(torch.float32))
    assert not res.ok and res.reason == Reason.WRONG_OUTPUT and "tolerance" in res.message


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda r: torch.zeros_like(r), Reason.ALL_ZERO),
        (lambda r: torch.full_like(r, 0.5), Reason.CONSTANT),
        (lambda r: r.clone().index_fill_(0, torch.tensor([2]), float("nan")), Reason.NAN),
        (lambda r: r.clone().index_fill_(1, torch.tensor([0]), float("inf")), Reason.NAN),
        (lambda r: r[:, :-1].clone(), Reason.WRONG_SHAPE),
        (lambda r: r.to(torch.float32), Reason.WRONG_SHAPE),
        (lambda r: r.clone().unsqueeze(0), Reason.WRONG_SHAPE),
        (lambda r: r.numpy().tolist() if r.dtype == torch.float32 else r.float().numpy(), Reason.WRONG_TYPE),
    ],
)
def test_degenerate_and_malformed_outputs_are_rejected_with_their_reason(make, reason):
    m, inputs = _softmax_problem()
    exp = expect(m, inputs)
    res = compare(exp, make(m.reference(*inputs)))
    assert not res.ok
    assert res.reason == reason


def test_a_tensor_subclass_is_rejected_as_wrong_type():
    class Lazy(torch.Tensor):
        pass

    m, inputs = _softmax_problem()
    exp = expect(m, inputs)
    res = compare(exp, m.reference(*inputs).as_subclass(Lazy))
    assert res.reason == Reason.WRONG_TYPE


def test_wrong_number_of_outputs_is_a_shape_error():
    m, inputs = _softmax_problem()
    exp = expect(m, inputs)
    r = m.reference(*inputs)
    assert compare(exp, (r, r)).reason == Reason.WRONG_SHAPE


def test_exact_mode_demands_equality_for_integer_outputs():
    def reference(x):
        return torch.argsort(x, dim=-1)

    x = torch.randn(8, 16)
    m = _module(reference, inputs=("x",), outputs=(Output("idx", compare="exact"),))
    exp = expect(m, (x,))
    good = reference(x)
    assert compare(exp, good).ok
    bad = good.clone()
    bad[0, [0, 1]] = bad[0, [1, 0]]
    res = compare(exp, bad)
    assert not res.ok and res.reason == Reason.WRONG_OUTPUT and "exact" in res.message


def test_integer_output_declared_allclose_is_still_compared_exactly():
    m = _module(lambda x: (x * 2).to(torch.int64), inputs=("x",), outputs=(Output("y"),))
    x = torch.arange(10)
    exp = expect(m, (x,))
    assert exp.modes == ("exact",)
    assert not compare(exp, x * 2 + torch.eye(1, 10, dtype=torch.int64)[0]).ok


def _topk_problem():
    def scores(x):
        return x.to(torch.promote_types(x.dtype, torch.float32)) * 2.0

    def reference(x):
        return torch.topk(scores(x), k=4, dim=-1).indices

    x = torch.randn(6, 32, dtype=torch.float32)
    x[0, 5] = x[0, 9] = 10.0  # an exact tie at the top
    x[1, 3] = 9.0
    x[1, 4] = 9.0 + 1e-7  # a near tie (within tolerance) at rank 1/2
    m = _module(reference, inputs=("x",), outputs=(Output("idx", compare="topk", topk_scores="scores"),), scores=scores)
    return m, x


def test_topk_accepts_any_order_and_swaps_of_tied_scores():
    m, x = _topk_problem()
    exp = expect(m, (x,))
    ref = m.reference(x)
    assert compare(exp, ref.flip(-1)).ok  # order within a set is free
    # a swap of an index inside the set for one outside with a (near-)equal score
    s = m.scores(x)
    vals, order = s.sort(dim=-1, descending=True)
    cand = order[:, :4].clone()
    cand[0] = order[0, [1, 0, 2, 3]]
    assert compare(exp, cand).ok


def test_topk_rejects_a_genuinely_different_selection_duplicates_and_out_of_range():
    m, x = _topk_problem()
    exp = expect(m, (x,))
    ref = m.reference(x)
    s = m.scores(x)
    order = s.sort(dim=-1, descending=True).indices
    swapped = ref.clone()
    swapped[2, 0] = order[2, 10]  # rank-10 element instead of a top-4 one
    assert compare(exp, swapped).reason == Reason.WRONG_OUTPUT
    dup = ref.clone()
    dup[3, 1] = dup[3, 0]
    assert "twice" in compare(exp, dup).message
    oob = ref.clone()
    oob[4, 0] = 32
    assert "outside" in compare(exp, oob).message


def _quant_problem():
    def reference(x):
        ct = torch.promote_types(x.dtype, torch.float32)
        scale = x.to(ct).abs().amax(dim=-1, keepdim=True) / 127.0
        q = torch.round(x.to(ct) / scale).clamp(-127, 127).to(torch.int8)
        return q, scale.to(torch.float32)

    def dequant(outs):
        q, scale = outs
        return q.to(torch.float64) * scale.to(torch.float64), scale.to(torch.float64).expand(q.shape)

    x = torch.randn(64, 128)
    m = _module(reference, inputs=("x",), outputs=(Output("q", compare="quantized", dequantize="dequant"), Output("scale")),
                dequant=dequant)
    return m, x


def test_quantized_allows_one_quantum_off_on_at_most_a_tenth_of_a_percent():
    m, x = _quant_problem()
    exp = expect(m, (x,))
    q, s = m.reference(x)
    assert compare(exp, (q, s)).ok
    room = (q.view(-1) < 120).nonzero().view(-1)  # elements that can take +2 without int8 overflow
    few = q.clone()
    few.view(-1)[room[:8]] += 1  # 8 of 8192 = 0.098%
    assert compare(exp, (few, s)).ok
    many = q.clone()
    many.view(-1)[room[:9]] += 1  # 0.11%
    res = compare(exp, (many, s))
    assert not res.ok and "at most 8" in res.message
    far = q.clone()
    far.view(-1)[room[0]] += 2
    assert "more than one quantum" in compare(exp, (far, s)).message


def _mutating_problem():
    def reference(cache, pos, new):
        cache[pos] = new.to(cache.dtype)
        return (cache.to(torch.promote_types(cache.dtype, torch.float32)).sum(0)).to(cache.dtype)

    cache = torch.randn(16, 8)
    new = torch.randn(8)
    m = _module(reference, inputs=("cache", "pos", "new"), outputs=(Output("total"),), mutates=("cache",))
    return m, (cache, 5, new)


def test_mutated_inputs_are_compared_and_the_inputs_passed_to_expect_stay_untouched():
    m, inputs = _mutating_problem()
    before = inputs[0].clone()
    exp = expect(m, inputs)
    assert torch.equal(inputs[0], before)
    assert exp.names == ("total", "input cache") and exp.mutated == ("cache",)
    cand_inputs = (inputs[0].clone(), 5, inputs[2].clone())
    out = m.reference(*cand_inputs)
    assert compare(exp, out, inputs_after=cand_inputs, input_names=m.META.inputs).ok
    forgot = (inputs[0].clone(), 5, inputs[2].clone())
    out2 = m.reference(*(forgot[0].clone(), 5, forgot[2]))  # right sum, cache left unchanged
    res = compare(exp, out2, inputs_after=forgot, input_names=m.META.inputs)
    assert not res.ok and res.checks[1].name == "input cache"


def test_a_changed_input_outside_mutates_is_reported_as_input_mutated():
    x = torch.randn(4, 4)
    after = x.clone()
    after[0, 0] += 1
    res = inputs_unchanged((x, torch.ones(2)), (after, torch.ones(2)), names=("x", "w"))
    assert res.reason == Reason.INPUT_MUTATED and res.message.startswith("x:")
    assert inputs_unchanged((x,), (after,), names=("x",), mutates=("x",)).ok


def test_fp64_gap_is_reported_relative_to_the_anchor_scale():
    m, inputs = _softmax_problem()
    gap = expect(m, inputs).fp64_gap()
    assert 0 < gap["y"] < 0.01



def _rounding_topk_problem(*, masked_from=None):
    """Top-4 of exp-scores, which float32 rounds (unlike the x * 2 scores above); optionally -inf padded."""
    def scores(x):
        s = torch.exp(x.to(torch.promote_types(x.dtype, torch.float32)) * 1.3)
        if masked_from is not None:  # padded positions, never selected
            s = s.masked_fill(torch.arange(s.shape[-1]) >= masked_from, float("-inf"))
        return s

    def reference(x):
        return torch.topk(scores(x), k=4, dim=-1).indices

    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(3))
    m = _module(reference, inputs=("x",), outputs=(Output("idx", compare="topk", topk_scores="scores"),), scores=scores)
    return m, x


def test_topk_gap_is_the_scores_gap_measured_with_the_same_error_as_the_swap_tolerance():
    m, x = _rounding_topk_problem()
    exp = expect(m, (x,))
    s, s64 = m.scores(x), m.scores(x.double())
    err = float((s.double() - s64).abs().max())
    gap = exp.fp64_gap()["idx"]
    assert gap > 0  # float32 scores lose something against float64: the indices' gap is measured, not None
    assert gap == pytest.approx(err / float(s64.abs().max()))
    _, _, stol = exp.topk["idx"]
    assert stol == exp.tolerance[0] == pytest.approx(3 * max(err, torch.finfo(torch.float32).eps * float(s64.abs().max())))
    assert exp.ref_error[0] == pytest.approx(err)
    assert compare(exp, m.reference(x)).ok


def test_topk_gap_ignores_masked_minus_inf_scores():
    m, x = _rounding_topk_problem(masked_from=24)
    exp = expect(m, (x,))
    s, s64 = m.scores(x), m.scores(x.double())
    fin = torch.isfinite(s64)
    want = float((s.double()[fin] - s64[fin]).abs().max()) / float(s64[fin].abs().max())
    assert want > 0 and exp.fp64_gap()["idx"] == pytest.approx(want)
    assert compare(exp, m.reference(x)).ok


def test_topk_gap_is_zero_when_the_scores_are_exact_in_their_dtype():
    m, x = _topk_problem()  # scores x * 2: exact in float32
    assert expect(m, (x,)).fp64_gap() == {"idx": 0.0}


def test_topk_gap_is_measured_even_without_the_float_anchor():
    m, x = _rounding_topk_problem()
    assert expect(m, (x,), anchor=False).fp64_gap()["idx"] > 0


def test_quantized_gap_is_that_of_the_values_before_quantisation_when_the_problem_names_them():
    m, x = _quant_problem()
    assert "q" not in expect(m, (x,)).fp64_gap()  # codes alone: nothing to measure
    m.pre = lambda x: torch.tanh(x.to(torch.promote_types(x.dtype, torch.float32)) * 1.7)
    m.META = dataclasses.replace(m.META, outputs=(
        dataclasses.replace(m.META.outputs[0], quantized_from="pre"), m.META.outputs[1]))
    exp = expect(m, (x,))
    v, v64 = m.pre(x), m.pre(x.double())
    want = float((v.double() - v64).abs().max()) / float(v64.abs().max())
    assert want > 0 and exp.fp64_gap()["q"] == pytest.approx(want)
    assert exp.tolerance[0] is None  # the quantized rule keeps its own one-quantum tolerance
    q, s = m.reference(x)
    assert compare(exp, (q, s)).ok


def test_a_quantized_cache_updated_in_place_must_equal_the_returned_cache_bitwise():
    """An fp8 cache that is an output (compared `quantized`) and an input updated in place: the in-place copy
    must not be held only to a loose float tolerance: it must be the candidate's own checked output."""
    fp8 = torch.float8_e4m3fn

    def reference(x, slots, k_cache, k_scale):
        ct = torch.promote_types(x.dtype, torch.float32)
        s = x.to(ct).abs().amax(dim=-1).clamp_min(1e-6) / 448.0
        codes = (x.to(ct) / s[:, None]).clamp(-448, 448).to(fp8)
        if k_cache.dtype == fp8:
            k_cache.view(torch.uint8)[slots] = codes.view(torch.uint8)
        else:  # the fp64 anchor run
            k_cache[slots] = codes.to(k_cache.dtype)
        k_scale[slots] = s.to(k_scale.dtype)
        return k_cache, k_scale

    def dequant(outs):
        c, sc = outs[0].to(torch.float64), outs[1].to(torch.float64)[:, None]
        quantum = torch.exp2(torch.floor(torch.log2(c.abs().clamp_min(2.0**-6))) - 3)
        return c * sc, quantum * sc

    m = _module(reference, inputs=("x", "slots", "k_cache", "k_scale"),
                outputs=(Output("k_cache", compare="quantized", dequantize="dequant"), Output("k_scale")),
                mutates=("k_cache", "k_scale"), dequant=dequant)
    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(24, 32, generator=g).to(torch.bfloat16), torch.randperm(40, generator=g)[:24],
              (torch.randn(40, 32, generator=g) * 64).to(fp8), torch.rand(40, generator=g) + 0.5)
    exp = expect(m, inputs)
    names = list(m.META.inputs)
    good_inputs = [t.clone() for t in inputs]
    outs = m.reference(*good_inputs)
    assert compare(exp, outs, inputs_after=good_inputs, input_names=names).ok
    k = names.index("k_cache")
    bad_inputs = list(good_inputs)
    bad = good_inputs[k].clone()
    flat = bad.view(-1).view(torch.uint8)
    nz = flat.nonzero()[:8, 0]
    flat[nz] = flat[nz] ^ 1  # one quantum off in a few codes of the in-place copy only
    bad_inputs[k] = bad
    verdict = compare(exp, outs, inputs_after=bad_inputs, input_names=names)
    assert not verdict.ok and verdict.reason == "wrong_output"
    assert "input k_cache" in verdict.message
