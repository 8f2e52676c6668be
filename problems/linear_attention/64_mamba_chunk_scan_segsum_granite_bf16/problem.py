"""Mamba2 chunked selective scan (SSD) with segment sums, Granite 4.0-H heads, bf16.

The state-space core of a Granite 4.0-H Mamba2 layer (mamba_ssm `mamba_chunk_scan_combined`).
Per batch b and head h (all heads share one group of B/C), S_{-1} = initial_state[b, h] ([P, N]),
for t = 0..T-1, in fp32 (the promoted dtype):

    dt_t = softplus(dt[b, t, h] + dt_bias[h]) ;  A_h = -exp(A_log[h])
    S_t  = exp(dt_t * A_h) * S_{t-1} + dt_t * outer(x_t, B_t)
    y_t  = S_t @ C_t + D[h] * x_t

Layouts: x bf16 [B, T, H, P]; dt bf16 [B, T, H] (raw, before the bias and softplus); dt_bias, A_log,
D fp32 [H]; Bm, Cm bf16 [B, T, 1, N]; initial_state bf16 [B, H, P, N]. Outputs: y bf16 [B, T, H, P]
and final_state bf16 [B, H, P, N], each rounded once (fp32 in between). `reference` runs the exact
recurrence; `eager` is the chunked form with segment sums (`ssd_minimal_discrete`, chunk 256):
the intra-chunk block uses L = exp(segsum(dt * A)), states pass between chunks.
Full size: Granite-4.0-H-Small (128 heads of 64, state 128, 1 group, chunk 256), 2 x 4096 tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import ssd_chunked, ssd_recurrence

BATCH = {"full": 2, "smoke": 1}
SEQ = {"full": 4096, "smoke": 300}
HEADS = {"full": 128, "smoke": 4}
HEAD_DIM = {"full": 64, "smoke": 8}
STATE = {"full": 128, "smoke": 16}
GROUPS = 1
CHUNK = 256

_f = "full"
_B, _T, _H, _P, _N, _l = BATCH[_f], SEQ[_f], HEADS[_f], HEAD_DIM[_f], STATE[_f], CHUNK

META = ProblemMeta(
    number=64,
    name="mamba_chunk_scan_segsum_granite_bf16",
    family="linear_attention",
    dtypes=("bf16", "fp32"),
    source_model="ibm-granite/granite-4.0-h-small",
    source_config="mamba_n_heads=128, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, "
    "mamba_chunk_size=256; dt = softplus(dt + dt_bias), A = -exp(A_log), D skip",
    inputs=("x", "dt", "dt_bias", "A_log", "Bm", "Cm", "D", "initial_state"),
    outputs=(Output("y"), Output("final_state")),
    # chunked SSD: C B^T per group (2 l^2 N), masked (.)X per head (2 l^2 P / 2 causal ~ 2 l P per token),
    # chunk states and state output (2 * 2 P N per token per head)
    flops=float(_B * _T * (GROUPS * 2 * _l * _N + _H * (2 * _l * _P + 4 * _P * _N))),
    bytes=float(_B * _T * (_H * (2 * _P + 1) + 2 * GROUPS * _N) * 2 + 2 * _B * _H * _P * _N * 2),
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/64_mamba_chunk_scan_segsum_granite_bf16.json',
        matches=('outputs', 'in_place', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('computation', 'upstream passes the per-head log decay A (dt already applied, [B, H, T]) directly and has no dt / dt_bias / A_log inputs; mkb computes dt = softplus(dt + dt_bias) and A = -exp(A_log) itself - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: batch 8 x 1024 tokens, 16 heads of 64, state 256, 1 group, chunk 256; mkb: 2 x 4096 tokens, 128 heads, state 128 (Granite 4.0-H) - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: N(0, 1) x, B, C, D and initial state (bf16), decay U(-0.02, -0.0005); mkb's differ - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is "
    "the chunked segsum form. States are bf16 in memory so a chunked kernel is judged at storage precision.",
)


def _prep(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state):
    ct = torch.promote_types(x.dtype, torch.float32)
    dtp = F.softplus(dt.to(ct) + dt_bias.to(ct))
    A = -torch.exp(A_log.to(ct))
    return x.to(ct), dtp, A, Bm.to(ct), Cm.to(ct), initial_state.to(ct)


def reference(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state):
    xx, dtp, A, Bc, Cc, S = _prep(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state)
    y, S = ssd_recurrence(xx, dtp, A, Bc, Cc, S)
    y = y + D.to(xx.dtype)[:, None] * xx
    return y.to(x.dtype), S.to(initial_state.dtype)


def eager(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state):
    xx, dtp, A, Bc, Cc, S = _prep(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state)
    y, S = ssd_chunked(xx, dtp, A, Bc, Cc, S, chunk=CHUNK)
    y = y + D.to(xx.dtype)[:, None] * xx
    return y.to(x.dtype), S.to(initial_state.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, P, N = BATCH[size], SEQ[size], HEADS[size], HEAD_DIM[size], STATE[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    x = rn(B, T, H, P).to(bf)
    dt = (rn(B, T, H) - 1.0).to(bf)
    # dt_bias: softplus^-1 of dt ~ logU(1e-3, 1e-1) (mamba init); A ~ U(1, 16)
    dt0 = torch.exp(torch.empty(H, device=device).uniform_(-6.9, -2.3, generator=gen))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    A_log = torch.log(1.0 + 15.0 * torch.rand(H, generator=gen, device=device))
    Bm, Cm = rn(B, T, GROUPS, N).to(bf), rn(B, T, GROUPS, N).to(bf)
    D = 1.0 + 0.1 * rn(H)
    initial_state = (0.5 * rn(B, H, P, N)).to(bf)
    return x, dt, dt_bias, A_log, Bm, Cm, D, initial_state
