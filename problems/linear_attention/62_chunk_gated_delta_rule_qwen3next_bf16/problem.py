"""Chunked gated delta rule (Gated DeltaNet prefill) of Qwen3-Next, bf16 activations, fp32 state.

The sequence-mixing core of a Qwen3-Next linear-attention layer over a prefill batch
(FLA `chunk_gated_delta_rule` with `use_qk_l2norm_in_kernel=True`). Per batch b and value head h
(key head h // (Hv // Hk)), with S_0 = initial_state[b, h] (a [K, V] matrix), for t = 1..T, in
fp32 (the promoted dtype):

    qn = q_t / sqrt(sum(q_t**2) + 1e-6) * K**-0.5 ;  kn = k_t / sqrt(sum(k_t**2) + 1e-6)
    S  = S_{t-1} * exp(g_t)                                  (g_t <= 0: log decay)
    S_t = S + outer(kn, beta_t * (v_t - kn @ S))            (delta rule)
    o_t = qn @ S_t

Layouts: q, k bf16 [B, T, Hk, K]; v bf16 [B, T, Hv, V]; g fp32 [B, T, Hv]; beta bf16 [B, T, Hv]
(already sigmoid-ed); initial_state bf16 [B, Hv, K, V] (vLLM's default state dtype for a bf16
model). Outputs: o bf16 [B, T, Hv, V] and final_state bf16 [B, Hv, K, V], each rounded once; the
state stays fp32 between tokens. `reference` runs the exact recurrence above token by token;
`eager` is the chunked WY form (chunk 64, as in the HF `torch_chunk_gated_delta_rule`), which
agrees within the comparison tolerance. Full size: Qwen3-Next-80B-A3B heads (16 key, 32 value,
dim 128), 2 sequences of 4096 tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import delta_rule_chunked, delta_rule_recurrence, l2norm

BATCH = {"full": 2, "smoke": 1}
SEQ = {"full": 4096, "smoke": 150}
HK = {"full": 16, "smoke": 1}
HV = {"full": 32, "smoke": 2}
DK = {"full": 128, "smoke": 16}
DV = {"full": 128, "smoke": 16}
CHUNK = 64
L2_EPS = 1e-6

_f = "full"
_B, _T, _Hv, _K, _V = BATCH[_f], SEQ[_f], HV[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=62,
    name="chunk_gated_delta_rule_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32"),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct",
    source_config="linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, "
    "linear_value_head_dim=128; q/k l2norm eps 1e-6 in kernel, scale 1/sqrt(128); chunk 64; bf16 state in memory "
    "(mamba_ssm_cache_dtype auto), fp32 in compute",
    inputs=("q", "k", "v", "g", "beta", "initial_state"),
    outputs=(Output("o"), Output("final_state")),
    # chunked form per (token, value head): k k^T and q k^T (2*2*C*K), T@u and T@w, attn@v_new
    # (2*(C*V + C*K + C*V)), and four K x V products with the state (4*2*K*V)
    flops=float(_B * _T * _Hv * (4 * CHUNK * _K + 2 * CHUNK * (2 * _V + _K) + 8 * _K * _V)),
    bytes=float(_B * _T * (2 * HK[_f] * _K + _Hv * _V) * 2 + _B * _T * _Hv * (4 + 2) + _B * _T * _Hv * _V * 2
                + 2 * _B * _Hv * _K * _V * 2),
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/62_chunk_gated_delta_rule_qwen3next_bf16.json',
        matches=('in_place', 'dtypes', 'structure_per_draw'),
        differs=(
            ('computation', 'upstream: head-major q, k [B, 4, T, 128], v [B, 16, T, 128], log-decay g and beta per (b, head, t), scale as an input, no initial state; mkb: sequence-major layouts, an initial state and q/k L2 normalisation in the kernel (FLA use_qk_l2norm_in_kernel) - not yet converted (issue #15 follow-up)'),
            ('outputs', 'upstream returns the output only; mkb also returns the final state - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: batch 16 x 256 tokens, 4 key / 16 value heads of 128, chunk 64; mkb: 2 x 4096 tokens, 16 / 32 heads (Qwen3-Next-80B-A3B) - not yet converted (issue #15 follow-up)'),
            ('distributions', 'upstream: q, k, v N(0, 1) bf16, g U(-0.05, 0), beta sigmoid(N(0, 1)); mkb: gates from A_log / softplus as the model computes them - not yet converted (issue #15 follow-up)'),
            ("exactness", "both compare within a tolerance; mkb's is anchored to fp64 (3 x the reference's own error "
             "vs the fp64 anchor, at least eps(dtype) x max|anchor|) instead of a fixed atol/rtol"),
        ),
    ),
    notes="The reference is the token-by-token recurrence (slow at full size; the fp64 anchor is its "
    "float64 run); eager is the chunked form. Gate values follow Qwen3-Next: g = -exp(A_log) * "
    "softplus(a + dt_bias) with A ~ U(1, 16). The state is bf16 in memory so that a chunked kernel "
    "(different fp32 rounding from the recurrence) is judged at the state's storage precision.",
)


def _prep(q, k, v, g, beta, initial_state):
    ct = torch.promote_types(torch.promote_types(q.dtype, torch.float32), initial_state.dtype)
    rep = v.shape[2] // q.shape[2]
    qn = l2norm(q.to(ct), L2_EPS).repeat_interleave(rep, dim=2) * q.shape[-1] ** -0.5
    kn = l2norm(k.to(ct), L2_EPS).repeat_interleave(rep, dim=2)
    return ct, qn, kn, v.to(ct), g.to(ct), beta.to(ct), initial_state.to(ct)


def reference(q, k, v, g, beta, initial_state):
    ct, qn, kn, vv, gg, bb, S = _prep(q, k, v, g, beta, initial_state)
    o, S = delta_rule_recurrence(qn, kn, vv, gg, bb, S)
    return o.to(q.dtype), S.to(initial_state.dtype)


def eager(q, k, v, g, beta, initial_state):
    ct, qn, kn, vv, gg, bb, S = _prep(q, k, v, g, beta, initial_state)
    o, S = delta_rule_chunked(qn, kn, vv, gg, bb, S, chunk=CHUNK)
    return o.to(q.dtype), S.to(initial_state.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, hk, hv, dk, dv = BATCH[size], SEQ[size], HK[size], HV[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, T, hk, dk).to(bf), rn(B, T, hk, dk).to(bf), rn(B, T, hv, dv).to(bf)
    A = 1.0 + 15.0 * torch.rand(hv, generator=gen, device=device)
    dt_bias = 0.5 * rn(hv)
    g = -A * F.softplus(rn(B, T, hv) - 4.0 + dt_bias)  # mostly slow decay, some fast-forgetting steps
    beta = torch.sigmoid(rn(B, T, hv)).to(bf)
    initial_state = (0.5 * rn(B, hv, dk, dv)).to(bf)
    return q, k, v, g, beta, initial_state
