"""Gated linear attention (GLA) with data-dependent per-channel decay over a matrix-valued state, bf16.

Upstream MetaKernelBench's problem 69 (flash-linear-attention's `naive_recurrent_gla`, GLA head
geometry). Per batch b and head h, with S_0 = 0 (a [K, V] matrix), for t = 1..T, in fp32 (the
promoted dtype):

    S_t = Diag(exp(gk_t)) S_{t-1} + outer(k_t, v_t)      (gk_t in R^K, <= 0: per-channel log decay)
    o_t = (q_t * K**-0.5) @ S_t                          (rounded to bf16)

Layouts: q, k bf16 [B, T, H, 256]; v bf16 [B, T, H, 512]; gk bf16 [B, T, H, 256]
(logsigmoid(x) / 16). Output: o bf16 [B, T, H, 512]. `reference` is the exact recurrence; `eager` a
chunked form (chunk 32) with exact pairwise per-channel decays.
Full size: upstream's (B 8, T 1024, 4 heads, key dim 256, value dim 512).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import channel_gated_chunked, channel_gated_recurrence

BATCH = {"full": 8, "smoke": 1}
SEQ = {"full": 1024, "smoke": 80}
HEADS = {"full": 4, "smoke": 2}
DK = {"full": 256, "smoke": 16}
DV = {"full": 512, "smoke": 32}
CHUNK = 32
GATE_LOGIT_NORMALIZER = 16.0

_f = "full"
_B, _T, _H, _K, _V = BATCH[_f], SEQ[_f], HEADS[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=69,
    name="gated_linear_attention_gla_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="fla-hub/gla-1.3B-100B (GLA, Yang et al. 2023); fla naive_recurrent_gla",
    source_config="num_heads=4, K=256 and V=512 per head (fla GLA test geometry), gate_logit_normalizer=16, "
    "scale 1/sqrt(256)",
    inputs=("q", "k", "v", "gk"),
    outputs=(Output("o"),),
    # chunked: decayed q k^T (3*C*K), attn@v (2*C*V), q@S, k^T v into S (2 * 2*K*V)
    flops=float(_B * _T * _H * (3 * CHUNK * _K + 2 * CHUNK * _V + 4 * _K * _V)),
    bytes=float(_B * _T * _H * (3 * _K + 2 * _V) * 2),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/linear_attention/69_gated_linear_attention_gla_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
    ),
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is a chunked "
    "form. Inputs as upstream: q, k, v N(0, 1) in bf16, gk = logsigmoid(N(0, 1)) / 16 rounded to bf16. "
    "Smoke: 1 x 80 tokens, 2 heads, K 16, V 32.",
)


def _prep(q, k, v, gk):
    ct = torch.promote_types(q.dtype, torch.float32)
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=ct, device=q.device)
    return q.to(ct) * K**-0.5, k.to(ct), v.to(ct), gk.to(ct), None, S


def reference(q, k, v, gk):
    o, _ = channel_gated_recurrence(*_prep(q, k, v, gk))
    return o.to(q.dtype)


def eager(q, k, v, gk):
    o, _ = channel_gated_chunked(*_prep(q, k, v, gk), chunk=CHUNK)
    return o.to(q.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, K, V = BATCH[size], SEQ[size], HEADS[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, T, H, K).to(bf), rn(B, T, H, K).to(bf), rn(B, T, H, V).to(bf)
    gk = (F.logsigmoid(rn(B, T, H, K)) / GATE_LOGIT_NORMALIZER).to(bf)
    return q, k, v, gk
