"""Kimi Delta Attention (KDA): the delta rule with channel-wise (per key dimension) gated decay, bf16.

Upstream MetaKernelBench's problem 68 (flash-linear-attention's `naive_recurrent_kda`, KDA head
geometry). Per batch b and value head h (query/key head h // (HV / H)), with S_0 = 0 (a [K, V]
matrix), for t = 1..T, in fp32 (the promoted dtype):

    qn = q_t / max(||q_t||, 1e-12) * K**-0.5 ;  kn = k_t / max(||k_t||, 1e-12)      (F.normalize)
    S  = Diag(exp(g_t)) S_{t-1}                          (g_t in R^K, <= 0: per-channel log decay)
    S_t = S + outer(kn, beta_t * (v_t - kn @ S))         (delta rule)
    o_t = qn @ S_t                                       (rounded to bf16)

Layouts: q, k bf16 [B, T, H, K]; v bf16 [B, T, HV, V]; g bf16 [B, T, HV, K] (logsigmoid(x) / 16);
beta bf16 [B, T, HV] (sigmoid-ed). Output: o bf16 [B, T, HV, V]. `reference` is the exact recurrence;
`eager` a chunked form (chunk 32) with exact pairwise per-channel decays.
Full size: upstream's (B 8, T 1024, 16 heads of 128).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import channel_gated_chunked, channel_gated_recurrence, l2normalize

BATCH = {"full": 8, "smoke": 1}
SEQ = {"full": 1024, "smoke": 80}
HEADS = {"full": 16, "smoke": 2}
DIM = {"full": 128, "smoke": 16}
CHUNK = 32
GATE_LOGIT_NORMALIZER = 16.0

_f = "full"
_B, _T, _H, _D = BATCH[_f], SEQ[_f], HEADS[_f], DIM[_f]

META = ProblemMeta(
    number=68,
    name="channelwise_gated_delta_rule_kda_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="moonshotai/Kimi-Linear-48B-A3B-Instruct (KDA layers); fla naive_recurrent_kda",
    source_config="16 heads of 128 (fla KDA test geometry), q/k F.normalize, scale 1/sqrt(128), "
    "g = logsigmoid(.) / 16 per channel, beta = sigmoid(.)",
    inputs=("q", "k", "v", "g", "beta"),
    outputs=(Output("o"),),
    # chunked: decayed q k^T and k k^T (2 * 3*C*K), T@u, T@w, attn@v_new, and four K x V state products
    flops=float(_B * _T * _H * (6 * CHUNK * _D + 2 * CHUNK * 3 * _D + 8 * _D * _D)),
    bytes=float(_B * _T * _H * (5 * _D * 2 + 2)),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/linear_attention/68_channelwise_gated_delta_rule_kda_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
    ),
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is a chunked "
    "form. Inputs as upstream: q, k, v N(0, 1) in bf16, g = logsigmoid(N(0, 1)) / 16 rounded to bf16, "
    "beta = sigmoid of a bf16 N(0, 1) draw. Smoke: 1 x 80 tokens, 2 heads of 16.",
)


def _prep(q, k, v, g, beta):
    ct = torch.promote_types(v.dtype, torch.float32)
    rep = v.shape[2] // q.shape[2]
    qn = (l2normalize(q.to(ct)) * q.shape[-1] ** -0.5).repeat_interleave(rep, dim=2)
    kn = l2normalize(k.to(ct)).repeat_interleave(rep, dim=2)
    B, H, K, V = v.shape[0], v.shape[2], q.shape[-1], v.shape[-1]
    S = torch.zeros(B, H, K, V, dtype=ct, device=q.device)
    return qn, kn, v.to(ct), g.to(ct), beta.to(ct), S


def reference(q, k, v, g, beta):
    o, _ = channel_gated_recurrence(*_prep(q, k, v, g, beta))
    return o.to(v.dtype)


def eager(q, k, v, g, beta):
    o, _ = channel_gated_chunked(*_prep(q, k, v, g, beta), chunk=CHUNK)
    return o.to(v.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, D = BATCH[size], SEQ[size], HEADS[size], DIM[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, T, H, D).to(bf), rn(B, T, H, D).to(bf), rn(B, T, H, D).to(bf)
    g = (F.logsigmoid(rn(B, T, H, D)) / GATE_LOGIT_NORMALIZER).to(bf)
    beta = rn(B, T, H).to(bf).sigmoid()
    return q, k, v, g, beta
