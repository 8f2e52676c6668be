"""Gated linear attention (GLA) with data-dependent per-channel decay, bf16 (chunked prefill form).

The sequence-mixing core of GLA (Yang et al. 2023, "Gated Linear Attention Transformers with
Hardware-Efficient Training"). Per batch b and head h, with S_0 = 0 (a [K, V] matrix), for
t = 1..T, in fp32 (the promoted dtype):

    S_t = Diag(exp(g_t)) S_{t-1} + outer(k_t, v_t)      (g_t in R^K, <= 0: per-channel log decay)
    o_t = (q_t * K**-0.5) @ S_t

Layouts: q, k bf16 [B, T, H, 256]; v bf16 [B, T, H, 512]; g fp32 [B, T, H, 256]
(g = logsigmoid(x W_g) / 16, computed upstream). Outputs: o bf16 [B, T, H, 512] and final_state bf16
[B, H, 256, 512], each rounded once (fp32 between tokens). `reference` is the exact recurrence;
`eager` a chunked form (chunk 32) with exact pairwise per-channel decays. Full size: GLA 1.3B
(hidden 2048, 4 heads, expand_k 0.5, expand_v 1), 4 sequences of 2048 tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.linear import channel_gated_chunked, channel_gated_recurrence

BATCH = {"full": 4, "smoke": 1}
SEQ = {"full": 2048, "smoke": 80}
HEADS = {"full": 4, "smoke": 2}
DK = {"full": 256, "smoke": 16}
DV = {"full": 512, "smoke": 32}
CHUNK = 32
GATE_NORMALIZER = 16.0

_f = "full"
_B, _T, _H, _K, _V = BATCH[_f], SEQ[_f], HEADS[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=69,
    name="gated_linear_attention_gla_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32"),
    source_model="fla-hub/gla-1.3B-100B (GLA, Yang et al. 2023)",
    source_config="hidden_size=2048, num_heads=4, expand_k=0.5 (K=256 per head), expand_v=1 (V=512 per head), "
    "gate_logit_normalizer=16, scale 1/sqrt(256)",
    inputs=("q", "k", "v", "g"),
    outputs=(Output("o"), Output("final_state")),
    # chunked: decayed q k^T (3*C*K), attn@v (2*C*V), q@S, k^T v into S (2 * 2*K*V)
    flops=float(_B * _T * _H * (3 * CHUNK * _K + 2 * CHUNK * _V + 4 * _K * _V)),
    bytes=float(_B * _T * _H * ((2 * _K + 2 * _V) * 2 + _K * 4) + _B * _H * _K * _V * 2),
    peak="bf16_tc",
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is "
    "a chunked form. Final state in bf16 so a chunked kernel is judged at storage precision.",
)


def _prep(q, k, v, g):
    ct = torch.promote_types(q.dtype, torch.float32)
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=ct, device=q.device)
    return q.to(ct) * K**-0.5, k.to(ct), v.to(ct), g.to(ct), None, S


def reference(q, k, v, g):
    o, S = channel_gated_recurrence(*_prep(q, k, v, g))
    return o.to(q.dtype), S.to(q.dtype)


def eager(q, k, v, g):
    o, S = channel_gated_chunked(*_prep(q, k, v, g), chunk=CHUNK)
    return o.to(q.dtype), S.to(q.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, K, V = BATCH[size], SEQ[size], HEADS[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, T, H, K).to(bf), rn(B, T, H, K).to(bf), rn(B, T, H, V).to(bf)
    g = F.logsigmoid(2.0 * rn(B, T, H, K) + 1.0) / GATE_NORMALIZER
    return q, k, v, g
