"""Problems 10 and 13 (whole-layer SOL-ExecBench recipes) compute what their docstrings state.

10's explicit backward is checked against autograd through an independently written forward (float64, smoke
size); 13's gathered rotary tables against angles computed from the grid positions directly, and its
is_joint_block flag against the text stream's influence.
"""

from __future__ import annotations

import torch

from mkb.problems import get_problem


def _f64(inputs):
    return [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]


def test_problem_10_backward_equals_autograd_of_the_stated_forward():
    p = get_problem(10)
    inputs = _f64(p.make_inputs(5, device="cpu", size="smoke"))
    got = p.reference(*inputs)
    do, x, cos, sin, wq, wk, wv, wo, nq, nk, scaling, cap, eps = inputs
    leaves = [t.clone().requires_grad_() for t in (x, wq, wk, wv, wo, nq, nk)]
    X, WQ, WK, WV, WO, NQ, NK = leaves
    b, s, _ = X.shape
    d = nq.shape[0]
    hq, hk = WQ.shape[0] // d, WK.shape[0] // d

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)

    def rope(t):
        h = d // 2
        return t * cos[:, :, None] + torch.cat([-t[..., h:], t[..., :h]], -1) * sin[:, :, None]

    q = rope(rms((X @ WQ.T).view(b, s, hq, d), NQ))
    k = rope(rms((X @ WK.T).view(b, s, hk, d), NK)).repeat_interleave(hq // hk, dim=2)
    v = (X @ WV.T).view(b, s, hk, d).repeat_interleave(hq // hk, dim=2)
    t = cap * torch.tanh(torch.einsum("bihd,bjhd->bhij", q, k) * scaling / cap)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    a = torch.einsum("bhij,bjhd->bihd", torch.softmax(t.masked_fill(~causal, float("-inf")), -1), v)
    out = a.reshape(b, s, hq * d) @ WO.T
    want = torch.autograd.grad(out, leaves, do)
    assert len(got) == len(want) == len(p.meta.outputs) == 7
    for o, g, w in zip(p.meta.outputs, got, want):
        assert g.shape == w.shape, o.name
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-12), f"{o.name}: max diff {(g - w).abs().max():.3g}"


def test_problem_10_cos_sin_are_the_positions_rotary_tables():
    p = get_problem(10)
    _, _, cos, sin, *_ = p.make_inputs(0, device="cpu", size="smoke")
    d = cos.shape[-1]
    inv = 1e6 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(cos.shape[1], dtype=torch.float64)[:, None] * inv
    ang = torch.cat([ang, ang], -1)
    assert torch.allclose(cos[1].double(), torch.cos(ang), atol=1e-6)
    assert torch.allclose(sin[0].double(), torch.sin(ang), atol=1e-6)


def test_problem_13_rotary_angles_follow_the_raster_grid():
    p = get_problem(13)
    m = p.module
    inputs = p.make_inputs(0, device="cpu", size="smoke")
    names = p.meta.inputs
    val = dict(zip(names, inputs))
    _, grid, _, _, _, axes = m._SIZES["smoke"]
    token = torch.arange(grid[0] * grid[1] * grid[2])
    pos = (token // (grid[1] * grid[2]), (token // grid[2]) % grid[1], token % grid[2])
    for axis, (d, pp) in enumerate(zip(axes, pos)):
        assert torch.equal(val[f"pos_idx_axis{axis}"], pp)
        inv = 1e4 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = pp.double()[:, None] * inv
        assert torch.allclose(val[f"cos_axis{axis}"][pp].double(), torch.cos(ang), atol=1e-6)
        assert torch.allclose(val[f"sin_axis{axis}"][pp].double(), torch.sin(ang), atol=1e-6)


def test_problem_13_text_keys_matter_only_in_a_joint_block():
    p = get_problem(13)
    names = p.meta.inputs
    a = list(_f64(p.make_inputs(0, device="cpu", size="smoke")))
    k = names.index("encoder_hidden_states")
    b = list(a)
    b[k] = a[k] + 1.0
    assert not torch.allclose(p.reference(*a), p.reference(*b))
    a[-1] = b[-1] = 0  # is_joint_block = 0: image tokens attend to themselves only
    assert torch.equal(p.reference(*a), p.reference(*b))
