"""Shared problem helpers: routing.topk_margins (44's redraw rule) and linear.l2normalize (fla's F.normalize)."""

from __future__ import annotations

import torch

from mkb.problems.linear import l2normalize
from mkb.problems.routing import select_topk, topk_margins


def test_topk_margins_measure_the_gaps_the_selection_depends_on():
    # 2 groups of 3 experts; group score = sum of its top 2; keep 1 group; pick 2 experts
    s = torch.tensor([[5.0, 4.0, 0.0, 3.0, 2.5, 2.0]], dtype=torch.float64)
    group_gap, expert_gap = topk_margins(s, 2, n_group=2, topk_group=1)
    assert group_gap.tolist() == [9.0 - 5.5]
    assert expert_gap.tolist() == [4.0 - 0.0]  # the 3rd expert of the kept group; the other group is masked
    assert select_topk(s, 2, n_group=2, topk_group=1).tolist() == [[0, 1]]


def test_topk_margins_without_groups_report_an_infinite_group_gap():
    s = torch.tensor([[1.0, 3.0, 2.0, 2.0 - 1e-6]], dtype=torch.float64)
    group_gap, expert_gap = topk_margins(s, 2)
    assert torch.isinf(group_gap).all()
    assert abs(float(expert_gap[0]) - 1e-6) < 1e-12  # a near tie at the 2nd/3rd place is what 44 redraws


def test_l2normalize_is_torchs_f_normalize():
    x = torch.randn(5, 3, 16, dtype=torch.float64)
    x[0, 0] = 0.0  # the zero row stays zero (clamped norm), as F.normalize
    assert torch.allclose(l2normalize(x), torch.nn.functional.normalize(x, p=2, dim=-1), atol=0, rtol=1e-15)
    assert l2normalize(x)[0, 0].abs().max() == 0


def test_problem_44_draws_routing_with_upstreams_margin_and_captured_bias():
    from mkb.problems import get_problem

    m = get_problem(44).module
    for seed in (0, 5):
        logits, bias = m.make_inputs(seed, device="cpu", size="smoke")[:2]
        c = torch.sigmoid(logits.double()) + bias.double()
        group_gap, expert_gap = topk_margins(c, m.TOP_K, n_group=m.N_GROUP, topk_group=m.TOPK_GROUP)
        assert float(group_gap.min()) >= m.DECISION_MARGIN and float(expert_gap.min()) >= m.DECISION_MARGIN
        assert torch.equal(logits, logits.to(torch.bfloat16).float())  # on the bf16 grid, as the captured gate emits
        high = (bias.float() == m.BIAS_HIGH).sum().item()
        assert high == len(m.BIAS_HIGH_EXPERTS) and ((bias.float() == m.BIAS_BASE).sum().item() == 256 - high)
