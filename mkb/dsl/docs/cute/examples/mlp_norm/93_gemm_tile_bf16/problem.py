"""Worked example (doc pack, not a benchmark problem): C = A @ B^T in bf16 on tensor cores, fp32 accumulation.

The tile structure every GEMM shares: each CTA owns one BM x BN tile of C, walks K in BK steps,
stages the A and B tiles in shared memory and lets its warps multiply them with mma.sync
(m16n8k16, bf16 in, fp32 accumulators in registers), then rounds once to bf16. Both operands are
K-major (row-major A [M, K] and B [N, K], as a linear layer's weight is stored), which is exactly
what mma.sync's row.col form wants. Sizes are multiples of the kernels' tiles.

Inputs: a bf16 [M, K], b bf16 [N, K]. Output: c bf16 [M, N].
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

M = {"full": 4096, "smoke": 128}
N = {"full": 4096, "smoke": 128}
K = {"full": 4096, "smoke": 64}

META = ProblemMeta(
    number=93,
    name="gemm_tile_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="worked example of the mkb doc packs (a tensor-core GEMM tile, the core of every projection)",
    source_config="M = N = K = 4096, both operands K-major",
    inputs=("a", "b"),
    outputs=(Output("c"),),
    flops=2.0 * M["full"] * N["full"] * K["full"],
    bytes=2.0 * (M["full"] * K["full"] + N["full"] * K["full"] + M["full"] * N["full"]),
    peak="bf16_tc",
    notes="Doc-pack example 3 of 3. The reference accumulates in fp32 and rounds to bf16 once, as the kernels do.",
)


def reference(a, b):
    ct = torch.promote_types(a.dtype, torch.float32)  # fp32, or fp64 for the grader's anchor
    return (a.to(ct) @ b.to(ct).T).to(a.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    a = torch.randn(M[size], K[size], generator=g, device=device).to(torch.bfloat16)
    b = (torch.randn(N[size], K[size], generator=g, device=device) / K[size] ** 0.5).to(torch.bfloat16)
    return a, b
