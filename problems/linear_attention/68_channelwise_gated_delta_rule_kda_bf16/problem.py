"""Kimi Delta Attention (KDA): the delta rule with channel-wise (per key dimension) gated decay, bf16.

The sequence-mixing core of Kimi Linear's KDA layers (FLA `chunk_kda` with q/k L2 normalisation in
the kernel). Per batch b and head h, with S_0 = initial_state[b, h] (a [K, V] matrix), for
t = 1..T, in fp32 (the promoted dtype):

    qn = q_t / sqrt(sum(q_t**2) + 1e-6) * K**-0.5 ;  kn = k_t / sqrt(sum(k_t**2) + 1e-6)
    S  = Diag(exp(g_t)) S_{t-1}                          (g_t in R^K, <= 0: per-channel log decay)
    S_t = S + outer(kn, beta_t * (v_t - kn @ S))         (delta rule)
    o_t = qn @ S_t

Layouts: q, k, v bf16 [B, T, H, 128]; g fp32 [B, T, H, 128] (g = -exp(A_log) * softplus(f + dt_bias),
computed upstream); beta bf16 [B, T, H] (sigmoid-ed); initial_state bf16 [B, H, K, V]. Outputs:
o bf16 [B, T, H, V] and final_state bf16 [B, H, K, V], each rounded once (fp32 between tokens).
`reference` is the exact recurrence; `eager` a chunked form (chunk 32) with exact pairwise
per-channel decays. Full size: Kimi-Linear-48B-A3B (32 heads of 128), 2 sequences of 2048 tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.linear import channel_gated_chunked, channel_gated_recurrence, l2norm

BATCH = {"full": 2, "smoke": 1}
SEQ = {"full": 2048, "smoke": 80}
HEADS = {"full": 32, "smoke": 2}
DIM = {"full": 128, "smoke": 16}
CHUNK = 32
L2_EPS = 1e-6

_f = "full"
_B, _T, _H, _D = BATCH[_f], SEQ[_f], HEADS[_f], DIM[_f]

META = ProblemMeta(
    number=68,
    name="channelwise_gated_delta_rule_kda_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32"),
    source_model="moonshotai/Kimi-Linear-48B-A3B-Instruct (KDA layers)",
    source_config="num_attention_heads=32, head_dim=128 (kda), q/k l2norm eps 1e-6, scale 1/sqrt(128), "
    "per-channel gate g = -exp(A_log) * softplus(. + dt_bias), beta = sigmoid(.)",
    inputs=("q", "k", "v", "g", "beta", "initial_state"),
    outputs=(Output("o"), Output("final_state")),
    # chunked: decayed q k^T and k k^T (2 * 3*C*K), T@u, T@w, attn@v_new, and four K x V state products
    flops=float(_B * _T * _H * (6 * CHUNK * _D + 2 * CHUNK * 3 * _D + 8 * _D * _D)),
    bytes=float(_B * _T * _H * (4 * _D * 2 + _D * 4 + 2) + 2 * _B * _H * _D * _D * 2),
    peak="bf16_tc",
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is "
    "a chunked form. States are bf16 in memory so a chunked kernel is judged at storage precision.",
)


def _prep(q, k, v, g, beta, initial_state):
    ct = torch.promote_types(q.dtype, torch.float32)
    qn = l2norm(q.to(ct), L2_EPS) * q.shape[-1] ** -0.5
    return qn, l2norm(k.to(ct), L2_EPS), v.to(ct), g.to(ct), beta.to(ct), initial_state.to(ct)


def reference(q, k, v, g, beta, initial_state):
    o, S = channel_gated_recurrence(*_prep(q, k, v, g, beta, initial_state))
    return o.to(q.dtype), S.to(initial_state.dtype)


def eager(q, k, v, g, beta, initial_state):
    o, S = channel_gated_chunked(*_prep(q, k, v, g, beta, initial_state), chunk=CHUNK)
    return o.to(q.dtype), S.to(initial_state.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, D = BATCH[size], SEQ[size], HEADS[size], DIM[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, T, H, D).to(bf), rn(B, T, H, D).to(bf), rn(B, T, H, D).to(bf)
    A = 1.0 + 15.0 * torch.rand(H, 1, generator=gen, device=device)
    g = -A * F.softplus(rn(B, T, H, D) - 4.0)  # most channels keep memory, some forget fast
    beta = torch.sigmoid(rn(B, T, H)).to(bf)
    initial_state = (0.5 * rn(B, H, D, D)).to(bf)
    return q, k, v, g, beta, initial_state
