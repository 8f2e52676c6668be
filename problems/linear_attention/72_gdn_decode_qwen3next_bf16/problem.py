"""Gated DeltaNet decode step of Qwen3-Next (one token per request, state pool in place), bf16.

One decode step of a Qwen3-Next linear-attention layer (Gated DeltaNet) for B requests, with the
gate computation, the q/k L2 normalisation and the GQA head expansion fused in, and the recurrent
state read from and written back to a state pool (as in SGLang/vLLM `fused_sigmoid_gating_delta_rule_update`):

    inputs  q, k  bf16 [B, Hk, K]     v bf16 [B, Hv, V]      a, b bf16 [B, Hv]
            A_log, dt_bias fp32 [Hv]  ssm_state fp32 [slots, Hv, K, V]  state_indices int32 [B]
    per request i and value head h (key head h // (Hv // Hk)), in fp32 (the promoted dtype):
        g    = -exp(A_log[h]) * softplus(a[i, h] + dt_bias[h])
        beta = sigmoid(b[i, h])
        qn   = q / sqrt(sum(q**2) + 1e-6) * K**-0.5 ;  kn = k / sqrt(sum(k**2) + 1e-6)
        S    = ssm_state[state_indices[i], h] * exp(g)          # [K, V]
        S    = S + outer(kn, beta * (v - kn @ S))               # delta rule
        o[i, h] = qn @ S                                        # [V], rounded to bf16
        ssm_state[state_indices[i], h] = S                      # in place (fp32)

Outputs: o bf16 [B, Hv, V] and the updated pool (META.mutates; returned as well). Slots not named by
state_indices are unchanged. Full size: Qwen3-Next-80B-A3B (16 key heads, 32 value heads, head dim
128), 128 requests in a pool of 384 slots with a fixed non-identity index map.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta

BATCH = {"full": 128, "smoke": 3}
SLOTS = {"full": 384, "smoke": 8}
HK = {"full": 16, "smoke": 2}
HV = {"full": 32, "smoke": 4}
DK = {"full": 128, "smoke": 16}
DV = {"full": 128, "smoke": 16}
L2_EPS = 1e-6
_STRUCT_SEED = 72_000

_f = "full"
_B, _Hv, _K, _V = BATCH[_f], HV[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=72,
    name="gdn_decode_qwen3next_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32", "int32"),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct",
    source_config="linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, "
    "linear_value_head_dim=128; g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), "
    "q/k l2norm eps 1e-6, scale = 1/sqrt(128); fp32 recurrent state",
    inputs=("q", "k", "v", "a", "b", "A_log", "dt_bias", "ssm_state", "state_indices"),
    outputs=(Output("o"), Output("ssm_state")),
    flops=7.0 * _B * _Hv * _K * _V,  # decay, k@S, rank-1 update, q@S
    bytes=2.0 * _B * _Hv * _K * _V * 4 + _B * (2 * HK[_f] * _K + 2 * _Hv * _V + 2 * _Hv) * 2 + _B * 4,
    peak="memory",
    mutates=("ssm_state",),
    structure_inputs=("state_indices",),
    notes="Decode batch 128 of a pool of 384 fp32 states (768 MiB); the state dominates traffic. "
    "The updated pool is also returned (same name as the input).",
)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def reference(q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices):
    ct = torch.promote_types(torch.promote_types(q.dtype, torch.float32), ssm_state.dtype)
    hv, hk, dk = v.shape[1], q.shape[1], q.shape[2]
    rep = hv // hk
    g = -torch.exp(A_log.to(ct)) * F.softplus(a.to(ct) + dt_bias.to(ct))  # [B, Hv]
    beta = torch.sigmoid(b.to(ct))
    qn = _l2norm(q.to(ct)).repeat_interleave(rep, dim=1) * dk**-0.5  # [B, Hv, K]
    kn = _l2norm(k.to(ct)).repeat_interleave(rep, dim=1)
    idx = state_indices.long()
    S = ssm_state[idx].to(ct) * torch.exp(g)[..., None, None]  # [B, Hv, K, V]
    kv_mem = torch.einsum("bhk,bhkv->bhv", kn, S)
    delta = (v.to(ct) - kv_mem) * beta[..., None]
    S = S + kn[..., :, None] * delta[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", qn, S)
    ssm_state[idx] = S.to(ssm_state.dtype)
    return o.to(q.dtype), ssm_state


def _indices(size: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(_STRUCT_SEED)
    return torch.randperm(SLOTS[size], generator=g)[: BATCH[size]].to(torch.int32)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, S, hk, hv, dk, dv = BATCH[size], SLOTS[size], HK[size], HV[size], DK[size], DV[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    bf = torch.bfloat16
    q = rn(B, hk, dk).to(bf)
    k = rn(B, hk, dk).to(bf)
    v = rn(B, hv, dv).to(bf)
    a = rn(B, hv).to(bf)
    b = rn(B, hv).to(bf)
    A_log = torch.log(1.0 + 15.0 * torch.rand(hv, generator=g, device=device))  # A ~ U(1, 16) as in the init
    dt_bias = 0.5 * rn(hv)
    ssm_state = 0.5 * rn(S, hv, dk, dv)  # a state with the magnitude it reaches after a long context
    return q, k, v, a, b, A_log, dt_bias, ssm_state, _indices(size).to(device)
