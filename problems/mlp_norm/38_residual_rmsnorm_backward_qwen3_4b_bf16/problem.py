"""Backward of the fused residual add + RMSNorm of Qwen3-4B (hidden 2560, eps 1e-6), bf16 training.

Forward (per token, over hidden 2560): s = x + residual (the new residual stream, also an output),
y = s * rstd * weight with rstd = rsqrt(mean(s**2) + 1e-6). The backward receives dy = dL/dy from
the next sub-layer and d_res = dL/ds from the residual stream (the later layers' use of s), and
returns, computed explicitly from the saved sum s:

    xhat = s * rstd
    dweight = sum over tokens of dy * xhat
    g  = dy * weight
    ds = d_res + rstd * (g - xhat * mean(g * xhat))      (= dL/dx = dL/dresidual: the add copies it)

Inputs (bf16): s [16384, 2560] (the saved residual sum of 4 sequences x 4096 tokens), weight
[2560], dy [16384, 2560], d_res [16384, 2560]. Outputs (bf16): ds [16384, 2560], dweight [2560].

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) without intermediate
rounding and rounds each output once to bf16; dweight reduces over 16384 tokens. Explicit
formulas, no autograd.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
SHAPES = {"full": (16384, 2560), "smoke": (64, 256)}  # tokens, hidden

_T, _H = SHAPES["full"]

META = ProblemMeta(
    number=38,
    name="residual_rmsnorm_backward_qwen3_4b_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="Qwen/Qwen3-4B",
    source_config="hidden_size=2560, rms_norm_eps=1e-6 (Qwen3RMSNorm input/post_attention_layernorm); "
                  "training micro-batch 4 x 4096 tokens",
    inputs=("s", "weight", "dy", "d_res"),
    outputs=(Output("ds"), Output("dweight")),
    flops=12.0 * _T * _H,
    bytes=2.0 * (4 * _T * _H + 2 * _H),
    peak="memory",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/38_residual_rmsnorm_backward_qwen3_4b_bf16.json',
        matches=('in_place', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('outputs', "upstream returns three gradients (its reference's tuple has three entries); mkb returns ds and dweight - not yet converted (issue #15 follow-up)"),
            ('computation', "upstream's recipe passes grad_output, the saved normalised input, rstd and the weight (4 inputs); mkb passes the residual sum s, the weight, dy and the residual-stream gradient d_res and returns ds and dweight - not yet converted (issue #15 follow-up)"),
            ('shapes', 'upstream: 64 x 8192 = 524288 tokens, hidden 2560 (2.7 GB per bf16 tensor); mkb: 16384 tokens, hidden 2560 - not yet converted (issue #15 follow-up)'),
            ('distributions', 'upstream: x N(0, 1) times a per-token U(0.5, 2) scale, weight 1 + 0.1 N, grad_output N(0, 1) plus 0.5 x normalised x weight; mkb: per-token log-normal scales, weight 1 + 0.3 N - not yet converted (issue #15 follow-up)'),
        ),
    ),
    notes="ds is the gradient of both addends (x and residual), returned once. Smoke: 64 tokens x 256.",
)


def reference(s, weight, dy, d_res):
    ct = torch.promote_types(s.dtype, torch.float32)
    sf, dyf = s.to(ct), dy.to(ct)
    rstd = torch.rsqrt(sf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    xhat = sf * rstd
    dweight = (dyf * xhat).sum(dim=0)
    g = dyf * weight.to(ct)
    ds = d_res.to(ct) + rstd * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    return ds.to(s.dtype), dweight.to(s.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, h = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    # residual stream: per-token scale spread and a few large channels, as in trained Qwen3 layers
    s = torch.randn(t, h, generator=g, device=device) * torch.exp(0.5 * torch.randn(t, 1, generator=g, device=device))
    s[:, :: max(1, h // 8)] *= 8.0
    weight = 1.0 + 0.3 * torch.randn(h, generator=g, device=device)
    dy = torch.randn(t, h, generator=g, device=device)
    d_res = 0.5 * torch.randn(t, h, generator=g, device=device)
    return tuple(v.to(torch.bfloat16) for v in (s, weight, dy, d_res))
