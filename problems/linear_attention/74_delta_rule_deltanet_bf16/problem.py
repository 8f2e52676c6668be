"""DeltaNet delta-rule linear attention from an initial state (no decay), bf16 activations, fp32 state.

Upstream MetaKernelBench's problem 74 (flash-linear-attention's naive `delta_rule_recurrence`, DeltaNet
head geometry). Per batch b and head h, with S_0 = initial_state[b, h] (a [K, V] matrix), for
t = 1..T, in fp32 (the promoted dtype):

    qn = q_t / max(||q_t||, 1e-12) * K**-0.5 ;  kn = k_t / max(||k_t||, 1e-12)      (F.normalize)
    S_t = S_{t-1} + outer(kn, beta_t * (v_t - kn @ S_{t-1}))      (no decay)
    o_t = qn @ S_t                                                 (rounded to bf16)

Layouts (head-major, as upstream): q, k, v bf16 [B, H, T, D]; beta bf16 [B, H, T] (sigmoid-ed);
initial_state fp32 [B, H, D, D]. Outputs: o bf16 [B, H, T, D] and final_state fp32 [B, H, D, D].
`reference` is the exact recurrence; `eager` the chunked WY form (chunk 64).
Full size: upstream's (B 8, 16 heads, T 1024, head dim 128).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import delta_rule_chunked, delta_rule_recurrence, l2normalize

BATCH = {"full": 8, "smoke": 1}
SEQ = {"full": 1024, "smoke": 150}
HEADS = {"full": 16, "smoke": 2}
DIM = {"full": 128, "smoke": 16}
CHUNK = 64

_f = "full"
_B, _T, _H, _D = BATCH[_f], SEQ[_f], HEADS[_f], DIM[_f]

META = ProblemMeta(
    number=74,
    name="delta_rule_deltanet_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32"),
    source_model="DeltaNet (Yang et al. 2024); fla delta_rule_recurrence",
    source_config="16 heads of 128 (fla DeltaNet test geometry), q/k F.normalize, use_beta (sigmoid), scale 1/sqrt(128)",
    inputs=("q", "k", "v", "beta", "initial_state"),
    outputs=(Output("o"), Output("final_state")),
    flops=float(_B * _T * _H * (4 * CHUNK * _D + 2 * CHUNK * 3 * _D + 8 * _D * _D)),
    bytes=float(_B * _T * _H * (4 * _D + 1) * 2 + 2 * _B * _H * _D * _D * 4),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/linear_attention/74_delta_rule_deltanet_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
    ),
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is the chunked "
    "form. Inputs as upstream: q, k, v N(0, 1) in bf16, beta = sigmoid of a bf16 N(0, 1) draw, initial_state "
    "N(0, 1) fp32. Smoke: 1 x 2 heads x 150 tokens, head dim 16.",
)


def _prep(q, k, v, beta, initial_state):
    ct = torch.promote_types(q.dtype, torch.float32)
    qn = (l2normalize(q.to(ct)) * q.shape[-1] ** -0.5).transpose(1, 2)  # [B, T, H, D]
    kn = l2normalize(k.to(ct)).transpose(1, 2)
    B, H, T, _ = q.shape
    g = torch.zeros(B, T, H, dtype=ct, device=q.device)
    return qn, kn, v.to(ct).transpose(1, 2), g, beta.to(ct).transpose(1, 2), initial_state.to(ct)


def reference(q, k, v, beta, initial_state):
    o, S = delta_rule_recurrence(*_prep(q, k, v, beta, initial_state))
    return o.transpose(1, 2).to(q.dtype), S.to(initial_state.dtype)


def eager(q, k, v, beta, initial_state):
    o, S = delta_rule_chunked(*_prep(q, k, v, beta, initial_state), chunk=CHUNK)
    return o.transpose(1, 2).to(q.dtype), S.to(initial_state.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, D = BATCH[size], SEQ[size], HEADS[size], DIM[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, H, T, D).to(bf), rn(B, H, T, D).to(bf), rn(B, H, T, D).to(bf)
    beta = rn(B, H, T).to(bf).sigmoid()
    initial_state = rn(B, H, D, D)
    return q, k, v, beta, initial_state
