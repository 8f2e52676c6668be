"""Mamba2 SSD intra-chunk (diagonal block) output: the segment-sum decay mask applied to grouped C B^T contractions, bf16.

Upstream MetaKernelBench's problem 65 (a SOL-ExecBench recipe): the first stage of the chunked Mamba2 scan,
the output each token receives from earlier tokens of its own chunk (the block-diagonal part of the
semiseparable matrix; the off-diagonal part comes from the passed states and is not computed here). The
inputs arrive already chunked, with the discretised log decays a (dt * A) per head and step and the
input already scaled by dt. For batch b, chunk c, token i, head h (group g = h // (H / G)), in fp32 (the
promoted dtype):

    y[b, c, i, h] = sum_{j <= i} (C[b, c, i, g] . B[b, c, j, g]) * exp(sum_{j < m <= i} a[b, h, c, m])
                                * x[b, c, j, h]

(the decay is exp(segsum(a)) with the segment sum taken over exact partial sums, as in mamba_ssm's
`segsum`). Layouts: hidden_states (x) bf16 [B, C, l, H, P]; a_cumsum (a, upstream's name) bf16
[B, H, C, l]; Bm, Cm bf16 [B, C, l, G, N]. Output: y_diag bf16 [B, C, l, H, P], rounded once.
Full size: batch 16, one chunk of 128, 128 heads of 128, 8 groups, state 128.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import segsum

BATCH = {"full": 16, "smoke": 1}
CHUNKS = {"full": 1, "smoke": 2}
CHUNK = {"full": 128, "smoke": 128}
HEADS = {"full": 128, "smoke": 4}
HEAD_DIM = {"full": 128, "smoke": 8}
GROUPS = {"full": 8, "smoke": 2}
STATE = {"full": 128, "smoke": 16}

_f = "full"
_B, _C, _l, _H, _P, _G, _N = BATCH[_f], CHUNKS[_f], CHUNK[_f], HEADS[_f], HEAD_DIM[_f], GROUPS[_f], STATE[_f]
_BT = _B * _C * _l

META = ProblemMeta(
    number=65,
    name="mamba2_intra_chunk_diagonal_nemotron_nano_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="Nemotron Nano style Mamba2 SSD diagonal block; SOL-ExecBench recipe",
    source_config="batch 16, 1 chunk of 128, 128 heads of 128, 8 groups of B/C, state 128; log decays "
    "U(-0.02, 0) per head and step",
    inputs=("hidden_states", "a_cumsum", "Bm", "Cm"),
    outputs=(Output("y_diag"),),
    # C B^T per group and chunk (2 l N per token), masked scores @ X per head (2 l P per token)
    flops=float(_BT * (_G * 2 * _l * _N + _H * 2 * _l * _P)),
    bytes=float(_BT * (_H * (2 * _P + 1) + 2 * _G * _N) * 2),
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/65_mamba2_intra_chunk_diagonal_nemotron_nano_bf16.json",
        matches=("computation", "outputs", "in_place", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(
            ("shapes", "the recipe hides the chunk size, the head count and the group count: mkb uses "
             "NVIDIA-Nemotron-Nano-9B-v2's chunk 128, 128 heads and 8 groups; batch 16, one chunk, head dim 128 "
             "and state 128 as the recipe"),
        ),
    ),
    notes="Inputs as the recipe: x, B, C N(0, 1), the log decays U(-0.02, 0), all bf16. The reference "
    "materialises the per-chunk decay matrices exp(segsum(a)); a kernel computes them per tile.",
)


def reference(hidden_states, a_cumsum, Bm, Cm):
    ct = torch.promote_types(hidden_states.dtype, torch.float32)
    b, c, l, H, P = hidden_states.shape
    G = Bm.shape[3]
    R = H // G
    X = hidden_states.to(ct).reshape(b, c, l, G, R, P)
    a = a_cumsum.to(ct).reshape(b, G, R, c, l)
    CB = torch.einsum("bclgn,bcsgn->bcgls", Cm.to(ct), Bm.to(ct))
    Lm = torch.exp(segsum(a))  # [b, G, R, c, l, s]
    Y = torch.einsum("bcgls,bgrcls,bcsgrp->bclgrp", CB, Lm, X)
    return Y.reshape(b, c, l, H, P).to(hidden_states.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, C, l, H, P, G, N = BATCH[size], CHUNKS[size], CHUNK[size], HEADS[size], HEAD_DIM[size], GROUPS[size], STATE[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device).to(torch.bfloat16)

    a_cumsum = (torch.rand(B, H, C, l, generator=gen, device=device) * -0.02).to(torch.bfloat16)
    return rn(B, C, l, H, P), a_cumsum, rn(B, C, l, G, N), rn(B, C, l, G, N)
