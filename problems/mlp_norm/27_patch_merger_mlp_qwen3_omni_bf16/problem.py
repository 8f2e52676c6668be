"""The vision patch merger of Qwen3-Omni: LayerNorm, 2x2 spatial merge by grid, GELU MLP, bf16 in and out.

The last stage of the Qwen3-Omni vision encoder (the final merger, `use_postshuffle_norm=False`)
turns the encoder's patch tokens into language-model tokens. The patches of all images arrive
packed in one tensor, each image's patches in raster order over its (t, h, w) grid (`grid_thw`);
each 2x2 spatial block of a grid becomes one merged token:

    n   = LayerNorm(x) = (x - mean) * rsqrt(var + eps) * ln_weight + ln_bias    (over hidden 1536, biased
          variance, per patch: the norm is applied before the merge)
    m   = for each grid (t, h, w): n[grid].view(t, h/2, 2, w/2, 2, C).permute(0, 1, 3, 2, 4, 5)
          .reshape(-1, 4C), grids concatenated in order                          (32768 -> 8192 rows)
    h   = m @ fc1_weight.T + fc1_bias                                            (6144 -> 6144)
    a   = gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2)))                            (nn.GELU(): exact erf)
    y   = a @ fc2_weight.T + fc2_bias                                            (6144 -> 3584)

Inputs: hidden [32768, 1536] bf16, grid_thw [8, 3] int64 (8 images of 1 x 64 x 64 patches),
ln_weight/ln_bias [1536], fc1_weight [6144, 6144], fc1_bias [6144], fc2_weight [3584, 6144],
fc2_bias [3584] (nn.Linear layout), all bf16; eps (Python constant 1e-6). Output y [8192, 3584] bf16.

Numerics: the reference computes everything in fp32 (the promotion of bf16 and fp32) with no
intermediate rounding and rounds once to bf16 at the end. The eager baseline is the bf16 module as
served (LayerNorm with fp32 statistics and a bf16 result, bf16 GEMMs with fp32 accumulation, bf16
GELU); it stays within the comparison tolerance.
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

MERGE_SIZE = 2  # spatial_merge_size: 2 x 2 patches per merged token
MERGE = MERGE_SIZE * MERGE_SIZE
EPS = 1e-6
# patches, grids, vision hidden, out hidden; every grid is 1 x side x side with side = sqrt(patches / grids)
SHAPES = {"full": (32768, 8, 1536, 3584), "smoke": (64, 4, 64, 96)}

_P, _G, _H, _O = SHAPES["full"]
_M, _K = _P // MERGE, _H * MERGE

META = ProblemMeta(
    number=27,
    name="patch_merger_mlp_qwen3_omni_bf16",
    family="mlp_norm",
    dtypes=("bf16", "int64"),
    source_model="Qwen/Qwen3-Omni-30B-A3B-Instruct (vision encoder merger)",
    source_config=(
        "vision hidden_size=1536, spatial_merge_size=2 (merged 6144), out_hidden_size=3584, merger "
        "ln_q=LayerNorm(eps=1e-6) before the merge, mlp=Linear(6144,6144)+GELU(erf)+Linear(6144,3584) with biases; "
        "SOL-ExecBench workload 32768 patches in 8 grids"
    ),
    inputs=("hidden", "grid_thw", "ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "eps"),
    outputs=(Output("y"),),
    flops=2.0 * _M * _K * _K + 2.0 * _M * _K * _O + 8.0 * _P * _H + 8.0 * _M * _K,
    bytes=2.0 * (_P * _H + 2 * _H + _K * _K + _K + _O * _K + _O + _M * _O) + 8 * 3 * _G,
    peak="bf16_tc",
    fixed_inputs=("grid_thw",),
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/27_patch_merger_mlp_qwen3_omni_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(
            ("computation", "the recipe's merge code is masked; mkb reads it as LayerNorm per patch, then the 2x2 block gather of each grid's raster-ordered patches (view(t, h/2, 2, w/2, 2, C) permuted to (t, h/2, w/2, 2, 2, C)), then fc1, exact-erf GELU and fc2."),
        ),
    ),
    notes=(
        "Inputs as upstream's recipe: hidden N(0, 1) plus a per-patch 0.5 N(0, 1) offset, ln_weight 1 + 0.1 N(0, 1), "
        "ln_bias 0.1 N(0, 1), fc weights N(0, 1)/sqrt(6144), fc biases N(0, 1). The grids are the recipe's: 8 grids "
        "of 4096 patches, each a square 1 x 64 x 64 (sides a multiple of the merge size), the same every draw "
        "(upstream redraws values, not the patch and grid axes). The recipe's merge code is masked: it is read as "
        "the 2x2 block gather of patches in raster order per grid, which grid_thw and 'merge spatial groups' "
        "describe. Smoke: 64 patches in 4 grids of 4 x 4, hidden 64, out 96."
    ),
)


def _merge(n, grid_thw):
    c = n.shape[-1]
    out, start = [], 0
    for t, h, w in grid_thw.tolist():
        g = n[start : start + t * h * w].view(t, h // MERGE_SIZE, MERGE_SIZE, w // MERGE_SIZE, MERGE_SIZE, c)
        out.append(g.permute(0, 1, 3, 2, 4, 5).reshape(-1, c * MERGE))
        start += t * h * w
    return torch.cat(out)


def reference(hidden, grid_thw, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, eps):
    ct = torch.promote_types(hidden.dtype, torch.float32)
    xf = hidden.to(ct)
    mu = xf.mean(dim=-1, keepdim=True)
    var = (xf - mu).pow(2).mean(dim=-1, keepdim=True)
    n = (xf - mu) * torch.rsqrt(var + eps) * ln_weight.to(ct) + ln_bias.to(ct)
    m = _merge(n, grid_thw)
    h = m @ fc1_weight.to(ct).T + fc1_bias.to(ct)
    a = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    return (a @ fc2_weight.to(ct).T + fc2_bias.to(ct)).to(hidden.dtype)


def eager(hidden, grid_thw, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, eps):
    F = torch.nn.functional
    n = _merge(F.layer_norm(hidden, (hidden.shape[-1],), ln_weight, ln_bias, eps), grid_thw)
    return F.linear(F.gelu(F.linear(n, fc1_weight, fc1_bias)), fc2_weight, fc2_bias)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    p, n_grids, hd, o = SHAPES[size]
    k = hd * MERGE
    side = math.isqrt(p // n_grids)
    grid_thw = torch.tensor([[1, side, side]] * n_grids, dtype=torch.int64, device=device)
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(p, hd, generator=g, device=device) + torch.randn(p, 1, generator=g, device=device) * 0.5
    ln_weight = torch.randn(hd, generator=g, device=device) * 0.1 + 1.0
    ln_bias = torch.randn(hd, generator=g, device=device) * 0.1
    w1 = torch.randn(k, k, generator=g, device=device) / math.sqrt(k)
    b1 = torch.randn(k, generator=g, device=device)
    w2 = torch.randn(o, k, generator=g, device=device) / math.sqrt(k)
    b2 = torch.randn(o, generator=g, device=device)
    bf = tuple(v.to(torch.bfloat16) for v in (x, ln_weight, ln_bias, w1, b1, w2, b2))
    return (bf[0], grid_thw) + bf[1:] + (EPS,)
