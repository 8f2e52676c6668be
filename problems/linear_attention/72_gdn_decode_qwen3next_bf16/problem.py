"""Gated DeltaNet decode step of Qwen3-Next 80B-A3B at TP=2 (one token per request), bf16 activations, fp32 state.

Upstream MetaKernelBench's problem 72 (FlashInfer-Trace definition gdn_decode_qk8_v16_d128_k_last):
one decode step of a Qwen3-Next linear-attention layer for B requests, with the gate computation and
the GQA head expansion fused in. The recurrent state is passed per request in "k-last" layout
([V, K] per head) and the updated state is returned as a new tensor (no input is modified).

    inputs  q bf16 [B, 1, Hq, K]   k bf16 [B, 1, Hk, K]   v bf16 [B, 1, Hv, V]
            state fp32 [B, Hv, V, K]   A_log fp32 [Hv]   a bf16 [B, 1, Hv]   dt_bias fp32 [Hv]
            b bf16 [B, 1, Hv]   scale float (1/sqrt(128))
    per request i and value head h (query/key head h // (Hv // Hq)), in fp32 (the promoted dtype):
        decay = exp(-exp(A_log[h]) * softplus(a[i, 0, h] + dt_bias[h]))
        beta  = sigmoid(b[i, 0, h])
        S     = state[i, h]^T * decay                       # [K, V]
        S     = S + outer(k, beta * (v - k @ S))            # delta rule (q and k are not normalised)
        o[i, 0, h] = scale * (q @ S)                        # [V], rounded to bf16
        new_state[i, h] = S^T                               # fp32, [V, K]

Outputs: o bf16 [B, 1, Hv, V] and new_state fp32 [B, Hv, V, K].
Full size: the captured workload (B = 64; Qwen3-Next-80B-A3B's 16 key / 32 value heads split over TP 2:
8 query/key heads, 16 value heads, head dim 128).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream

BATCH = {"full": 64, "smoke": 3}
HK = {"full": 8, "smoke": 2}
HV = {"full": 16, "smoke": 4}
DK = {"full": 128, "smoke": 16}
SCALE = 1.0 / math.sqrt(128)  # the model's 1/sqrt(head_dim), an input as upstream passes it
# captured per-head A_log and dt_bias of the layer (upstream's workload record); assigned to heads per draw
A_LOG = (-0.169921875, 2.34375, 1.3359375, 2.1875, -0.9375, -1.09375, 1.765625, -0.443359375, 0.91015625, -0.8125,
         2.328125, 0.205078125, 1.375, 2.796875, -0.88671875, -1.3046875)
DT_BIAS = (-2.078125, -5.625, -4.3125, -3.421875, -3.796875, -3.296875, -4.375, -6.25, -3.703125, -0.2890625,
           -5.21875, -6.1875, -3.046875, -5.0625, -4.875, -5.34375)
# capture-measured scales of the other inputs (upstream's workload record)
A_MEAN, A_STD, B_MEAN, B_STD = 1.33, 1.56, 0.4, 1.38
Q_STD, K_STD, V_STD, STATE_STD = 0.18, 0.13, 0.073, 0.009

_f = "full"
_B, _Hv, _K = BATCH[_f], HV[_f], DK[_f]

META = ProblemMeta(
    number=72,
    name="gdn_decode_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32"),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct (TP 2)",
    source_config="linear_num_key_heads=16, linear_num_value_heads=32 (8 / 16 per TP-2 rank), "
    "linear_key_head_dim=128, linear_value_head_dim=128; decay = exp(-exp(A_log) * softplus(a + dt_bias)), "
    "beta = sigmoid(b), scale = 1/sqrt(128); fp32 state, k-last layout; FlashInfer-Trace gdn_decode_qk8_v16_d128_k_last",
    inputs=("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale"),
    outputs=(Output("o"), Output("new_state")),
    flops=7.0 * _B * _Hv * _K * _K,  # decay, k@S, rank-1 update, q@S
    bytes=2.0 * _B * _Hv * _K * _K * 4 + _B * (2 * HK[_f] * _K + 2 * _Hv * _K + 2 * _Hv) * 2 + 2 * _Hv * 4,
    peak="memory",
    upstream=Upstream(
        source="shipped",
        path="problems/linear_attention/72_gdn_decode_qwen3next_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("distributions", "A_log and dt_bias hold upstream's captured per-head values, but which head gets which "
             "(A_log, dt_bias) pair is permuted per draw (upstream: one fixed assignment): every input that is not "
             "index structure changes with the seed, so a kernel cannot bake them in. Other inputs as upstream."),
        ),
    ),
    notes="The state (64 MiB in, 64 MiB out) dominates traffic. Smoke: 3 requests, 2 query/key heads, "
    "4 value heads, head dim 16 (the first 4 captured head parameters, permuted).",
)


def reference(q, k, v, state, A_log, a, dt_bias, b, scale):
    ct = torch.promote_types(torch.promote_types(q.dtype, torch.float32), state.dtype)
    hv, hq = v.shape[2], q.shape[2]
    rep = hv // hq
    decay = torch.exp(-torch.exp(A_log.to(ct)) * F.softplus(a[:, 0].to(ct) + dt_bias.to(ct)))  # [B, Hv]
    beta = torch.sigmoid(b[:, 0].to(ct))
    qh = q[:, 0].to(ct).repeat_interleave(rep, dim=1)  # [B, Hv, K]
    kh = k[:, 0].to(ct).repeat_interleave(rep, dim=1)
    S = state.to(ct).transpose(-1, -2) * decay[..., None, None]  # [B, Hv, K, V]
    kv_mem = torch.einsum("bhk,bhkv->bhv", kh, S)
    delta = (v[:, 0].to(ct) - kv_mem) * beta[..., None]
    S = S + kh[..., :, None] * delta[..., None, :]
    o = scale * torch.einsum("bhk,bhkv->bhv", qh, S)
    return o.unsqueeze(1).to(q.dtype), S.transpose(-1, -2).contiguous().to(state.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, hk, hv, d = BATCH[size], HK[size], HV[size], DK[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    bf = torch.bfloat16
    q = Q_STD * rn(B, 1, hk, d).to(bf)  # upstream scales a bf16 draw in bf16
    k = K_STD * rn(B, 1, hk, d).to(bf)
    v = V_STD * rn(B, 1, hv, d).to(bf)
    state = STATE_STD * rn(B, hv, d, d)
    perm = torch.randperm(len(A_LOG), generator=g, device=device)[:hv]
    A_log = torch.tensor(A_LOG, device=device)[perm]
    dt_bias = torch.tensor(DT_BIAS, device=device)[perm]
    a = (A_MEAN + A_STD * rn(B, 1, hv)).to(bf)
    b = (B_MEAN + B_STD * rn(B, 1, hv)).to(bf)
    return q, k, v, state, A_log, a, dt_bias, b, SCALE
