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

from mkb.problems._contract import Output, ProblemMeta

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
    notes="The reference is the token-by-token recurrence (its float64 run is the anchor); eager is "
    "the chunked segsum form. States are bf16 in memory so a chunked kernel is judged at storage precision.",
)


def _segsum(x):
    """segsum[..., i, j] = sum_{j < m <= i} x[..., m] for j <= i, -inf above the diagonal (mamba_ssm's exact form)."""
    T = x.shape[-1]
    xx = x[..., None].expand(*x.shape, T)
    low = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    xx = xx.masked_fill(~low, 0)
    s = xx.cumsum(dim=-2)
    return s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))


def _ssd_recurrence(x, dt, A, Bm, Cm, S):
    """Exact selective-state recurrence. x [b, T, H, P]; dt [b, T, H] (>0); A [H] (<0);
    Bm, Cm [b, T, G, N]; S [b, H, P, N]. Returns y [b, T, H, P] (without the D skip) and S."""
    H, G = x.shape[2], Bm.shape[2]
    Bh = Bm.repeat_interleave(H // G, dim=2)
    Ch = Cm.repeat_interleave(H // G, dim=2)
    ys = []
    for t in range(x.shape[1]):
        dtt = dt[:, t]
        S = S * torch.exp(dtt * A)[..., None, None] + (dtt[..., None] * x[:, t])[..., :, None] * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", S, Ch[:, t]))
    return torch.stack(ys, dim=1), S


def _ssd_chunked(x, dt, A, Bm, Cm, S, chunk):
    """Chunked SSD (mamba_ssm `ssd_minimal_discrete`, with B/C shared by groups of heads)."""
    b, T, H, P = x.shape
    G, N = Bm.shape[2], Bm.shape[3]
    R = H // G
    pad = (-T) % chunk
    # trailing padding with dt = 0 leaves the state unchanged
    x, Bm, Cm = (F.pad(t_, (0, 0, 0, 0, 0, pad)) for t_ in (x, Bm, Cm))
    dt = F.pad(dt, (0, 0, 0, pad))
    c = (T + pad) // chunk
    X = (x * dt[..., None]).reshape(b, c, chunk, G, R, P)
    Ad = (dt * A).reshape(b, c, chunk, G, R).permute(0, 3, 4, 1, 2)  # [b, G, R, c, l]
    Bc, Cc = Bm.reshape(b, c, chunk, G, N), Cm.reshape(b, c, chunk, G, N)
    Acs = Ad.cumsum(-1)
    CB = torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc)
    Lm = torch.exp(_segsum(Ad))  # [b, G, R, c, l, s]
    Y = torch.einsum("bcgls,bgrcls,bcsgrp->bclgrp", CB, Lm, X)
    decay_states = torch.exp(Acs[..., -1:] - Acs)
    states = torch.einsum("bclgn,bgrcl,bclgrp->bcgrpn", Bc, decay_states, X)
    S0 = S.reshape(b, 1, G, R, P, N)
    states = torch.cat([S0, states], dim=1)
    decay_chunk = torch.exp(_segsum(F.pad(Acs[..., -1], (1, 0))))  # [b, G, R, c+1, c+1]
    new_states = torch.einsum("bgrzc,bcgrpn->bzgrpn", decay_chunk, states)
    states, S = new_states[:, :-1], new_states[:, -1]
    Y = Y + torch.einsum("bclgn,bcgrpn,bgrcl->bclgrp", Cc, states, torch.exp(Acs))
    return Y.reshape(b, c * chunk, H, P)[:, :T], S.reshape(b, H, P, N)


def _prep(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state):
    ct = torch.promote_types(x.dtype, torch.float32)
    dtp = F.softplus(dt.to(ct) + dt_bias.to(ct))
    A = -torch.exp(A_log.to(ct))
    return x.to(ct), dtp, A, Bm.to(ct), Cm.to(ct), initial_state.to(ct)


def reference(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state):
    xx, dtp, A, Bc, Cc, S = _prep(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state)
    y, S = _ssd_recurrence(xx, dtp, A, Bc, Cc, S)
    y = y + D.to(xx.dtype)[:, None] * xx
    return y.to(x.dtype), S.to(initial_state.dtype)


def eager(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state):
    xx, dtp, A, Bc, Cc, S = _prep(x, dt, dt_bias, A_log, Bm, Cm, D, initial_state)
    y, S = _ssd_chunked(xx, dtp, A, Bc, Cc, S, CHUNK)
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
