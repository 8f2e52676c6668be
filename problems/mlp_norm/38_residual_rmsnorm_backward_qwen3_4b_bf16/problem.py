"""Backward of Qwen3-4B's fused residual add + RMSNorm (hidden 2560, eps 1e-6), bf16 with fp32 rstd.

Forward (per token row, saved for the backward): s = x + residual (the new residual stream, which
also flows on to the next layer), rstd = rsqrt(mean(s**2) + eps) (fp32), y = s * rstd * weight.
Given the gradient `dy` of y and the gradient `dres` arriving along the residual stream (from
the later layers that read s), the gradients, written explicitly (no autograd):

    g    = dy * weight
    s_hat = s * rstd
    ds   = rstd * (g - s_hat * mean(g * s_hat, over hidden)) + dres     (= dx = dresidual)
    dw   = sum over tokens of dy * s_hat

Outputs: ds in bf16 ([tokens, 2560]) and dw in bf16 ([2560], accumulated in fp32). All arithmetic
in fp32 (the promotion of bf16 and fp32), one rounding per output at the end.
Full size: a training micro-batch of 4 sequences of 4096 tokens.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

SHAPES = {"full": (16384, 2560), "smoke": (61, 256)}  # tokens, hidden
EPS = 1e-6
_T, _H = SHAPES["full"]

META = ProblemMeta(
    number=38,
    name="residual_rmsnorm_backward_qwen3_4b_bf16",
    family="mlp_norm",
    dtypes=("bf16", "fp32"),
    source_model="Qwen/Qwen3-4B",
    source_config="hidden_size=2560, rms_norm_eps=1e-6; 4 x 4096 training tokens",
    inputs=("dy", "dres", "s", "weight", "rstd"),
    outputs=(Output("ds"), Output("dw")),
    flops=10.0 * _T * _H,
    bytes=4.0 * _T * _H * 2 + _T * 4 + 2 * _H * 2,
    peak="memory",
    notes="rstd is the forward's saved fp32 reciprocal RMS of s. dw needs a reduction over all tokens. Smoke: 61 x 256.",
)


def reference(dy, dres, s, weight, rstd):
    ct = torch.promote_types(dy.dtype, torch.float32)
    r = rstd.to(ct).unsqueeze(-1)
    s_hat = s.to(ct) * r
    g = dy.to(ct) * weight.to(ct)
    ds = r * (g - s_hat * (g * s_hat).mean(dim=-1, keepdim=True)) + dres.to(ct)
    dw = (dy.to(ct) * s_hat).sum(dim=0)
    return ds.to(dy.dtype), dw.to(weight.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, h = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    s = (torch.randn(t, h, generator=g, device=device) * 3.0).to(torch.bfloat16)
    rstd = torch.rsqrt(s.float().pow(2).mean(dim=-1) + EPS)
    weight = (1.0 + 0.3 * torch.randn(h, generator=g, device=device)).to(torch.bfloat16)
    dy = (torch.randn(t, h, generator=g, device=device) * 0.01).to(torch.bfloat16)
    dres = (torch.randn(t, h, generator=g, device=device) * 0.003).to(torch.bfloat16)
    return dy, dres, s, weight, rstd
