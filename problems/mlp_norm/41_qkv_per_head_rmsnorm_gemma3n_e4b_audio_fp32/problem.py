"""Q/K/V projections into heads with a per-head RMSNorm of the queries and keys (Gemma 3n E4B audio widths), fp32.

Upstream MetaKernelBench's problem 41 (a SOL-ExecBench recipe): project hidden states into 8 heads of
128 for the queries, keys and values, and RMS-normalise every query and key head over its 128
dimensions with a learned weight (one for q, one for k):

    q = RMSNorm((x @ w_q.T).view(B, T, 8, 128)) * q_norm_weight        RMSNorm(z) = z * rsqrt(mean(z**2) + eps)
    k = RMSNorm((x @ w_k.T).view(B, T, 8, 128)) * k_norm_weight
    v = (x @ w_v.T).view(B, T, 8, 128)

Inputs (fp32): x [64, 128, 1024], w_q, w_k, w_v [1024, 1024] (nn.Linear layout, no biases),
q_norm_weight, k_norm_weight [128], eps = 1e-6 (a constant, passed as upstream passes it).
Outputs (fp32): q, k, v [64, 128, 8, 128]. Everything is fp32 without TF32.
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
HEADS, HEAD_DIM = 8, 128
SHAPES = {"full": (64, 128, 1024), "smoke": (2, 24, 256)}  # batch, frames, hidden (= heads x 128)

_B, _T, _H = SHAPES["full"]
_N = _B * _T

META = ProblemMeta(
    number=41,
    name="qkv_per_head_rmsnorm_gemma3n_e4b_audio_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="google/gemma-3n-E4B-it (audio widths); SOL-ExecBench recipe",
    source_config="hidden 1024 -> 8 heads x 128 for q, k, v (no biases); per-head RMSNorm of q and k (eps 1e-6) "
                  "with learned weights; batch 64 x 128 frames",
    inputs=("x", "w_q", "w_k", "w_v", "q_norm_weight", "k_norm_weight", "eps"),
    outputs=(Output("q"), Output("k"), Output("v")),
    flops=3 * 2.0 * _N * _H * _H + 2 * 4.0 * _N * _H,
    bytes=4.0 * (_N * _H + 3 * _H * _H + 2 * HEAD_DIM + 3 * _N * _H),
    peak="fp32_simt",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/41_qkv_per_head_rmsnorm_gemma3n_e4b_audio_fp32.json",
        matches=("in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe hides its reference ('project hidden states into query, key, and value heads "
             "and apply [per-head RMSNorm] to query and key'): mkb's RMSNorm is z * rsqrt(mean(z**2) + eps) * weight "
             "over each head's 128 dimensions"),
            ("outputs", "the recipe does not show the output layout: mkb returns q, k, v as [B, T, heads, head_dim] "
             "(the projections viewed into heads, not transposed)"),
        ),
    ),
    notes="Inputs as the recipe: x N(0, 1), weights N(0, 1)/sqrt(1024), norm weights 1 + 0.1 N(0, 1). "
          "Smoke: 2 x 24 frames, 2 heads of 128.",
)


def _heads(z, shape):
    return z.reshape(*shape[:-1], shape[-1] // HEAD_DIM, HEAD_DIM)


def reference(x, w_q, w_k, w_v, q_norm_weight, k_norm_weight, eps):
    ct = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(ct)

    def rms(z, w):
        return z * torch.rsqrt(z.pow(2).mean(dim=-1, keepdim=True) + eps) * w.to(ct)

    q = rms(_heads(xf @ w_q.to(ct).T, x.shape), q_norm_weight)
    k = rms(_heads(xf @ w_k.to(ct).T, x.shape), k_norm_weight)
    v = _heads(xf @ w_v.to(ct).T, x.shape)
    return q.to(x.dtype), k.to(x.dtype), v.to(x.dtype)


def eager(x, w_q, w_k, w_v, q_norm_weight, k_norm_weight, eps):
    F = torch.nn.functional
    q = F.rms_norm(_heads(F.linear(x, w_q), x.shape), (HEAD_DIM,), q_norm_weight, eps)
    k = F.rms_norm(_heads(F.linear(x, w_k), x.shape), (HEAD_DIM,), k_norm_weight, eps)
    return q, k, _heads(F.linear(x, w_v), x.shape)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, t, h = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=g, device=device)

    x = rn(b, t, h)
    w_q, w_k, w_v = rn(h, h) / math.sqrt(h), rn(h, h) / math.sqrt(h), rn(h, h) / math.sqrt(h)
    q_norm_weight = 1.0 + 0.1 * rn(HEAD_DIM)
    k_norm_weight = 1.0 + 0.1 * rn(HEAD_DIM)
    return (x, w_q, w_k, w_v, q_norm_weight, k_norm_weight, EPS)
