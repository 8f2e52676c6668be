"""Linear-attention recurrences (delta rule, per-channel gating, Mamba2 SSD): exact token-by-token references and chunked eager forms.

Several linear_attention problems share one recurrence and differ only in how their inputs are
prepared (gates, normalisation, GQA expansion, padding) and in constants; each problem.py does its
own preparation and calls these functions. Every pair below computes the same recurrence twice:
`*_recurrence` token by token (the reference: exact, slow) and `*_chunked` in chunks (the eager
baseline: the usual parallel form, equal up to fp rounding).

Conventions (all functions):
- Inputs are already in the compute dtype (the problem promotes them, fp32 or float64); nothing
  here rounds, the problem casts the outputs once at the end.
- Sequence-major layouts: time is dim 1, heads dim 2 ([B, T, H, ...]); the state S is per
  (batch, head) and returned as the final state after the last token.
- Gates are log decays (<= 0): a step multiplies the state by exp(g) before adding the new token.
- Chunked forms pad T up to a multiple of `chunk` with zeros at the end; zero k / beta / g / dt
  leave the state unchanged, so the padding is inert and is cut off the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "channel_gated_chunked",
    "channel_gated_recurrence",
    "delta_rule_chunked",
    "delta_rule_recurrence",
    "l2norm",
    "l2normalize",
    "segsum",
    "ssd_chunked",
    "ssd_recurrence",
]


def l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x**2) + eps) over the last dim (FLA's in-kernel q/k normalisation)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def l2normalize(x: torch.Tensor) -> torch.Tensor:
    """x / max(||x||_2, 1e-12) over the last dim (torch's F.normalize, as fla's naive references normalise q/k)."""
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-12)


# ---------------------------------------------------------------------------------------------
# Gated delta rule with a scalar gate per (token, head): Gated DeltaNet (g = 0: plain DeltaNet).
#   S = S_{t-1} * exp(g_t) ;  S_t = S + outer(k_t, beta_t * (v_t - k_t @ S)) ;  o_t = q_t @ S_t
# ---------------------------------------------------------------------------------------------


def delta_rule_recurrence(q, k, v, g, beta, S):
    """Exact token-by-token gated delta rule -> (o [B, T, H, V], final S).

    q, k [B, T, H, K]; v [B, T, H, V]; g, beta [B, T, H]; S [B, H, K, V] (the initial state).
    """
    out = []
    for t in range(q.shape[1]):
        S = S * torch.exp(g[:, t])[..., None, None]
        kt = k[:, t]
        kv = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + kt[..., :, None] * ((v[:, t] - kv) * beta[:, t, :, None])[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, dim=1), S


def delta_rule_chunked(q, k, v, g, beta, S, *, chunk: int):
    """Chunked WY form of `delta_rule_recurrence` (as HF `torch_chunk_gated_delta_rule`); same inputs.

    Within a chunk the delta-rule corrections are one unit-lower-triangular solve
    (I + L) T = I with L = tril(diag(beta) k k^T * decay, -1); states pass between chunks.
    """
    B, T, H, _ = q.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    # trailing padding with k = 0, beta = 0, g = 0 leaves the state unchanged
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)).transpose(1, 2) for x in (g, beta))
    n = (T + pad) // chunk
    q, k, v = (x.reshape(B, H, n, chunk, -1) for x in (q, k, v))
    g, beta = g.reshape(B, H, n, chunk), beta.reshape(B, H, n, chunk)
    gc = g.cumsum(-1)
    decay = (gc[..., :, None] - gc[..., None, :]).tril().exp().tril()  # exp(gc_i - gc_j), j <= i
    kb = k * beta[..., None]
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    L = ((kb @ k.transpose(-1, -2)) * decay).tril(-1)
    Tm = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    u = Tm @ (v * beta[..., None])
    w = Tm @ (kb * gc.exp()[..., None])
    o = torch.empty(B, H, n, chunk, V, dtype=q.dtype, device=q.device)
    for i in range(n):
        qi, ki = q[:, :, i], k[:, :, i]
        attn = ((qi @ ki.transpose(-1, -2)) * decay[:, :, i]).tril()
        v_new = u[:, :, i] - w[:, :, i] @ S
        o[:, :, i] = (qi * gc[:, :, i, :, None].exp()) @ S + attn @ v_new
        glast = gc[:, :, i, -1]
        k_tail = ki * (glast[..., None] - gc[:, :, i]).exp()[..., None]  # k_j decayed to the chunk end
        S = S * glast.exp()[..., None, None] + k_tail.transpose(-1, -2) @ v_new
    o = o.reshape(B, H, n * chunk, V)[:, :, :T].transpose(1, 2)
    return o, S


# ---------------------------------------------------------------------------------------------
# Per-channel (per key dimension) gating: KDA (with the delta rule) and GLA (beta None, without).
#   S = Diag(exp(g_t)) S_{t-1} ;  S_t = S + outer(k_t, beta_t * (v_t - k_t @ S))  [or + outer(k_t, v_t)]
#   o_t = q_t @ S_t
# ---------------------------------------------------------------------------------------------


def channel_gated_recurrence(q, k, v, g, beta, S):
    """Exact token-by-token recurrence -> (o [B, T, H, V], final S).

    q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] per-channel log decay; beta [B, T, H], or None
    for no delta rule (plain gated linear attention); S [B, H, K, V] (the initial state).
    """
    out = []
    for t in range(q.shape[1]):
        S = S * torch.exp(g[:, t])[..., None]
        kt = k[:, t]
        if beta is None:
            S = S + kt[..., :, None] * v[:, t, :, None, :]
        else:
            kv = torch.einsum("bhk,bhkv->bhv", kt, S)
            S = S + kt[..., :, None] * ((v[:, t] - kv) * beta[:, t, :, None])[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, dim=1), S


def channel_gated_chunked(q, k, v, g, beta, S, *, chunk: int):
    """Chunked form of `channel_gated_recurrence` (same inputs) with exact pairwise per-channel decays.

    Within a chunk, A[i, j] = sum_k x_i[k] k_j[k] exp(gc_i[k] - gc_j[k]) for j <= i (gc: in-chunk
    cumulative g), formed pair by pair rather than as exp(gc_i) * exp(-gc_j), which overflows for
    strong decays.
    """
    B, T, H, _ = q.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    # trailing padding with k = 0, g = 0 (and beta = 0) leaves the state unchanged
    q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for x in (q, k, v, g))
    n = (T + pad) // chunk
    q, k, v, g = (x.reshape(B, H, n, chunk, -1) for x in (q, k, v, g))
    if beta is not None:
        beta = F.pad(beta, (0, 0, 0, pad)).transpose(1, 2).reshape(B, H, n, chunk)
    gc = g.cumsum(-2)
    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()[..., None]  # j <= i
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    o = torch.empty(B, H, n, chunk, V, dtype=q.dtype, device=q.device)
    for i in range(n):
        qi, ki, vi, gi = q[:, :, i], k[:, :, i], v[:, :, i], gc[:, :, i]
        dec = gi[:, :, :, None, :] - gi[:, :, None, :, :]  # [B, H, C(i), C(j), K]: gc_i - gc_j
        dec = dec.masked_fill_(~tri, float("-inf")).exp_()
        # A[i, j] = sum_k x_i[k] dec[i, j, k] k_j[k], contracted as a batched matvec over (b, h, i)
        a_qk = torch.einsum("bhijk,bhjk->bhij", qi[:, :, :, None, :] * dec, ki)
        if beta is None:
            v_new = vi
        else:
            bi = beta[:, :, i]
            L = (torch.einsum("bhijk,bhjk->bhij", ki[:, :, :, None, :] * dec, ki) * bi[..., None]).tril(-1)
            Tm = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
            u = Tm @ (vi * bi[..., None])
            w = Tm @ (ki * bi[..., None] * gi.exp())
            v_new = u - w @ S
        o[:, :, i] = (qi * gi.exp()) @ S + a_qk @ v_new
        glast = gi[:, :, -1]  # [B, H, K]
        S = glast.exp()[..., None] * S + (ki * (glast[:, :, None, :] - gi).exp()).transpose(-1, -2) @ v_new
    o = o.reshape(B, H, n * chunk, V)[:, :, :T].transpose(1, 2)
    return o, S


# ---------------------------------------------------------------------------------------------
# Mamba2 selective state space (SSD), B/C shared by groups of heads (head h uses group h // (H/G)):
#   S_t = exp(dt_t A) S_{t-1} + dt_t outer(x_t, B_t) ;  y_t = S_t C_t     (the D skip is the caller's)
# ---------------------------------------------------------------------------------------------


def segsum(x):
    """segsum[..., i, j] = sum_{j < m <= i} x[..., m] for j <= i, -inf above the diagonal (mamba_ssm's exact form)."""
    T = x.shape[-1]
    xx = x[..., None].expand(*x.shape, T)
    low = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    xx = xx.masked_fill(~low, 0)
    s = xx.cumsum(dim=-2)
    return s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))


def ssd_recurrence(x, dt, A, Bm, Cm, S):
    """Exact selective-state recurrence -> (y [b, T, H, P] without the D skip, final S).

    x [b, T, H, P]; dt [b, T, H] (> 0, after bias and softplus); A [H] (< 0); Bm, Cm [b, T, G, N];
    S [b, H, P, N] (the initial state).
    """
    H, G = x.shape[2], Bm.shape[2]
    Bh = Bm.repeat_interleave(H // G, dim=2)
    Ch = Cm.repeat_interleave(H // G, dim=2)
    ys = []
    for t in range(x.shape[1]):
        dtt = dt[:, t]
        S = S * torch.exp(dtt * A)[..., None, None] + (dtt[..., None] * x[:, t])[..., :, None] * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", S, Ch[:, t]))
    return torch.stack(ys, dim=1), S


def ssd_chunked(x, dt, A, Bm, Cm, S, *, chunk: int):
    """Chunked SSD (mamba_ssm `ssd_minimal_discrete`, with B/C shared by groups of heads); inputs as `ssd_recurrence`.

    The intra-chunk block uses L = exp(segsum(dt * A)); chunk states pass between chunks through
    exp(segsum) of the chunk-end cumulative decays.
    """
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
    Lm = torch.exp(segsum(Ad))  # [b, G, R, c, l, s]
    Y = torch.einsum("bcgls,bgrcls,bcsgrp->bclgrp", CB, Lm, X)
    decay_states = torch.exp(Acs[..., -1:] - Acs)
    states = torch.einsum("bclgn,bgrcl,bclgrp->bcgrpn", Bc, decay_states, X)
    S0 = S.reshape(b, 1, G, R, P, N)
    states = torch.cat([S0, states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(Acs[..., -1], (1, 0))))  # [b, G, R, c+1, c+1]
    new_states = torch.einsum("bgrzc,bcgrpn->bzgrpn", decay_chunk, states)
    states, S = new_states[:, :-1], new_states[:, -1]
    Y = Y + torch.einsum("bclgn,bcgrpn,bgrcl->bclgrp", Cc, states, torch.exp(Acs))
    return Y.reshape(b, c * chunk, H, P)[:, :T], S.reshape(b, H, P, N)
