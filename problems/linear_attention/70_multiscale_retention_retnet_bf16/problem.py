"""RetNet multi-scale retention (parallel form): per-head fixed exponential decay on a causal q-k score matrix, bf16.

Upstream MetaKernelBench's problem 70 (flash-linear-attention's `naive_retention`, RetNet head
geometry). Per batch b and head h, with gamma_h = 1 - 2**(-5 - h) and positions n, m = 0..T-1,
in fp32 (the promoted dtype):

    D[h, n, m] = gamma_h ** (n - m) if n >= m else 0
    o[b, h]    = ((q[b, h] * K**-0.5) @ k[b, h]^T * D[h]) @ v[b, h]         (rounded to bf16)

Inputs: q, k bf16 [B, H, T, K]; v bf16 [B, H, T, V]. Output: o bf16 [B, H, T, V]. No xPos
rotation, normalisation or gate (those sit outside this subgraph upstream). The decay is
computed as exp2((n - m) * log2(gamma_h)), as fla's naive form computes it.
Full size: upstream's (B 8, 8 heads, T 1024, key dim 256, value dim 512).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

BATCH = {"full": 8, "smoke": 1}
SEQ = {"full": 1024, "smoke": 40}
HEADS = {"full": 8, "smoke": 2}
DK = {"full": 256, "smoke": 16}
DV = {"full": 512, "smoke": 32}

_f = "full"
_B, _T, _H, _K, _V = BATCH[_f], SEQ[_f], HEADS[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=70,
    name="multiscale_retention_retnet_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="RetNet (Sun et al. 2023); flash-linear-attention naive_retention",
    source_config="8 retention heads, key dim 256, value dim 512, gamma_h = 1 - 2^(-5-h), scale K^-0.5",
    inputs=("q", "k", "v"),
    outputs=(Output("o"),),
    # parallel (causal) form: Q K^T and (.)V over the lower triangle
    flops=float(_B * _H * _T * _T * (_K + _V)),
    bytes=float(_B * _H * _T * (2 * _K + 2 * _V) * 2),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/linear_attention/70_multiscale_retention_retnet_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
    ),
    notes="Inputs N(0, 1) in bf16, as upstream. The eager baseline is the same parallel form on bfloat16 "
    "operands (the score matrix rounded to bf16 before the decay mask and again before the value GEMM). A "
    "chunkwise kernel needs only O(T * chunk) work. Smoke: 1 x 2 heads x 40 positions, K 16, V 32.",
)


def _decay(H: int, T: int, dtype: torch.dtype, device) -> torch.Tensor:
    log2g = torch.log2(1.0 - torch.exp2(-5.0 - torch.arange(H, dtype=dtype, device=device)))
    n = torch.arange(T, dtype=dtype, device=device)
    diff = n[:, None] - n[None, :]
    return torch.exp2(diff[None] * log2g[:, None, None]) * (diff >= 0)  # [H, T, T]


def reference(q, k, v):
    ct = torch.promote_types(q.dtype, torch.float32)
    _, H, T, K = q.shape
    s = (q.to(ct) * K**-0.5) @ k.to(ct).transpose(-1, -2) * _decay(H, T, ct, q.device)
    return (s @ v.to(ct)).to(q.dtype)


def eager(q, k, v):
    _, H, T, K = q.shape
    s = (q * K**-0.5) @ k.transpose(-1, -2)
    s = (s.float() * _decay(H, T, torch.float32, q.device)).to(q.dtype)
    return s @ v


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, K, V = BATCH[size], SEQ[size], HEADS[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device).to(torch.bfloat16)

    return rn(B, H, T, K), rn(B, H, T, K), rn(B, H, T, V)
