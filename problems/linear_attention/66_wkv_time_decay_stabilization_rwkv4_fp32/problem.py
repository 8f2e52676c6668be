"""RWKV-4 WKV operator with the running-max (log-sum-exp) stabilisation of its CUDA kernel, resuming from a carried-in state, fp32.

Upstream MetaKernelBench's problem 66 (a SOL-ExecBench recipe): the time-mixing core of RWKV-4
(`wkv_cuda.cu` forward, BlinkDL/RWKV-LM) over 64 sequences of 1721 tokens and 2048 channels, starting
from a carried-in state (numerator a, denominator b, running max p per sequence and channel) and
returning the output and the new state. Per batch n and channel c, with w = -exp(time_decay[c]) and
u = time_first[c], for t = 0..T-1, in fp32 (the promoted dtype):

    ww = u + k_t ;  q = max(p, ww) ;  e1 = exp(p - q) ;  e2 = exp(ww - q)
    y_t = (e1 * a + e2 * v_t) / (e1 * b + e2)
    ww = w + p ;  q = max(ww, k_t) ;  e1 = exp(ww - q) ;  e2 = exp(k_t - q)
    a = e1 * a + e2 * v_t ;  b = e1 * b + e2 ;  p = q

Layouts: time_decay, time_first fp32 [C]; key, value fp32 [B, T, C]; state_a, state_b, state_p fp32
[B, C]. Outputs: y fp32 [B, T, C], and the state after the last token: state_a, state_b, state_p fp32
[B, C]. `reference` runs the recurrence above; `eager` a chunked form (chunk 64) whose intra-chunk sums
are cumulative sums of e^{k_i - i w - m} (m the chunk's max), so no [t, i] matrix is formed.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

BATCH = {"full": 64, "smoke": 2}
SEQ = {"full": 1721, "smoke": 150}  # smoke spans three chunks, the last partial
CH = {"full": 2048, "smoke": 24}
CHUNK = 64

_f = "full"
_B, _T, _C = BATCH[_f], SEQ[_f], CH[_f]

META = ProblemMeta(
    number=66,
    name="wkv_time_decay_stabilization_rwkv4_fp32",
    family="linear_attention",
    dtypes=("fp32",),
    source_model="RWKV-4 (WKV forward with carried state); SOL-ExecBench recipe",
    source_config="batch 64 x 1721 tokens, 2048 channels; w = -exp(time_decay), time_decay U(-6, -1); carried-in "
    "state (a, b, p) drawn non-empty; the WKV CUDA kernel's running-max stabilisation",
    inputs=("time_decay", "key", "time_first", "value", "state_a", "state_b", "state_p"),
    outputs=(Output("y"), Output("state_a_out"), Output("state_b_out"), Output("state_p_out")),
    flops=float(_B * _T * _C * 20),  # ~6 exp/max and ~14 mul/add/div per step
    bytes=float(3 * _B * _T * _C * 4 + 2 * _C * 4 + 6 * _B * _C * 4),
    peak="fp32_simt",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/66_wkv_time_decay_stabilization_rwkv4_fp32.json",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("distributions", "the carried-in denominator state_b is |N(0, 1)| where upstream draws N(0, 1): a "
             "denominator is a sum of exponentials, positive in any real state, and a negative one makes some "
             "steps' denominators nearly cancel, so the eager chunked form missed the fp32 reference's allowance "
             "on 7 of 20 smoke seeds; the recipe also hides a trailing factor on time_first's N(0, 1) (mkb uses "
             "none) and the lower bound of the running max's U(., 2) (mkb uses -2); time_decay U(-6, -1), key, "
             "value and state_a N(0, 1) as upstream"),
        ),
    ),
    notes="The reference is the sequential kernel (its float64 run is the anchor); eager is chunked (the "
    "sequential form costs ~14 launches per token at full size).",
)


def reference(time_decay, key, time_first, value, state_a, state_b, state_p):
    ct = torch.promote_types(key.dtype, torch.float32)
    w = -torch.exp(time_decay.to(ct))
    u = time_first.to(ct)
    kk, vv = key.to(ct), value.to(ct)
    a, b, p = state_a.to(ct), state_b.to(ct), state_p.to(ct)
    ys = []
    for t in range(kk.shape[1]):
        kt, vt = kk[:, t], vv[:, t]
        ww = u + kt
        q = torch.maximum(p, ww)
        e1, e2 = torch.exp(p - q), torch.exp(ww - q)
        ys.append((e1 * a + e2 * vt) / (e1 * b + e2))
        ww = w + p
        q = torch.maximum(ww, kt)
        e1, e2 = torch.exp(ww - q), torch.exp(kt - q)
        a = e1 * a + e2 * vt
        b = e1 * b + e2
        p = q
    od = key.dtype
    return torch.stack(ys, dim=1).to(od), a.to(od), b.to(od), p.to(od)


def eager(time_decay, key, time_first, value, state_a, state_b, state_p):
    """Chunks of 64 tokens. Inside a chunk, the carried state seen at step t is e^{p + t w} (a, b) and the
    chunk's own tokens i < t contribute e^{(t-1-i) w + k_i} (v_i, 1) = e^{(t-1) w + m} e^{r_i - m} (v_i, 1)
    with r_i = k_i - i w and m = max_i r_i, so exclusive cumulative sums of e^{r_i - m} (v_i, 1) give
    every step's sum; each step is scaled by the largest of its three exponents."""
    ct = torch.promote_types(key.dtype, torch.float32)
    w = -torch.exp(time_decay.to(ct))
    u = time_first.to(ct)
    kk, vv = key.to(ct), value.to(ct)
    a, b, p = state_a.to(ct), state_b.to(ct), state_p.to(ct)
    T = kk.shape[1]
    ys = []
    for s in range(0, T, CHUNK):
        kc, vc = kk[:, s : s + CHUNK], vv[:, s : s + CHUNK]
        n = kc.shape[1]
        ix = torch.arange(n, device=kk.device, dtype=ct)[None, :, None]
        r = kc - ix * w
        m = r.amax(dim=1, keepdim=True)
        er = torch.exp(r - m)
        ca, cb = (er * vc).cumsum(1), er.cumsum(1)
        sa = torch.cat((torch.zeros_like(ca[:, :1]), ca[:, :-1]), 1)  # sums over i < t
        sb = torch.cat((torch.zeros_like(cb[:, :1]), cb[:, :-1]), 1)
        x_in = (ix - 1) * w + m  # exponent of the intra-chunk sums at step t
        x_c = p[:, None] + ix * w  # exponent of the carried state at step t
        x_b = u + kc  # the current token's bonus
        M = torch.maximum(torch.maximum(x_in, x_c), x_b)
        f_in, f_c, f_b = torch.exp(x_in - M), torch.exp(x_c - M), torch.exp(x_b - M)
        ys.append((f_in * sa + f_c * a[:, None] + f_b * vc) / (f_in * sb + f_c * b[:, None] + f_b))
        # state after the chunk: e^{(n-1) w + m} (ca, cb)[n-1] + e^{p + n w} (a, b)
        y_in, y_c = (n - 1) * w + m[:, 0], p + n * w
        pn = torch.maximum(y_in, y_c)
        g_in, g_c = torch.exp(y_in - pn), torch.exp(y_c - pn)
        a = g_in * ca[:, -1] + g_c * a
        b = g_in * cb[:, -1] + g_c * b
        p = pn
    od = key.dtype
    return torch.cat(ys, dim=1).to(od), a.to(od), b.to(od), p.to(od)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, C = BATCH[size], SEQ[size], CH[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    time_decay = torch.rand(C, generator=gen, device=device) * 5.0 - 6.0  # U(-6, -1)
    key = rn(B, T, C)
    time_first = rn(C)
    value = rn(B, T, C)
    state_a, state_b = rn(B, C), rn(B, C).abs()  # a denominator is positive (see META.upstream)
    state_p = torch.rand(B, C, generator=gen, device=device) * 4.0 - 2.0  # U(-2, 2)
    return time_decay, key, time_first, value, state_a, state_b, state_p
