"""Worked example (doc pack, not a benchmark problem): the largest |x| of every row of a bf16 matrix.

A row reduction, the first step of per-token fp8 quantisation (the scale is amax / 448): one CTA
per row, each thread folds its strided 16-byte vectors, then a warp reduction and a second one over
the warps' partials in shared memory. A maximum of absolute values is exact, so the output is
compared exactly: any lost element or wrong lane shows.

Inputs: x bf16 [M, K]. Output: amax fp32 [M].
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

M = {"full": 16384, "smoke": 6}
K = {"full": 4096, "smoke": 256}

META = ProblemMeta(
    number=92,
    name="row_absmax_bf16",
    family="quantization",
    dtypes=("bf16", "fp32"),
    source_model="worked example of the mkb doc packs (a row reduction: per-token amax for fp8 scales)",
    source_config="M = 16384 tokens, K = 4096 hidden",
    inputs=("x",),
    outputs=(Output("amax", compare="exact"),),
    flops=2.0 * M["full"] * K["full"],
    bytes=2.0 * M["full"] * K["full"] + 4.0 * M["full"],
    peak="memory",
    exact_reason="a maximum of absolute values picks one input element, widened exactly to fp32: no rounding anywhere",
    notes="Doc-pack example 2 of 3.",
)


def reference(x):
    return x.to(torch.promote_types(x.dtype, torch.float32)).abs().amax(dim=-1)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    return ((torch.randn(M[size], K[size], generator=g, device=device) * 3).to(torch.bfloat16),)
