"""Sampled expectations (DESIGN, Problem contract, full-size memory): the same verdicts as the whole comparison on the
whole-output checks, the values judged at secret positions, and the coverage that is given up."""

from __future__ import annotations

import math

import pytest
import torch

from mkb.measure import SAMPLE_POSITIONS, compare, expect, sample
from mkb.problems import Output
from mkb.reasons import Reason

from test_compare import _module, _softmax_problem

K = 256  # positions per sampled output here; the grader keeps 2^24


def _pair(dtype=torch.float32, seed=7):
    m, inputs = _softmax_problem(dtype)  # one 64 x 128 output: 8192 elements > K
    whole = expect(m, inputs)
    return m, inputs, whole, sample(whole, seed=seed, positions=K)


def test_the_default_keeps_2_to_the_24_positions():
    assert SAMPLE_POSITIONS == 2**24
    from mkb.grader import GraderConfig

    assert GraderConfig().sample_positions == SAMPLE_POSITIONS


def test_a_correct_output_passes_and_the_tolerance_is_the_whole_outputs():
    m, inputs, whole, sampled = _pair()
    assert sampled.reference[0] is None and sampled.anchor[0] is None
    s = sampled.sampled[0]
    assert s.k == K and s.shape == (64, 128) and s.reference.shape == (K,) and s.anchor.dtype == torch.float64
    assert sampled.tolerance == whole.tolerance and sampled.fp64_gap() == whole.fp64_gap()
    assert sampled.sampled_positions() == {"y": K}
    res = compare(sampled, m.reference(*inputs))
    assert res.ok, res.message
    assert f"at {K} sampled positions of 8192" in res.checks[0].message
    # the kept values are the whole ones at the positions the seed makes again
    idx = s.positions()
    assert torch.equal(s.anchor, whole.anchor[0].reshape(-1)[idx])
    assert torch.equal(s.reference, whole.reference[0].reshape(-1)[idx])


def test_it_keeps_far_fewer_bytes():
    _, _, whole, sampled = _pair()
    assert whole.nbytes() == 8192 * (4 + 8)
    assert sampled.nbytes() == K * (4 + 8)


def test_an_output_wrong_in_many_elements_fails_with_the_whole_comparisons_reason():
    m, inputs, whole, sampled = _pair()
    bad = m.reference(*inputs).clone()
    bad[:, ::4] += 1.0  # a quarter of the elements
    w, s = compare(whole, bad), compare(sampled, bad)
    assert not w.ok and not s.ok
    assert s.reason == w.reason == Reason.WRONG_OUTPUT
    assert "exceeds tolerance" in s.message and "sampled positions" in s.message


@pytest.mark.parametrize(
    "make",
    [
        lambda r: torch.zeros_like(r),
        lambda r: torch.full_like(r, 0.5),
        lambda r: r.clone().index_fill_(0, torch.tensor([2]), float("nan")),
        lambda r: r.clone().index_fill_(1, torch.tensor([0]), float("inf")),
        lambda r: r.reshape(-1).clone().index_fill_(0, torch.tensor([5000]), float("nan")).reshape(r.shape),
        lambda r: r[:, :-1].clone(),
        lambda r: r.to(torch.float64),
        lambda r: r.clone().unsqueeze(0),
        lambda r: r.numpy(),
        lambda r: r.clone().as_subclass(type("Lazy", (torch.Tensor,), {})),
    ],
    ids=["zeros", "constant", "nan_row", "inf_column", "one_nan", "shape", "dtype", "rank", "numpy", "subclass"],
)
def test_degenerate_and_malformed_outputs_fail_with_the_whole_comparisons_reason(make):
    m, inputs, whole, sampled = _pair()
    out = make(m.reference(*inputs))
    w, s = compare(whole, out), compare(sampled, out)
    assert not s.ok
    assert s.reason == w.reason, (s.message, w.message)


def test_an_output_wrong_only_outside_the_sampled_positions_passes():
    """The stated trade-off: values are judged only at the kept positions (an output wrong in n of N elements escapes
    one check with probability (1 - k/N)^n; 17 fresh sets per grading make that (1 - k/N)^(17 n))."""
    m, inputs, whole, sampled = _pair()
    s = sampled.sampled[0]
    kept = torch.zeros(s.numel, dtype=torch.bool)
    kept[s.positions()] = True
    out = m.reference(*inputs)
    wrong = out.clone().reshape(-1)
    wrong[~kept] += 1.0  # every element the positions miss (thousands), none they hit
    wrong = wrong.reshape(out.shape)
    assert not compare(whole, wrong).ok
    assert compare(sampled, wrong).ok
    once = out.clone().reshape(-1)
    once[int(s.positions()[0])] += 1.0  # one wrong element, at a kept position
    assert compare(sampled, once.reshape(out.shape)).reason == Reason.WRONG_OUTPUT


def test_the_escape_probability_is_the_stated_one():
    m, inputs = _softmax_problem(torch.float32)
    whole = expect(m, inputs)
    out = m.reference(*inputs)
    n_wrong, k, n = 64, 64, out.numel()
    g = torch.Generator().manual_seed(1)
    wrong = out.clone().reshape(-1)
    wrong[torch.randperm(n, generator=g)[:n_wrong]] += 1.0
    wrong = wrong.reshape(out.shape)
    trials = 300
    escaped = sum(compare(sample(whole, seed=s, positions=k), wrong).ok for s in range(trials)) / trials
    expected = (1 - k / n) ** n_wrong  # 0.61
    assert abs(escaped - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_positions_differ_between_expectations_outputs_and_seeds():
    m, inputs, whole, _ = _pair()
    a, b = sample(whole, seed=1, positions=K), sample(whole, seed=2, positions=K)
    assert not torch.equal(a.sampled[0].positions(), b.sampled[0].positions())
    assert torch.equal(a.sampled[0].positions(), sample(whole, seed=1, positions=K).sampled[0].positions())

    def two(x):
        y = x.to(torch.float32) * 2
        return y, y + 1

    m2 = _module(two, inputs=("x",), outputs=(Output("a"), Output("b")))
    e = sample(expect(m2, (torch.randn(64, 64),)), seed=3, positions=K)
    assert not torch.equal(e.sampled[0].positions(), e.sampled[1].positions())


def test_exact_topk_quantized_and_small_outputs_stay_whole():
    def ref(x):
        y = x.to(torch.float32)
        return y * 2, y[:4, :4] * 3, (y > 0).to(torch.int32)

    m = _module(ref, inputs=("x",), outputs=(Output("big"), Output("small"), Output("mask", compare="exact")))
    x = torch.randn(64, 64)
    e = sample(expect(m, (x,)), seed=0, positions=K)
    assert set(e.sampled) == {0}
    assert e.reference[1] is not None and e.reference[2] is not None
    assert compare(e, ref(x)).ok
    bad = list(ref(x))
    bad[2] = 1 - bad[2]
    assert compare(e, tuple(bad)).reason == Reason.WRONG_OUTPUT


def test_a_reference_with_nonfinite_values():
    def ref(x):
        y = x.to(torch.float32)
        return torch.where(y > 1.5, torch.full_like(y, float("inf")), y)

    m = _module(ref, inputs=("x",), outputs=(Output("y"),))
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    whole = expect(m, (x,))
    n_inf = int((x > 1.5).sum())
    for k in (n_inf + 10, n_inf // 4):  # the positions kept, then only their count (more than k of them)
        e = sample(whole, seed=5, positions=k)
        s = e.sampled[0]
        assert s.nonfinite_count == n_inf and (s.nonfinite is None) == (k < n_inf)
        out = ref(x)
        assert compare(e, out).ok
        finite = out.clone()
        finite[x > 1.5] = 0.0  # finite where the reference is Inf
        assert compare(e, finite).reason == compare(whole, finite).reason == Reason.WRONG_OUTPUT
        extra = out.clone()
        extra[x < -1.5] = float("nan")  # NaN where the reference is finite
        assert compare(e, extra).reason == compare(whole, extra).reason == Reason.NAN


def test_sample_rejects_no_positions():
    _, _, whole, _ = _pair()
    with pytest.raises(ValueError, match="positions"):
        sample(whole, seed=0, positions=0)
