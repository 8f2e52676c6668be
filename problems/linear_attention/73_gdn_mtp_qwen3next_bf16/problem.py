"""Gated DeltaNet speculative-decode (MTP) verify step of Qwen3-Next: several tokens per request,
every intermediate state written to its own pool slot, bf16 activations, fp32 states.

With multi-token prediction, each request verifies T = 1 + num_speculative_tokens tokens at once;
since any draft may be rejected, the linear-attention state after every token is kept (vLLM's
spec-decode path of `fused_recurrent_gated_delta_rule` with per-token state indices). Per request i
and value head h (key head h // (Hv // Hk)), in fp32 (the promoted dtype):

    S = ssm_state[state_indices[i, 0], h]                                   ([K, V])
    for t = 0..T-1:
        g    = -exp(A_log[h]) * softplus(a[i, t, h] + dt_bias[h]) ;  beta = sigmoid(b[i, t, h])
        qn   = q / sqrt(sum(q**2) + 1e-6) * K**-0.5 ;  kn = k / sqrt(sum(k**2) + 1e-6)
        S    = S * exp(g) ;  S = S + outer(kn, beta * (v - kn @ S))
        o[i, t, h] = qn @ S                       (rounded to bf16)
        ssm_state[state_indices[i, t], h] = S     (in place, fp32; slot [i, 0] is overwritten after it is read)

Layouts: q, k bf16 [B, T, Hk, K]; v bf16 [B, T, Hv, V]; a, b bf16 [B, T, Hv]; A_log, dt_bias fp32
[Hv]; ssm_state fp32 [slots, Hv, K, V]; state_indices int32 [B, T] (distinct slots). Outputs: o bf16
[B, T, Hv, V] and the pool (META.mutates, also returned). Full size: Qwen3-Next-80B-A3B heads (16 key,
32 value, dim 128), 32 requests x 4 tokens (3 MTP drafts), a pool of 160 slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta

BATCH = {"full": 32, "smoke": 3}
TOKENS = {"full": 4, "smoke": 3}
SLOTS = {"full": 160, "smoke": 12}
HK = {"full": 16, "smoke": 2}
HV = {"full": 32, "smoke": 4}
DK = {"full": 128, "smoke": 16}
DV = {"full": 128, "smoke": 16}
L2_EPS = 1e-6
_STRUCT_SEED = 73_000

_f = "full"
_B, _T, _Hv, _K, _V = BATCH[_f], TOKENS[_f], HV[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=73,
    name="gdn_mtp_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32", "int32"),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct with MTP speculative decoding (num_speculative_tokens=3)",
    source_config="linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, "
    "linear_value_head_dim=128; g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), "
    "q/k l2norm eps 1e-6, scale 1/sqrt(128); fp32 states, one slot per verified token",
    inputs=("q", "k", "v", "a", "b", "A_log", "dt_bias", "ssm_state", "state_indices"),
    outputs=(Output("o"), Output("ssm_state")),
    flops=7.0 * _B * _T * _Hv * _K * _V,
    bytes=float(_B * (1 + _T) * _Hv * _K * _V * 4 + _B * _T * (2 * HK[_f] * _K + 2 * _Hv * _V + 2 * _Hv) * 2),
    peak="memory",
    mutates=("ssm_state",),
    structure_inputs=("state_indices",),
    notes="The state is read once and written T times per request (the minimum traffic above). "
    "The pool is also returned.",
)


def _l2norm(x):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def reference(q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices):
    ct = torch.promote_types(torch.promote_types(q.dtype, torch.float32), ssm_state.dtype)
    rep = v.shape[2] // q.shape[2]
    g = -torch.exp(A_log.to(ct)) * F.softplus(a.to(ct) + dt_bias.to(ct))  # [B, T, Hv]
    beta = torch.sigmoid(b.to(ct))
    qn = _l2norm(q.to(ct)).repeat_interleave(rep, dim=2) * q.shape[-1] ** -0.5
    kn = _l2norm(k.to(ct)).repeat_interleave(rep, dim=2)
    vv = v.to(ct)
    idx = state_indices.long().t().contiguous()  # [T, B]; contiguous rows index fast on the CPU
    S = ssm_state[idx[0]].to(ct)
    out = []
    for t in range(q.shape[1]):
        S = S * torch.exp(g[:, t])[..., None, None]
        kt = kn[:, t]
        kv = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + kt[..., :, None] * ((vv[:, t] - kv) * beta[:, t, :, None])[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", qn[:, t], S))
        ssm_state[idx[t]] = S.to(ssm_state.dtype)
    return torch.stack(out, dim=1).to(q.dtype), ssm_state


def _indices(size: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(_STRUCT_SEED)
    n = BATCH[size] * TOKENS[size]
    return torch.randperm(SLOTS[size], generator=g)[:n].view(BATCH[size], TOKENS[size]).to(torch.int32)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, S, hk, hv, dk, dv = BATCH[size], TOKENS[size], SLOTS[size], HK[size], HV[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    bf = torch.bfloat16
    q, k, v = rn(B, T, hk, dk).to(bf), rn(B, T, hk, dk).to(bf), rn(B, T, hv, dv).to(bf)
    a, b = rn(B, T, hv).to(bf), rn(B, T, hv).to(bf)
    A_log = torch.log(1.0 + 15.0 * torch.rand(hv, generator=gen, device=device))
    dt_bias = 0.5 * rn(hv)
    ssm_state = 0.5 * rn(S, hv, dk, dv)
    return q, k, v, a, b, A_log, dt_bias, ssm_state, _indices(size).to(device)
