"""RMSNorm over head_dim 128 of Qwen3-30B-A3B's flattened per-head query/key rows, bf16 in and out.

Qwen3 normalises every query and key head before RoPE (q_norm, k_norm: RMSNorm over the head
dimension). Upstream's problem (FlashInfer-Trace definition rmsnorm_h128) takes the heads flattened
into rows, with one weight vector:

    y[r, :] = x[r, :] * rsqrt(mean(x[r, :]**2) + 1e-6) * weight          for every row r

Inputs (bf16): hidden_states [520128, 128] (the captured workload's row count: 14448 tokens x
(32 query + 4 key heads)), weight [128]. Output (bf16): y [520128, 128].

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) and rounds once to bf16.
The eager baseline is torch's fused `rms_norm` in bf16 (fp32 statistics).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
HEAD_DIM = 128
ROWS = {"full": 520128, "smoke": 576}

_R = ROWS["full"]

META = ProblemMeta(
    number=36,
    name="rmsnorm_h128_qwen3_30b_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="Qwen/Qwen3-30B-A3B",
    source_config="num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6, "
                  "q_norm/k_norm = Qwen3RMSNorm(head_dim); FlashInfer-Trace rmsnorm_h128 workload, 520128 rows",
    inputs=("hidden_states", "weight"),
    outputs=(Output("y"),),
    flops=4.0 * _R * HEAD_DIM,
    bytes=2.0 * (2 * _R * HEAD_DIM + HEAD_DIM),
    peak="memory",
    upstream=Upstream(
        source="shipped",
        path="problems/mlp_norm/36_rmsnorm_h128_qwen3_30b_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
    ),
    notes="Inputs as upstream: hidden_states N(0, 1) in bf16, weight 1 + 0.1 N(0, 1) (fp32, rounded to bf16). "
          "Smoke: 576 x 128.",
)


def reference(hidden_states, weight):
    ct = torch.promote_types(hidden_states.dtype, torch.float32)
    x = hidden_states.to(ct)
    return (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.to(ct)).to(hidden_states.dtype)


def eager(hidden_states, weight):
    return torch.nn.functional.rms_norm(hidden_states, (HEAD_DIM,), weight, EPS)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(ROWS[size], HEAD_DIM, generator=g, device=device)
    weight = 1.0 + 0.1 * torch.randn(HEAD_DIM, generator=g, device=device)
    return x.to(torch.bfloat16), weight.to(torch.bfloat16)
