"""Mamba2 SSD intra-chunk (diagonal block) output of Nemotron Nano 9B v2, bf16.

The first stage of the chunked Mamba2 scan: the output each token receives from earlier tokens of
its own chunk (the block-diagonal part of the semiseparable matrix; the off-diagonal part comes
from the passed states and is not computed here). Tokens are split into chunks of 128; for token
i in chunk c and head h (group g = h // (H / G)), in fp32 (the promoted dtype):

    y[i, h] = sum_{j in chunk c, j <= i} (C[i, g] . B[j, g]) * exp(sum_{j < m <= i} dt[m, h] * A[h])
                                        * dt[j, h] * x[j, h]

(the decay is exp(segsum(dt * A)) with the segment sum taken over exact partial sums, as in
mamba_ssm's `segsum`). Layouts: x bf16 [B, T, H, P]; dt fp32 [B, T, H] (after softplus, > 0);
A fp32 [H] (< 0); Bm, Cm bf16 [B, T, G, N]. chunk_size int (a Python
scalar: 128 at full size). Output: y_diag bf16 [B, T, H, P]. T is a multiple of chunk_size.
Full size: NVIDIA-Nemotron-Nano-9B-v2 (128 heads of 80, state 128, 8 groups, chunk 128), 4 x 2048 tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream

BATCH = {"full": 4, "smoke": 1}
SEQ = {"full": 2048, "smoke": 32}
HEADS = {"full": 128, "smoke": 4}
HEAD_DIM = {"full": 80, "smoke": 8}
STATE = {"full": 128, "smoke": 16}
GROUPS = {"full": 8, "smoke": 2}
CHUNK = {"full": 128, "smoke": 16}

_f = "full"
_B, _T, _H, _P, _N, _G, _l = BATCH[_f], SEQ[_f], HEADS[_f], HEAD_DIM[_f], STATE[_f], GROUPS[_f], CHUNK[_f]

META = ProblemMeta(
    number=65,
    name="mamba2_intra_chunk_diagonal_nemotron_nano_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32"),
    source_model="nvidia/NVIDIA-Nemotron-Nano-9B-v2",
    source_config="mamba_num_heads=128, mamba_head_dim=80, ssm_state_size=128, n_groups=8, chunk_size=128",
    inputs=("x", "dt", "A", "Bm", "Cm", "chunk_size"),
    outputs=(Output("y_diag"),),
    # C B^T per group and chunk (2 l N per token), masked scores @ X per head (2 l P per token)
    flops=float(_B * _T * (_G * 2 * _l * _N + _H * 2 * _l * _P)),
    bytes=float(_B * _T * (_H * (2 * _P * 2 + 4) + 2 * _G * _N * 2)),
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/65_mamba2_intra_chunk_diagonal_nemotron_nano_bf16.json',
        matches=('outputs', 'in_place', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('computation', 'upstream takes the chunked x, the in-chunk cumulative decay a_cumsum [B, H, chunks, l] and chunked B, C; mkb takes x, dt, A, B, C and the chunk size and forms dt * A and its cumsum itself - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: batch 16, one chunk, head dim 128, state 128 (other axes not visible in the recipe); mkb: 4 x 2048 tokens, 128 heads, 8 groups, chunk 128 - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: N(0, 1) x, B, C, a_cumsum U(-0.02, 0); mkb: dt and A from Mamba2's initialisation ranges - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="Chunk length from the config (T divisible by it). The reference materialises the per-chunk "
    "decay matrices exp(segsum) (what the eager baseline times); a kernel computes them per tile.",
)


def _segsum(x):
    """segsum[..., i, j] = sum_{j < m <= i} x[..., m] for j <= i, -inf above the diagonal (mamba_ssm's exact form)."""
    T = x.shape[-1]
    xx = x[..., None].expand(*x.shape, T)
    low = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    xx = xx.masked_fill(~low, 0)
    s = xx.cumsum(dim=-2)
    return s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))


def reference(x, dt, A, Bm, Cm, chunk_size):
    ct = torch.promote_types(x.dtype, torch.float32)
    b, T, H, P = x.shape
    G, N = Bm.shape[2], Bm.shape[3]
    R = H // G
    l = int(chunk_size)
    c = T // l
    dtc = dt.to(ct)
    X = (x.to(ct) * dtc[..., None]).reshape(b, c, l, G, R, P)
    Ad = (dtc * A.to(ct)).reshape(b, c, l, G, R).permute(0, 3, 4, 1, 2)  # [b, G, R, c, l]
    Bc, Cc = Bm.to(ct).reshape(b, c, l, G, N), Cm.to(ct).reshape(b, c, l, G, N)
    CB = torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc)
    Lm = torch.exp(_segsum(Ad))  # [b, G, R, c, l, s]
    Y = torch.einsum("bcgls,bgrcls,bcsgrp->bclgrp", CB, Lm, X)
    return Y.reshape(b, T, H, P).to(x.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, P, N, G = BATCH[size], SEQ[size], HEADS[size], HEAD_DIM[size], STATE[size], GROUPS[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    x = rn(B, T, H, P).to(bf)
    dt_bias = torch.log(torch.expm1(torch.exp(torch.empty(H, device=device).uniform_(-6.9, -2.3, generator=gen))))
    dt = F.softplus(rn(B, T, H) + dt_bias)
    A = -(1.0 + 15.0 * torch.rand(H, generator=gen, device=device))
    return x, dt, A, rn(B, T, G, N).to(bf), rn(B, T, G, N).to(bf), CHUNK[size]
