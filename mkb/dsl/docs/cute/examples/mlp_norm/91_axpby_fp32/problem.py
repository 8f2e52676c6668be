"""Worked example (doc pack, not a benchmark problem): out = alpha * x + beta * y over one fp32 vector.

The simplest memory-bound kernel: every element is read twice and written once, nothing is reused,
so a kernel is as fast as its loads and stores are wide and coalesced. The length is 2^25 + 3 so that
the graded size also exercises the tail that does not fill a 16-byte vector. alpha and beta are
Python floats (exact in fp32) passed as kernel arguments.

Inputs: x, y fp32 [N]; alpha, beta Python floats. Output: out fp32 [N].
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

N = {"full": (1 << 25) + 3, "smoke": 1030}
ALPHA, BETA = 0.75, -1.25

META = ProblemMeta(
    number=91,
    name="axpby_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="worked example of the mkb doc packs (an elementwise vector op)",
    source_config=f"N = 2^25 + 3, alpha = {ALPHA}, beta = {BETA}",
    inputs=("x", "y", "alpha", "beta"),
    outputs=(Output("out"),),
    flops=3.0 * N["full"],
    bytes=3.0 * 4 * N["full"],  # read x and y, write out
    peak="memory",
    fixed_inputs=("alpha", "beta"),
    notes="Doc-pack example 1 of 3 (numbered 91+ so it never collides with the catalog's 01-74).",
)


def reference(x, y, alpha, beta):
    return alpha * x + beta * y


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(N[size], generator=g, device=device)
    y = torch.randn(N[size], generator=g, device=device)
    return x, y, ALPHA, BETA
