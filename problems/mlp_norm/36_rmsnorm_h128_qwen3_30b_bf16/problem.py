"""Per-head q/k RMSNorm over head_dim 128 of Qwen3-30B-A3B attention, bf16 in and out.

Qwen3 normalises every query and key head before RoPE (q_norm, k_norm: RMSNorm over the head
dimension, one learned weight vector of length 128 shared by all heads of the kind):

    q_out[t, h, :] = q[t, h, :] * rsqrt(mean(q[t, h, :]**2) + 1e-6) * q_weight      (32 query heads)
    k_out[t, h, :] = k[t, h, :] * rsqrt(mean(k[t, h, :]**2) + 1e-6) * k_weight      (4 key heads)

Inputs (bf16): q [16384, 32, 128], k [16384, 4, 128] (a packed prefill batch of 16384 tokens),
q_weight [128], k_weight [128]. Outputs (bf16): q_out [16384, 32, 128], k_out [16384, 4, 128].

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) and rounds once to bf16
(HF's Qwen3RMSNorm also rounds the normalised value to bf16 before the weight multiply; the
reference does not). The eager baseline is torch's fused `rms_norm` in bf16 (fp32 statistics).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

EPS = 1e-6
HEAD_DIM = 128
SHAPES = {"full": (16384, 32, 4), "smoke": (64, 8, 2)}  # tokens, query heads, kv heads

_T, _HQ, _HK = SHAPES["full"]
_E = _T * (_HQ + _HK) * HEAD_DIM

META = ProblemMeta(
    number=36,
    name="rmsnorm_h128_qwen3_30b_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="Qwen/Qwen3-30B-A3B",
    source_config="num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6, "
                  "q_norm/k_norm = Qwen3RMSNorm(head_dim); 16384-token prefill batch",
    inputs=("q", "k", "q_weight", "k_weight"),
    outputs=(Output("q_out"), Output("k_out")),
    flops=4.0 * _E,
    bytes=2.0 * (2 * _E + 2 * HEAD_DIM),
    peak="memory",
    notes="q and k are separate contiguous tensors (as after the qkv split into views made contiguous). "
          "Smoke: 64 tokens, 8 query heads, 2 kv heads.",
)


def _rms(x, w, ct):
    xf = x.to(ct)
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS) * w.to(ct)).to(x.dtype)


def reference(q, k, q_weight, k_weight):
    ct = torch.promote_types(q.dtype, torch.float32)
    return _rms(q, q_weight, ct), _rms(k, k_weight, ct)


def eager(q, k, q_weight, k_weight):
    F = torch.nn.functional
    return F.rms_norm(q, (HEAD_DIM,), q_weight, EPS), F.rms_norm(k, (HEAD_DIM,), k_weight, EPS)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, hq, hk = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    # per-head scales differ a lot in trained projections (this is why Qwen3 normalises q and k)
    q = torch.randn(t, hq, HEAD_DIM, generator=g, device=device) * torch.exp(torch.randn(1, hq, 1, generator=g, device=device))
    k = torch.randn(t, hk, HEAD_DIM, generator=g, device=device) * torch.exp(torch.randn(1, hk, 1, generator=g, device=device))
    k[..., :: 16] *= 5.0  # a few outlier channels in the keys
    q_weight = 1.0 + 0.3 * torch.randn(HEAD_DIM, generator=g, device=device)
    k_weight = 1.0 + 0.3 * torch.randn(HEAD_DIM, generator=g, device=device)
    return tuple(v.to(torch.bfloat16) for v in (q, k, q_weight, k_weight))
