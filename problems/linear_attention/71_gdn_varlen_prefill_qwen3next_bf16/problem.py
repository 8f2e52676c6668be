"""Gated DeltaNet varlen prefill of Qwen3-Next 80B-A3B at TP=2: packed ragged sequences, per-sequence states, bf16.

Upstream MetaKernelBench's problem 71 (FlashInfer-Trace definition gdn_prefill_qk8_v16_d128_k_last):
the prefill path of a Qwen3-Next linear-attention layer over a packed batch of N sequences
(`cu_seqlens`), with the gate computation and the GQA head expansion fused in. Each sequence starts
from its own state (k-last layout, [V, K] per head) and its final state is returned. q and k arrive
already L2-normalised (the layer normalises them before this subgraph); the reference does not
normalise them again. Per sequence n and value head h (query/key head h // (Hv // Hq)), in fp32:

    S = state[n, h]^T                                                           ([K, V])
    for each token t of the sequence, in order:
        decay = exp(-exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])) ;  beta = sigmoid(b[t, h])
        S = S * decay ;  S = S + outer(k_t, beta * (v_t - k_t @ S)) ;  o_t = scale * (q_t @ S)
    new_state[n, h] = S^T

Inputs: q, k bf16 [N_tok, Hq, K]; v bf16 [N_tok, Hv, V]; state fp32 [N, Hv, V, K]; A_log, dt_bias
fp32 [Hv]; a, b bf16 [N_tok, Hv]; cu_seqlens int64 [N + 1]; scale float. Outputs: o bf16
[N_tok, Hv, V] and new_state fp32 [N, Hv, V, K] (no input is modified). `reference` runs the exact
recurrence; `eager` the chunked WY form (chunk 64) on the zero-padded batch.
Full size: the captured workload (959 tokens in 4 sequences; 8 query/key heads, 16 value heads, dim 128).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import delta_rule_chunked, delta_rule_recurrence, l2normalize

TOKENS = {"full": 959, "smoke": 40}
SEQS = {"full": 4, "smoke": 4}
HK = {"full": 8, "smoke": 2}
HV = {"full": 16, "smoke": 4}
DK = {"full": 128, "smoke": 16}
CHUNK = 64
SCALE = 1.0 / math.sqrt(128)
# captured per-head A_log and dt_bias of the layer (upstream's workload record); assigned to heads per draw
A_LOG = (1.3984375, 1.203125, 2.203125, 0.1474609375, 1.46875, -0.6171875, 1.8125, -1.359375, 0.50390625, 1.03125,
         2.953125, 1.2890625, 1.3203125, 2.109375, 3.34375, 1.78125)
DT_BIAS = (-2.34375, -3.421875, -4.03125, -1.65625, -3.25, 2.046875, -5.625, -2.65625, -2.375, -2.984375, -2.328125,
           -4.09375, -4.25, -3.71875, -4.96875, -3.578125)
A_MEAN, A_STD, B_MEAN, B_STD, V_STD = -0.12, 1.26, 1.47, 2.01, 0.041

_N, _S, _Hv, _K, _Hk = TOKENS["full"], SEQS["full"], HV["full"], DK["full"], HK["full"]

META = ProblemMeta(
    number=71,
    name="gdn_varlen_prefill_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32", "int64"),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct (TP 2)",
    source_config="linear_num_key_heads=16, linear_num_value_heads=32 (8 / 16 per TP-2 rank), head dims 128; "
    "decay = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), scale 1/sqrt(128); fp32 states, k-last; "
    "FlashInfer-Trace gdn_prefill_qk8_v16_d128_k_last (959 tokens, 4 sequences)",
    inputs=("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens", "scale"),
    outputs=(Output("o"), Output("new_state")),
    flops=float(_N * _Hv * (4 * CHUNK * _K + 2 * CHUNK * 3 * _K + 8 * _K * _K)),
    bytes=float(_N * (2 * _Hk * _K + 2 * _Hv * _K + 2 * _Hv) * 2 + 2 * _S * _Hv * _K * _K * 4),
    peak="bf16_tc",
    structure_inputs=("cu_seqlens",),
    upstream=Upstream(
        source="shipped",
        path="problems/linear_attention/71_gdn_varlen_prefill_qwen3next_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "exactness"),
        differs=(
            ("distributions", "A_log and dt_bias hold upstream's captured per-head values, but which head gets which "
             "(A_log, dt_bias) pair is permuted per draw (upstream: one fixed assignment), so a kernel cannot bake "
             "them in. Other inputs as upstream (q, k L2-normalised N(0, 1), v 0.041 N(0, 1), state N(0, 1/128), "
             "a, b at the captured moments)."),
            ("structure_per_draw", "upstream keeps the captured sequence cuts (0, 19, 50, 940, 959) on every draw; "
             "mkb redraws the 3 inner cuts per draw (same 959 tokens, same 4 sequences, each >= 1 token), so a "
             "kernel cannot specialise on one set of lengths"),
        ),
    ),
    notes="The reference is the token-by-token recurrence; eager pads to the longest sequence and runs the chunked "
    "form. Smoke: 40 tokens in 4 sequences, 2 query/key heads, 4 value heads, head dim 16.",
)


def _padded(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    """Gates, expanded q/k and initial states on a zero-padded [N, Lmax] batch (padding is inert)."""
    ct = torch.promote_types(torch.promote_types(q.dtype, torch.float32), state.dtype)
    dev = q.device
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    lmax = int(lens.max())
    t = torch.arange(lmax, device=dev)
    valid = t[None, :] < lens[:, None]  # [N, Lmax]
    src = torch.where(valid, cu[:-1, None] + t[None, :], torch.zeros_like(valid, dtype=torch.long))
    rep = v.shape[1] // q.shape[1]
    qe = q.to(ct).repeat_interleave(rep, dim=1) * scale
    ke = k.to(ct).repeat_interleave(rep, dim=1)
    logdecay = -torch.exp(A_log.to(ct)) * F.softplus(a.to(ct) + dt_bias.to(ct))  # [N_tok, Hv]
    beta = torch.sigmoid(b.to(ct))
    m3 = valid[..., None].to(ct)
    m4 = m3[..., None]
    S = state.to(ct).transpose(-1, -2)  # [N, Hv, K, V]
    return qe[src] * m4, ke[src] * m4, v.to(ct)[src] * m4, logdecay[src] * m3, beta[src] * m3, S, valid


def _finish(o, S, valid, q, state):
    return o[valid].to(q.dtype), S.transpose(-1, -2).contiguous().to(state.dtype)


def reference(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    qp, kp, vp, gp, bp, S, valid = _padded(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
    o, S = delta_rule_recurrence(qp, kp, vp, gp, bp, S)
    return _finish(o, S, valid, q, state)


def eager(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    qp, kp, vp, gp, bp, S, valid = _padded(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
    o, S = delta_rule_chunked(qp, kp, vp, gp, bp, S, chunk=CHUNK)
    return _finish(o, S, valid, q, state)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    n, ns, hk, hv, d = TOKENS[size], SEQS[size], HK[size], HV[size], DK[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q = l2normalize(rn(n, hk, d)).to(bf)
    k = l2normalize(rn(n, hk, d)).to(bf)
    v = V_STD * rn(n, hv, d).to(bf)  # upstream scales a bf16 draw in bf16
    state = d**-0.5 * rn(ns, hv, d, d)
    perm = torch.randperm(len(A_LOG), generator=gen, device=device)[:hv]
    A_log = torch.tensor(A_LOG, device=device)[perm]
    dt_bias = torch.tensor(DT_BIAS, device=device)[perm]
    a = (A_MEAN + A_STD * rn(n, hv)).to(bf)
    b = (B_MEAN + B_STD * rn(n, hv)).to(bf)
    cuts = (torch.randperm(n - 1, generator=gen, device=device)[: ns - 1] + 1).sort().values
    zero, total = torch.zeros(1, dtype=torch.long, device=device), torch.full((1,), n, dtype=torch.long, device=device)
    cu_seqlens = torch.cat([zero, cuts.long(), total])
    return q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, SCALE
