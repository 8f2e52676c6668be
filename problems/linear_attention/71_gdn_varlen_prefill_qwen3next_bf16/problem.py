"""Gated DeltaNet varlen prefill of Qwen3-Next: packed sequences, fused gating, state pool in place.

The prefill path of a Qwen3-Next linear-attention layer over a packed batch of N sequences
(`cu_seqlens`), with the gate computation, q/k L2 normalisation and GQA head expansion fused in,
initial states read from a state pool and final states written back to it. Per sequence n and
value head h (key head h // (Hv // Hk)), in fp32 (the promoted dtype):

    S_0 = ssm_state[state_indices[n], h] if has_initial_state[n] else 0          ([K, V])
    for each token t of the sequence, in order:
        g    = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h]) ;  beta = sigmoid(b[t, h])
        qn   = q_t / sqrt(sum(q_t**2) + 1e-6) * K**-0.5 ;  kn = k_t / sqrt(sum(k_t**2) + 1e-6)
        S    = S * exp(g) ;  S = S + outer(kn, beta * (v_t - kn @ S)) ;  o_t = qn @ S
    ssm_state[state_indices[n], h] = S                                          (in place)

Layouts: q, k bf16 [N_tok, Hk, K]; v bf16 [N_tok, Hv, V]; a, b bf16 [N_tok, Hv]; A_log, dt_bias fp32
[Hv]; ssm_state bf16 [slots, Hv, K, V] (vLLM's default state dtype for a bf16 model); state_indices
int32 [N]; has_initial_state bool [N]; cu_seqlens int32 [N + 1]. Outputs: o bf16 [N_tok, Hv, V] and
the pool (META.mutates, also returned); slots not named by state_indices are unchanged. `reference`
runs the exact recurrence; `eager` the chunked WY form (chunk 64) on the zero-padded batch. Full
size: Qwen3-Next-80B-A3B heads (16 key, 32 value, dim 128), 8 sequences of 256-4096 tokens, half
of them continuing from a cached state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.linear import delta_rule_chunked, delta_rule_recurrence, l2norm
from mkb.problems.paged import cu_seqlens, draw_lengths, structure_rng

SEQS = {"full": 8, "smoke": 3}
LENS = {"full": (256, 4096), "smoke": (20, 150)}
SLOTS = {"full": 32, "smoke": 6}
HK = {"full": 16, "smoke": 1}
HV = {"full": 32, "smoke": 2}
DK = {"full": 128, "smoke": 16}
DV = {"full": 128, "smoke": 16}
CHUNK = 64
L2_EPS = 1e-6


def _structure(size: str):
    rng = structure_rng(71, size)
    lens = draw_lengths(rng, SEQS[size], *LENS[size])
    idx = rng.permutation(SLOTS[size])[: SEQS[size]]
    has = [i % 2 == 1 for i in range(SEQS[size])]
    return lens, [int(i) for i in idx], has


_LENS, _, _ = _structure("full")
_N, _Hv, _K, _V, _Hk = sum(_LENS), HV["full"], DK["full"], DV["full"], HK["full"]

META = ProblemMeta(
    number=71,
    name="gdn_varlen_prefill_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32", "int32", "bool"),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct",
    source_config="linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, "
    "linear_value_head_dim=128; g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), q/k l2norm "
    "eps 1e-6, scale 1/sqrt(128); bf16 state pool (mamba_ssm_cache_dtype auto), fp32 compute",
    inputs=(
        "q", "k", "v", "a", "b", "A_log", "dt_bias", "ssm_state", "state_indices", "has_initial_state", "cu_seqlens",
    ),
    outputs=(Output("o"), Output("ssm_state")),
    flops=float(_N * _Hv * (4 * CHUNK * _K + 2 * CHUNK * (2 * _V + _K) + 8 * _K * _V)),
    bytes=float(_N * (2 * _Hk * _K + 2 * _Hv * _V + 2 * _Hv) * 2 + 2 * len(_LENS) * _Hv * _K * _V * 2),
    peak="bf16_tc",
    mutates=("ssm_state",),
    structure_inputs=("state_indices", "has_initial_state", "cu_seqlens"),
    notes=f"Full: {len(_LENS)} sequences, {_N} tokens (lengths {_LENS}). The reference is the "
    "token-by-token recurrence; eager pads to the longest sequence and runs the chunked form. "
    "The pool is also returned.",
)


def _padded(q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices, has_initial_state, cu_seqlens):
    """Gates, normalised q/k and initial states on a zero-padded [N, Lmax] batch (padding is inert)."""
    ct = torch.promote_types(q.dtype, torch.float32)
    dev = q.device
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    n, lmax = lens.shape[0], int(lens.max())
    t = torch.arange(lmax, device=dev)
    valid = t[None, :] < lens[:, None]  # [N, Lmax]
    src = torch.where(valid, cu[:-1, None] + t[None, :], torch.zeros_like(valid, dtype=torch.long))
    rep = v.shape[1] // q.shape[1]
    qn = l2norm(q.to(ct), L2_EPS).repeat_interleave(rep, dim=1) * q.shape[-1] ** -0.5
    kn = l2norm(k.to(ct), L2_EPS).repeat_interleave(rep, dim=1)
    g = -torch.exp(A_log.to(ct)) * F.softplus(a.to(ct) + dt_bias.to(ct))
    beta = torch.sigmoid(b.to(ct))
    m3 = valid[..., None].to(ct)
    m4 = m3[..., None]
    qp, kp, vp = qn[src] * m4, kn[src] * m4, v.to(ct)[src] * m4
    gp, bp = g[src] * m3, beta[src] * m3
    idx = state_indices.long()
    S = ssm_state[idx].to(ct) * has_initial_state.to(ct)[:, None, None, None]
    return qp, kp, vp, gp, bp, S, valid, idx


def _finish(o, S, valid, idx, q, ssm_state):
    ssm_state[idx] = S.to(ssm_state.dtype)
    return o[valid].to(q.dtype), ssm_state


def reference(q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices, has_initial_state, cu_seqlens):
    args = (q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices, has_initial_state, cu_seqlens)
    qp, kp, vp, gp, bp, S, valid, idx = _padded(*args)
    o, S = delta_rule_recurrence(qp, kp, vp, gp, bp, S)
    return _finish(o, S, valid, idx, q, ssm_state)


def eager(q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices, has_initial_state, cu_seqlens):
    args = (q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices, has_initial_state, cu_seqlens)
    qp, kp, vp, gp, bp, S, valid, idx = _padded(*args)
    o, S = delta_rule_chunked(qp, kp, vp, gp, bp, S, chunk=CHUNK)
    return _finish(o, S, valid, idx, q, ssm_state)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    lens, idx, has = _structure(size)
    n = sum(lens)
    hk, hv, dk, dv = HK[size], HV[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(n, hk, dk).to(bf), rn(n, hk, dk).to(bf), rn(n, hv, dv).to(bf)
    a = (rn(n, hv) - 3.0).to(bf)  # mostly slow decay, some fast-forgetting steps
    b = rn(n, hv).to(bf)
    A_log = torch.log(1.0 + 15.0 * torch.rand(hv, generator=gen, device=device))
    dt_bias = 0.5 * rn(hv)
    ssm_state = (0.5 * rn(SLOTS[size], hv, dk, dv)).to(bf)
    return (
        q, k, v, a, b, A_log, dt_bias, ssm_state,
        torch.tensor(idx, dtype=torch.int32, device=device),
        torch.tensor(has, dtype=torch.bool, device=device),
        torch.tensor(cu_seqlens(lens), dtype=torch.int32, device=device),
    )
