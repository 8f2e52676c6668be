"""The vision patch merger of Qwen3-Omni: LayerNorm, 2x2 spatial merge, GELU MLP, bf16 in and out.

The last stage of the Qwen3-Omni vision encoder (the final merger, `use_postshuffle_norm=False`)
turns the encoder's patch tokens into language-model tokens. The patches of all images arrive
packed in one tensor, already ordered so that each run of 4 consecutive patches is one 2x2 block
of a grid (the vision tower's window ordering), so the merge is a plain reshape:

    n   = LayerNorm(x) = (x - mean) * rsqrt(var + 1e-6) * ln_weight + ln_bias   (over hidden 1536,
          biased variance, per patch: the norm is applied before the merge)
    m   = n.view(-1, 4 * 1536)                                                   (32768 -> 8192 rows)
    h   = m @ w1.T + b1                                                          (6144 -> 6144)
    a   = gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2)))                            (nn.GELU(): exact erf)
    y   = a @ w2.T + b2                                                          (6144 -> 3584)

Inputs: x [32768, 1536] (8 image grids of 4096 patches: 8 images of 1024x1024 pixels at patch 16),
ln_weight/ln_bias [1536], w1 [6144, 6144], b1 [6144], w2 [3584, 6144], b2 [3584] (nn.Linear
layout: out_features x in_features), all bf16. Output y [8192, 3584] bf16.

Numerics: the reference computes everything in fp32 (the promotion of bf16 and fp32) with no
intermediate rounding and rounds once to bf16 at the end. The eager baseline is the bf16 module as
served (LayerNorm with fp32 statistics and a bf16 result, bf16 GEMMs with fp32 accumulation, bf16
GELU); it stays within the comparison tolerance.
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

MERGE = 4  # spatial_merge_size 2 -> 2 x 2 patches per merged token
EPS = 1e-6
SHAPES = {"full": (32768, 1536, 3584), "smoke": (64, 64, 96)}  # patches, vision hidden, out hidden

_P, _H, _O = SHAPES["full"]
_M, _K = _P // MERGE, _H * MERGE

META = ProblemMeta(
    number=27,
    name="patch_merger_mlp_qwen3_omni_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="Qwen/Qwen3-Omni-30B-A3B-Instruct (vision encoder merger)",
    source_config=(
        "vision hidden_size=1536 (published problem header), spatial_merge_size=2 (merged 6144), "
        "out_hidden_size=3584, merger ln_q=LayerNorm(eps=1e-6) before the merge, mlp=Linear(6144,6144)+GELU(erf)"
        "+Linear(6144,3584) with biases; 32768 patches in 8 grids (published problem header)"
    ),
    inputs=("x", "ln_weight", "ln_bias", "w1", "b1", "w2", "b2"),
    outputs=(Output("y"),),
    flops=2.0 * _M * _K * _K + 2.0 * _M * _K * _O + 8.0 * _P * _H + 8.0 * _M * _K,
    bytes=2.0 * (_P * _H + 2 * _H + _K * _K + _K + _O * _K + _O + _M * _O),
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/27_patch_merger_mlp_qwen3_omni_bf16.json',
        matches=('outputs', 'in_place', 'shapes', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('computation', "upstream's recipe also takes grid_thw [8, 3] and merges each 2x2 spatial group by the grid layout (a gather that depends on grid_thw) with eps as an input; mkb's merger takes the patches already in merge order (4 consecutive rows per merged token) - not yet converted (issue #15 follow-up)"),
            ('distributions', "upstream: N(0, 1) patches plus a per-token N(0, 0.25) offset, LN weight 1 + 0.1 N, bias 0.1 N, weights N(0, 1)/sqrt(in), biases N(0, 1) (not visible in full); mkb's are close but not the same scales"),
        ),
    ),
    notes="LayerNorm is per patch (pre-shuffle), as in the final merger. Smoke: 64 patches, hidden 64, out 96.",
)


def reference(x, ln_weight, ln_bias, w1, b1, w2, b2):
    ct = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(ct)
    mu = xf.mean(dim=-1, keepdim=True)
    var = (xf - mu).pow(2).mean(dim=-1, keepdim=True)
    n = (xf - mu) * torch.rsqrt(var + EPS) * ln_weight.to(ct) + ln_bias.to(ct)
    m = n.reshape(-1, n.shape[-1] * MERGE)
    h = m @ w1.to(ct).T + b1.to(ct)
    a = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    return (a @ w2.to(ct).T + b2.to(ct)).to(x.dtype)


def eager(x, ln_weight, ln_bias, w1, b1, w2, b2):
    F = torch.nn.functional
    n = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, EPS).reshape(-1, x.shape[-1] * MERGE)
    return F.linear(F.gelu(F.linear(n, w1, b1)), w2, b2)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    p, hd, o = SHAPES[size]
    k = hd * MERGE
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    # encoder output: per-patch offsets and a few large channels, as in a trained ViT's residual stream
    x = torch.randn(p, hd, generator=g, device=device) * 1.5 + 0.5 * torch.randn(p, 1, generator=g, device=device)
    x[:, :: max(1, hd // 16)] *= 4.0
    ln_weight = 1.0 + 0.2 * torch.randn(hd, generator=g, device=device)
    ln_bias = 0.1 * torch.randn(hd, generator=g, device=device)
    w1 = torch.randn(k, k, generator=g, device=device) / math.sqrt(k)
    b1 = 0.1 * torch.randn(k, generator=g, device=device)
    w2 = torch.randn(o, k, generator=g, device=device) / math.sqrt(k)
    b2 = 0.1 * torch.randn(o, generator=g, device=device)
    return tuple(v.to(torch.bfloat16) for v in (x, ln_weight, ln_bias, w1, b1, w2, b2))
