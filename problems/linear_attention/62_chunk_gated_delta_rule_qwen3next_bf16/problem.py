"""Chunked gated delta rule (Gated DeltaNet prefill) at Qwen3-Next's head geometry, bf16, head-major layouts.

Upstream MetaKernelBench's problem 62 (a SOL-ExecBench recipe): gated delta-rule linear attention over
B sequences of T tokens from a zero state, with L2-normalised queries and keys and a per-token scalar
log decay. Per batch b and value head h (query/key head h // (Hv // Hk)), with S_0 = 0 ([K, V]),
for t = 1..T, in fp32 (the promoted dtype):

    qn = q_t / sqrt(sum(q_t**2) + 1e-6) * scale ;  kn = k_t / sqrt(sum(k_t**2) + 1e-6)
    S  = S_{t-1} * exp(g_t)                                  (g_t <= 0: log decay)
    S_t = S + outer(kn, beta_t * (v_t - kn @ S))            (delta rule)
    o_t = qn @ S_t                                           (rounded to bf16)

Layouts (head-major, as the recipe): q, k bf16 [B, Hk, T, K]; v bf16 [B, Hv, T, V]; g, beta bf16
[B, Hv, T] (beta already sigmoid-ed); scale float (1/sqrt(128)). Output: o bf16 [B, Hv, T, V].
`reference` runs the exact recurrence token by token; `eager` is the chunked WY form (chunk 64, as
in the HF `torch_chunk_gated_delta_rule`). Full size: the recipe's (batch 16 x 256 tokens, 4 key
heads, 16 value heads, dim 128).
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import delta_rule_chunked, delta_rule_recurrence, l2norm

BATCH = {"full": 16, "smoke": 1}
SEQ = {"full": 256, "smoke": 150}
HK = {"full": 4, "smoke": 1}
HV = {"full": 16, "smoke": 2}
DK = {"full": 128, "smoke": 16}
DV = {"full": 128, "smoke": 16}
CHUNK = 64
L2_EPS = 1e-6
SCALE = 1.0 / math.sqrt(128)

_f = "full"
_B, _T, _Hv, _K, _V = BATCH[_f], SEQ[_f], HV[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=62,
    name="chunk_gated_delta_rule_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct (head dims); SOL-ExecBench recipe",
    source_config="4 key heads, 16 value heads, head dims 128; q/k l2norm (eps 1e-6, FLA's in-kernel norm), "
    "scale 1/sqrt(128); chunk 64; batch 16 x 256 tokens",
    inputs=("q", "k", "v", "g", "beta", "scale"),
    outputs=(Output("o"),),
    # chunked form per (token, value head): k k^T and q k^T (2*2*C*K), T@u and T@w, attn@v_new
    # (2*(C*V + C*K + C*V)), and four K x V products with the state (4*2*K*V)
    flops=float(_B * _T * _Hv * (4 * CHUNK * _K + 2 * CHUNK * (2 * _V + _K) + 8 * _K * _V)),
    bytes=float(_B * _T * (2 * HK[_f] * _K + _Hv * _V) * 2 + _B * _T * _Hv * 2 * 2 + _B * _T * _Hv * _V * 2),
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/62_chunk_gated_delta_rule_qwen3next_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe hides its reference and shows only 'L2-normalized queries, decay gating, "
             "recurrent state carry': mkb normalises q and k as FLA's use_qk_l2norm_in_kernel does (eps 1e-6 inside "
             "the square root) and returns o head-major like its inputs; details the recipe does not show may differ"),
        ),
    ),
    notes="Inputs as the recipe: q, k, v N(0, 1) in bf16, g U(-0.05, 0) in bf16, beta = sigmoid of a bf16 N(0, 1) "
    "draw. The reference is the token-by-token recurrence (its float64 run is the anchor); eager is the chunked "
    "form. Smoke: 1 x 150 tokens, 1 key head, 2 value heads, dim 16.",
)


def _prep(q, k, v, g, beta, scale):
    """Sequence-major fp32 copies (mkb.problems.linear's layout) with normalised, head-expanded q and k."""
    ct = torch.promote_types(q.dtype, torch.float32)
    rep = v.shape[1] // q.shape[1]
    qn = (l2norm(q.to(ct), L2_EPS) * scale).repeat_interleave(rep, dim=1).transpose(1, 2)
    kn = l2norm(k.to(ct), L2_EPS).repeat_interleave(rep, dim=1).transpose(1, 2)
    B, H, _, V = v.shape
    S = torch.zeros(B, H, q.shape[-1], V, dtype=ct, device=q.device)
    return qn, kn, v.to(ct).transpose(1, 2), g.to(ct).transpose(1, 2), beta.to(ct).transpose(1, 2), S


def reference(q, k, v, g, beta, scale):
    o, _ = delta_rule_recurrence(*_prep(q, k, v, g, beta, scale))
    return o.transpose(1, 2).to(q.dtype)


def eager(q, k, v, g, beta, scale):
    o, _ = delta_rule_chunked(*_prep(q, k, v, g, beta, scale), chunk=CHUNK)
    return o.transpose(1, 2).to(q.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, hk, hv, dk, dv = BATCH[size], SEQ[size], HK[size], HV[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, hk, T, dk).to(bf), rn(B, hk, T, dk).to(bf), rn(B, hv, T, dv).to(bf)
    g = (-0.05 * torch.rand(B, hv, T, generator=gen, device=device)).to(bf)
    beta = rn(B, hv, T).to(bf).sigmoid()
    return q, k, v, g, beta, SCALE
