"""Per-head RMSNorm over head_dim 128 of Qwen3-30B-A3B's query and key projections (QK-norm), bf16.

Qwen3 normalises every attention head's query and key vector before RoPE (`q_norm`, `k_norm`:
RMSNorm over head_dim = 128, eps 1e-6, one learned weight of 128 per norm):

    y[t, h, :] = x[t, h, :] * rsqrt(mean(x[t, h, :]**2) + eps) * weight

Here `x` is the query projection of a prefill batch viewed as [tokens, 32 heads, 128]. Arithmetic is
in fp32 with one rounding to bf16 at the end (Qwen3's RMSNorm computes in fp32 and multiplies the
weight after casting back; this problem fixes the single-rounding variant).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

SHAPES = {"full": (16384, 32, 128), "smoke": (37, 4, 128)}  # tokens, heads, head_dim
EPS = 1e-6
_T, _H, _D = SHAPES["full"]

META = ProblemMeta(
    number=36,
    name="rmsnorm_h128_qwen3_30b_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="Qwen/Qwen3-30B-A3B",
    source_config="num_attention_heads=32, head_dim=128, rms_norm_eps=1e-6 (q_norm/k_norm over head_dim); 16384 prefill tokens",
    inputs=("x", "weight"),
    outputs=(Output("y"),),
    flops=4.0 * _T * _H * _D,
    bytes=2.0 * _T * _H * _D * 2 + _D * 2,
    peak="memory",
    notes="Rows of 128 elements: one warp per head row is natural. Smoke: 37 tokens x 4 heads.",
)


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    ct = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(ct)
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (xf * inv * weight.to(ct)).to(x.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, h, d = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    # per-head scales differ (some heads carry much larger activations), as in trained projections
    scale = torch.exp(torch.randn(1, h, 1, generator=g, device=device))
    x = torch.randn(t, h, d, generator=g, device=device) * scale
    weight = 1.0 + 0.5 * torch.randn(d, generator=g, device=device)
    return x.to(torch.bfloat16), weight.to(torch.bfloat16)
