"""Gated DeltaNet multi-token (MTP) speculative verification of Qwen3-Next 80B-A3B at TP=2, over a pooled state.

Upstream MetaKernelBench's problem 73 (FlashInfer-Trace definition gdn_mtp_qk8_v16_d128_k_last): each
request verifies T draft tokens starting from its recurrent state, read from a pool of states in
"k-last" layout ([V, K] per head). Per request i and value head h (query/key head h // (Hv // Hq)),
in fp32 (the promoted dtype):

    S = initial_state[initial_state_indices[i], h]^T                      # [K, V]
    for t = 0..T-1:
        decay = exp(-exp(A_log[h]) * softplus(a[i, t, h] + dt_bias[h])) ;  beta = sigmoid(b[i, t, h])
        S = S * decay ;  S = S + outer(k, beta * (v - k @ S))              # q and k are not normalised
        o[i, t, h] = scale * (q @ S)                                       # rounded to bf16

Inputs: q, k bf16 [B, T, Hq, K]; v bf16 [B, T, Hv, V]; initial_state fp32 [P, Hv, V, K];
initial_state_indices int32 [B] (distinct pool slots, redrawn per draw); A_log, dt_bias fp32 [Hv];
a, b bf16 [B, T, Hv]; scale float. Output: o bf16 [B, T, Hv, V]. The pool is read only.
Full size: the captured workload (B = 32, T = 4, a pool of 49; 8 query/key heads, 16 value heads, dim 128).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream

BATCH = {"full": 32, "smoke": 3}
TOKENS = {"full": 4, "smoke": 3}
POOL = {"full": 49, "smoke": 7}
HK = {"full": 8, "smoke": 2}
HV = {"full": 16, "smoke": 4}
DK = {"full": 128, "smoke": 16}
SCALE = 1.0 / math.sqrt(128)
# captured per-head A_log and dt_bias of the layer (upstream's workload record); assigned to heads per draw
A_LOG = (-1.046875, -0.5234375, -1.828125, -1.15625, -0.0244140625, 0.28515625, -1.9921875, -2.0, 0.11962890625,
         0.3671875, -1.59375, -1.34375, 0.333984375, -1.640625, -0.5234375, -0.2890625)
DT_BIAS = (-5.25, -5.75, -2.015625, -3.3125, -6.25, -6.65625, -0.88671875, -0.6328125, -4.8125, -5.28125, -1.7578125,
           -3.484375, 2.3125, -6.40625, -6.34375, -6.75)
A_MEAN, A_STD, B_MEAN, B_STD = 0.82, 2.24, 0.45, 2.02
Q_STD, K_STD, V_STD, STATE_STD = 0.63, 0.26, 0.13, 0.0215

_f = "full"
_B, _T, _Hv, _K = BATCH[_f], TOKENS[_f], HV[_f], DK[_f]

META = ProblemMeta(
    number=73,
    name="gdn_mtp_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32", "int32"),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct (TP 2) with MTP speculative decoding",
    source_config="linear_num_key_heads=16, linear_num_value_heads=32 (8 / 16 per TP-2 rank), head dims 128; "
    "decay = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), scale 1/sqrt(128); fp32 pooled states, "
    "k-last; FlashInfer-Trace gdn_mtp_qk8_v16_d128_k_last",
    inputs=("q", "k", "v", "initial_state", "initial_state_indices", "A_log", "a", "dt_bias", "b", "scale"),
    outputs=(Output("o"),),
    flops=7.0 * _B * _T * _Hv * _K * _K,
    bytes=float(_B * _Hv * _K * _K * 4 + _B * _T * (2 * HK[_f] * _K + 2 * _Hv * _K + 2 * _Hv) * 2 + _B * 4),
    peak="memory",
    structure_inputs=("initial_state_indices",),
    upstream=Upstream(
        source="shipped",
        path="problems/linear_attention/73_gdn_mtp_qwen3next_bf16.py",
        matches=("computation", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("outputs", "upstream also returns final_state, which is initial_state.clone() (the pool unchanged): an "
             "output equal to a copy of an input is what mkb's audit rejects (a kernel would pass it with one "
             "memcpy, and its 51 MB copy would dominate the timing while measuring nothing). Here the pool is an "
             "input only, and like every input that is not mutated it must come back unchanged."),
            ("distributions", "A_log and dt_bias hold upstream's captured per-head values, but which head gets which "
             "(A_log, dt_bias) pair is permuted per draw (upstream: one fixed assignment): every input that is not "
             "index structure changes with the seed, so a kernel cannot bake them in. Other inputs as upstream."),
        ),
    ),
    notes="Only the B selected states are read (bytes counts those). Smoke: 3 requests x 3 tokens, a pool of 7, "
    "2 query/key heads, 4 value heads, head dim 16.",
)


def reference(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale):
    ct = torch.promote_types(torch.promote_types(q.dtype, torch.float32), initial_state.dtype)
    rep = v.shape[2] // q.shape[2]
    decay = torch.exp(-torch.exp(A_log.to(ct)) * F.softplus(a.to(ct) + dt_bias.to(ct)))  # [B, T, Hv]
    beta = torch.sigmoid(b.to(ct))
    qh = q.to(ct).repeat_interleave(rep, dim=2)
    kh = k.to(ct).repeat_interleave(rep, dim=2)
    vv = v.to(ct)
    S = initial_state[initial_state_indices.long()].to(ct).transpose(-1, -2)  # [B, Hv, K, V]
    out = []
    for t in range(q.shape[1]):
        S = S * decay[:, t, :, None, None]
        kt = kh[:, t]
        kv = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + kt[..., :, None] * ((vv[:, t] - kv) * beta[:, t, :, None])[..., None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", qh[:, t], S))
    return torch.stack(out, dim=1).to(q.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, P, hk, hv, d = BATCH[size], TOKENS[size], POOL[size], HK[size], HV[size], DK[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    bf = torch.bfloat16
    q = Q_STD * rn(B, T, hk, d).to(bf)  # upstream scales a bf16 draw in bf16
    k = K_STD * rn(B, T, hk, d).to(bf)
    v = V_STD * rn(B, T, hv, d).to(bf)
    initial_state = STATE_STD * rn(P, hv, d, d)
    indices = torch.randperm(P, generator=g, device=device)[:B].to(torch.int32)
    perm = torch.randperm(len(A_LOG), generator=g, device=device)[:hv]
    A_log = torch.tensor(A_LOG, device=device)[perm]
    dt_bias = torch.tensor(DT_BIAS, device=device)[perm]
    a = (A_MEAN + A_STD * rn(B, T, hv)).to(bf)
    b = (B_MEAN + B_STD * rn(B, T, hv)).to(bf)
    return q, k, v, initial_state, indices, A_log, a, dt_bias, b, SCALE
