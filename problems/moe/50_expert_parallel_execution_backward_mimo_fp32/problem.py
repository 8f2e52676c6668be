"""Backward of MiMo-V2-Flash's local experts on one expert-parallel rank (grouped SwiGLU FFN), fp32.

After the all-to-all, this rank holds N token-expert assignments for its EL local experts, grouped
by expert (expert 0's rows first, then expert 1's, ...; `counts` says how many each). Forward, for an
assignment n of expert e with routing weight prob[n]:
  h = x[n] @ w13[e]^T  (saved; h[:I] gate, h[I:] up),  a = silu(h[:I]) * h[I:],
  o = a @ w2[e]^T,     y[n] = prob[n] * o.

Inputs (H = 4096, I = 2048, EL = 8, N = 8192)
- x        float32 [N, H]      expert inputs, grouped by expert
- counts   int64   [EL]        rows per expert (sums to N; fixed per size)
- w13      float32 [EL, 2I, H] gate_proj rows then up_proj rows
- w2       float32 [EL, H, I]
- h        float32 [N, 2I]     saved pre-activation x @ w13^T
- prob     float32 [N]         routing weight of each assignment
- grad_y   float32 [N, H]      dL/dy

Gradients (explicit, float32; the reference promotes to float64 for the anchor; TF32 is not allowed):
  a recomputed from h; o = a @ w2^T; grad_prob = <grad_y, o> (per row); g_o = prob * grad_y;
  grad_w2[e] = g_o^T a; g_a = g_o @ w2[e]; with sg = sigmoid(gate):
  g_up = g_a * silu(gate); g_gate = g_a * up * sg * (1 + gate * (1 - sg));
  g_h = [g_gate, g_up]; grad_w13[e] = g_h^T x; grad_x = g_h @ w13[e].
Outputs: grad_x [N, H], grad_w13 [EL, 2I, H], grad_w2 [EL, H, I], grad_prob [N], all float32.
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype

SIZES = {"full": (8192, 4096, 2048, 8), "smoke": (24, 32, 16, 3)}  # N, H, I, EL
_N, _H, _I, _EL = SIZES["full"]

META = ProblemMeta(
    number=50,
    name="expert_parallel_execution_backward_mimo_fp32",
    family="moe",
    dtypes=("float32", "int64"),
    source_model="XiaomiMiMo/MiMo-V2-Flash",
    source_config="hidden_size 4096, moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8, hidden_act silu; EP 32 (8 local experts)",
    inputs=("x", "counts", "w13", "w2", "h", "prob", "grad_y"),
    outputs=(Output("grad_x"), Output("grad_w13"), Output("grad_w2"), Output("grad_prob")),
    structure_inputs=("counts",),
    flops=14 * _N * _H * _I,
    bytes=(_N * _H * 4 * 2 + _EL * 3 * _H * _I * 4 + _N * 2 * _I * 4 + _N * 4) + (_N * _H * 4 + _EL * 3 * _H * _I * 4 + _N * 4),
    peak="fp32_simt",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/50_expert_parallel_execution_backward_mimo_fp32.json',
        matches=('in_place', 'dtypes', "exactness"),
        differs=(
            ('outputs', 'upstream returns five gradients (separate gate/up/down weights); mkb four (fused w13) - not yet converted (issue #15 follow-up)'),
            ('computation', 'upstream: backward of routed SwiGLU experts over 256 experts from grad_output, hidden states, top-8 indices and weights and separate gate/up/down weights ([256, 1024, 4096] ...); mkb: 8 local experts with fused w13, per-expert counts and saved activations h - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: 6144 tokens, hidden 4096, intermediate 1024, 256 experts, top 8; mkb: 8192 rows, hidden 4096, intermediate 2048, 8 local experts - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: uniform random top-8 per token, N(0, 1) tensors; mkb's differ - not yet converted (issue #15 follow-up)"),
            ('structure_per_draw', "mkb's per-expert counts are fixed per size (a structure input); upstream redraws the selection per draw - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="N = 8192 assignments over 8 local experts (1024 on average, uneven: fixed per size). flops count the o recompute (for grad_prob) and the four weight/input gradient GEMMs.",
)


def reference(x, counts, w13, w2, h, prob, grad_y):
    cdt = compute_dtype(x)
    inter = w2.shape[-1]
    grad_x = torch.empty(x.shape, dtype=cdt, device=x.device)
    grad_w13 = torch.empty(w13.shape, dtype=cdt, device=x.device)
    grad_w2 = torch.empty(w2.shape, dtype=cdt, device=x.device)
    grad_prob = torch.empty(prob.shape, dtype=cdt, device=x.device)
    start = 0
    for e, n in enumerate(counts.tolist()):
        r = slice(start, start + n)
        start += n
        xe, he, W13, W2 = x[r].to(cdt), h[r].to(cdt), w13[e].to(cdt), w2[e].to(cdt)
        gate, up = he[:, :inter], he[:, inter:]
        sg = torch.sigmoid(gate)
        silu = gate * sg
        a = silu * up
        o = a @ W2.T
        gy = grad_y[r].to(cdt)
        grad_prob[r] = (gy * o).sum(-1)
        g_o = gy * prob[r].to(cdt)[:, None]
        grad_w2[e] = g_o.T @ a
        g_a = g_o @ W2
        g_h = torch.cat((g_a * up * sg * (1 + gate * (1 - sg)), g_a * silu), dim=-1)
        grad_w13[e] = g_h.T @ xe
        grad_x[r] = g_h @ W13
    return grad_x, grad_w13, grad_w2, grad_prob


def make_inputs(seed, *, device, size="full"):
    n, hd, inter, el = SIZES[size]
    sg = torch.Generator().manual_seed(5001)
    share = torch.softmax(torch.randn(el, generator=sg) * 0.4, 0)
    counts = (share * n).floor().long()
    counts[0] += n - int(counts.sum())
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, hd, generator=gen, device=device)
    w13 = torch.randn(el, 2 * inter, hd, generator=gen, device=device) * hd**-0.5
    w2 = torch.randn(el, hd, inter, generator=gen, device=device) * inter**-0.5
    rows = torch.repeat_interleave(torch.arange(el, device=device), counts.to(device))
    h = torch.cat([x[rows == e] @ w13[e].T for e in range(el)])
    prob = torch.rand(n, generator=gen, device=device) * 0.3 + 0.02
    grad_y = torch.randn(n, hd, generator=gen, device=device) * 1e-2
    return x, counts.to(device), w13, w2, h, prob, grad_y
