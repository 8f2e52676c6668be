"""DeltaNet delta-rule linear attention (chunkwise-parallel training/prefill form), bf16.

The sequence-mixing core of DeltaNet (Yang et al. 2024, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length"), with q/k L2 normalisation in the kernel. Per batch b and head h,
with S_0 = 0 (a [K, V] matrix), for t = 1..T, in fp32 (the promoted dtype):

    qn = q_t / sqrt(sum(q_t**2) + 1e-6) * K**-0.5 ;  kn = k_t / sqrt(sum(k_t**2) + 1e-6)
    S_t = S_{t-1} + outer(kn, beta_t * (v_t - kn @ S_{t-1}))      (no decay)
    o_t = qn @ S_t

Layouts: q, k, v bf16 [B, T, H, D]; beta bf16 [B, T, H] (already sigmoid-ed). Outputs: o bf16
[B, T, H, D] and final_state bf16 [B, H, D, D], each rounded once (fp32 between tokens).
`reference` is the exact recurrence; `eager` the chunked WY form (chunk 64). Full size:
DeltaNet 1.3B (hidden 2048, 16 heads of 128), 4 sequences of 4096 tokens.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.linear import delta_rule_chunked, delta_rule_recurrence, l2norm

BATCH = {"full": 4, "smoke": 1}
SEQ = {"full": 4096, "smoke": 150}
HEADS = {"full": 16, "smoke": 2}
DIM = {"full": 128, "smoke": 16}
CHUNK = 64
L2_EPS = 1e-6

_f = "full"
_B, _T, _H, _D = BATCH[_f], SEQ[_f], HEADS[_f], DIM[_f]

META = ProblemMeta(
    number=74,
    name="delta_rule_deltanet_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="fla-hub/delta_net-1.3B-100B (DeltaNet, Yang et al. 2024)",
    source_config="hidden_size=2048, num_heads=16, head_dim=128, qk_norm=l2 (eps 1e-6), use_beta=true "
    "(sigmoid), scale 1/sqrt(128); chunk 64",
    inputs=("q", "k", "v", "beta"),
    outputs=(Output("o"), Output("final_state")),
    flops=float(_B * _T * _H * (4 * CHUNK * _D + 2 * CHUNK * 3 * _D + 8 * _D * _D)),
    bytes=float(_B * _T * _H * (4 * _D + 1) * 2 + _B * _H * _D * _D * 2),
    peak="bf16_tc",
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is "
    "the chunked form. Final state in bf16 so a chunked kernel is judged at storage precision.",
)


def _prep(q, k, v, beta):
    ct = torch.promote_types(q.dtype, torch.float32)
    qn = l2norm(q.to(ct), L2_EPS) * q.shape[-1] ** -0.5
    kn = l2norm(k.to(ct), L2_EPS)
    B, T, H, D = q.shape
    g = torch.zeros(B, T, H, dtype=ct, device=q.device)
    S = torch.zeros(B, H, D, v.shape[-1], dtype=ct, device=q.device)
    return qn, kn, v.to(ct), g, beta.to(ct), S


def reference(q, k, v, beta):
    o, S = delta_rule_recurrence(*_prep(q, k, v, beta))
    return o.to(q.dtype), S.to(q.dtype)


def eager(q, k, v, beta):
    o, S = delta_rule_chunked(*_prep(q, k, v, beta), chunk=CHUNK)
    return o.to(q.dtype), S.to(q.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, D = BATCH[size], SEQ[size], HEADS[size], DIM[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    return rn(B, T, H, D).to(bf), rn(B, T, H, D).to(bf), rn(B, T, H, D).to(bf), torch.sigmoid(rn(B, T, H)).to(bf)
