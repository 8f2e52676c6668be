"""Fused residual add + RMSNorm of Llama 3.1 8B (hidden 4096, eps 1e-5), bf16 in and out.

Every decoder layer of Llama 3.1 8B adds the attention (or MLP) output `x` to the residual stream
`residual` and RMS-normalises the sum before the next sub-layer:

    s = x + residual                           (in fp32, no intermediate rounding)
    y = s * rsqrt(mean(s**2, over hidden) + eps) * weight

`y` (the normalised sum) is returned in bf16; the sum itself is not returned and no input is updated.
All arithmetic is in fp32 (the promotion of bf16 and fp32) with one rounding to bf16 at the end.
The 14509 tokens are a packed prefill batch (not a multiple of any tile size).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

TOKENS = {"full": 14509, "smoke": 67}
HIDDEN = {"full": 4096, "smoke": 256}
EPS = 1e-5

_T, _H = TOKENS["full"], HIDDEN["full"]

META = ProblemMeta(
    number=28,
    name="fused_add_rmsnorm_h4096_llama31_8b_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="meta-llama/Llama-3.1-8B",
    source_config="hidden_size=4096, rms_norm_eps=1e-5; 14509 packed prefill tokens (published problem header)",
    inputs=("x", "residual", "weight"),
    outputs=(Output("y"),),
    flops=6.0 * _T * _H,  # add, square, sum, scale, weight multiply (+ the per-row rsqrt)
    bytes=3.0 * _T * _H * 2 + _H * 2,
    peak="memory",
    upstream=Upstream(
        source="shipped",
        path="problems/mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
    ),
    notes="Returns only the normalised sum (not the updated residual), as upstream. Inputs as upstream: x and "
    "residual N(0, 1) in bf16, weight 1 + 0.1 N(0, 1) (drawn in fp32, rounded to bf16). Smoke: 67 x 256.",
)


def reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    ct = torch.promote_types(x.dtype, torch.float32)
    s = x.to(ct) + residual.to(ct)
    inv = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (s * inv * weight.to(ct)).to(x.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, h = TOKENS[size], HIDDEN[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(t, h, generator=g, device=device)
    residual = torch.randn(t, h, generator=g, device=device)
    weight = 1.0 + 0.1 * torch.randn(h, generator=g, device=device)
    return tuple(v.to(torch.bfloat16) for v in (x, residual, weight))
