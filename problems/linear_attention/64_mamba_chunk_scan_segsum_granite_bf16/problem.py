"""Mamba2 chunked selective scan (SSD) with segment sums over per-step log decays, one group of B/C, bf16.

Upstream MetaKernelBench's problem 64 (a SOL-ExecBench recipe): the SSD core with the discretised decay
already applied: per batch b, head h and step t a log decay a[b, h, t] < 0 is an input (no dt, dt_bias or
A_log). With S_{-1} = initial_state[b, h] ([P, N]), for t = 0..T-1, in fp32 (the promoted dtype):

    S_t = exp(a[b, h, t]) * S_{t-1} + outer(x_t, B_t)
    y_t = S_t @ C_t + D[h] * x_t

Layouts: hidden_states (x) bf16 [B, T, H, P]; A (the log decays a) bf16 [B, H, T]; Bm, Cm bf16 [B, T, 1, N];
D bf16 [H]; initial_state bf16 [B, H, P, N]. Outputs: y bf16 [B, T, H, P] and final_state bf16
[B, H, P, N], each rounded once (fp32 in between). `reference` runs the exact recurrence; `eager` is the
chunked form with segment sums (`ssd_minimal_discrete`, chunk 256): the intra-chunk block uses
L = exp(segsum(a)), states pass between chunks.
Full size as the recipe: batch 8 x 1024 tokens, 16 heads of 64, state 256, 1 group, chunk 256.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.linear import ssd_chunked

BATCH = {"full": 8, "smoke": 1}
SEQ = {"full": 1024, "smoke": 300}
HEADS = {"full": 16, "smoke": 4}
HEAD_DIM = {"full": 64, "smoke": 8}
STATE = {"full": 256, "smoke": 16}
GROUPS = 1
CHUNK = 256

_f = "full"
_B, _T, _H, _P, _N, _l = BATCH[_f], SEQ[_f], HEADS[_f], HEAD_DIM[_f], STATE[_f], CHUNK

META = ProblemMeta(
    number=64,
    name="mamba_chunk_scan_segsum_granite_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="Granite 4.0-H style Mamba2 SSD core; SOL-ExecBench recipe",
    source_config="batch 8 x 1024 tokens, 16 heads of 64, state 256, 1 group, chunk 256; per-step log decay "
    "U(-0.02, -0.0005) given directly, D skip, initial state",
    inputs=("hidden_states", "A", "Bm", "Cm", "D", "initial_state"),
    outputs=(Output("y"), Output("final_state")),
    # chunked SSD: C B^T per group (2 l^2 N), masked (.)X per head (2 l^2 P / 2 causal ~ 2 l P per token),
    # chunk states and state output (2 * 2 P N per token per head)
    flops=float(_B * _T * (GROUPS * 2 * _l * _N + _H * (2 * _l * _P + 4 * _P * _N))),
    bytes=float(_B * _T * (_H * (2 * _P + 1) + 2 * GROUPS * _N) * 2 + 2 * _B * _H * _P * _N * 2 + _H * 2),
    peak="bf16_tc",
    insensitive_inputs=(
        ("D", "the skip term D[h] x_t (|D x| up to ~10 for the recipe's N(0, 1) draws) is below y's tolerance at full "
         "size, 3 x eps(bf16) x max|y| = 15.6 with |y| up to ~670 from a 256-wide state (measured on the CPU at full "
         "size: redrawing D left y within it). Upstream's accuracy rule is the same, so dropping D passes there too; "
         "it saves one multiply-add per output element. The smoke audit (state 16) checks D."),
    ),
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/64_mamba_chunk_scan_segsum_granite_bf16.json",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(),
    ),
    notes="Inputs as the recipe: x, B, C, D and the initial state N(0, 1), the log decays U(-0.02, -0.0005), all "
    "bf16. The reference is the token-by-token recurrence (its float64 run is the anchor); eager is the chunked "
    "segsum form. States are bf16 in memory so a chunked kernel is judged at storage precision.",
)


def _recurrence(x, a, Bm, Cm, S):
    """Exact S_t = exp(a_t) S_{t-1} + x_t B_t^T, y_t = S_t C_t; x [b, T, H, P], a [b, T, H], Bm/Cm [b, T, G, N]."""
    H, G = x.shape[2], Bm.shape[2]
    Bh = Bm.repeat_interleave(H // G, dim=2)
    Ch = Cm.repeat_interleave(H // G, dim=2)
    ys = []
    for t in range(x.shape[1]):
        S = S * torch.exp(a[:, t])[..., None, None] + x[:, t, :, :, None] * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", S, Ch[:, t]))
    return torch.stack(ys, dim=1), S


def _scan(hidden_states, A, Bm, Cm, D, initial_state, *, chunked):
    ct = torch.promote_types(hidden_states.dtype, torch.float32)
    x = hidden_states.to(ct)
    a = A.to(ct).transpose(1, 2)  # [B, T, H]
    S = initial_state.to(ct)
    if chunked:
        y, S = _chunked(x, a, Bm.to(ct), Cm.to(ct), S)
    else:
        y, S = _recurrence(x, a, Bm.to(ct), Cm.to(ct), S)
    y = y + D.to(ct)[:, None] * x
    return y.to(hidden_states.dtype), S.to(initial_state.dtype)


def _chunked(x, a, Bm, Cm, S):
    """mkb.problems.linear.ssd_chunked on per-step log decays: it decays by exp(dt A) and feeds dt x, so dt = -a
    (> 0) with A = -1 gives the decay exp(a), and x / dt undoes the input scaling (to float32 rounding)."""
    dt = -a
    A_unit = -torch.ones(x.shape[2], dtype=x.dtype, device=x.device)
    return ssd_chunked(x / dt[..., None], dt, A_unit, Bm, Cm, S, chunk=CHUNK)


def reference(hidden_states, A, Bm, Cm, D, initial_state):
    return _scan(hidden_states, A, Bm, Cm, D, initial_state, chunked=False)


def eager(hidden_states, A, Bm, Cm, D, initial_state):
    return _scan(hidden_states, A, Bm, Cm, D, initial_state, chunked=True)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, P, N = BATCH[size], SEQ[size], HEADS[size], HEAD_DIM[size], STATE[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device).to(torch.bfloat16)

    x = rn(B, T, H, P)
    A = (torch.rand(B, H, T, generator=gen, device=device) * (0.02 - 0.0005) - 0.02).to(torch.bfloat16)
    Bm, Cm = rn(B, T, GROUPS, N), rn(B, T, GROUPS, N)
    D = rn(H)
    initial_state = rn(B, H, P, N)
    return x, A, Bm, Cm, D, initial_state
