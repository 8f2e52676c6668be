"""Backward of Qwen3-Coder-30B-A3B's MoE router, combine and dispatch (with the load-balancing loss).

Forward being differentiated (per token t, hidden H = 2048, E = 128 experts, top-8):
  logits = x @ w_gate^T; p = softmax(logits) (float32); the 8 selected experts (saved as topk_idx)
  get weights w_k = p_k / sum_j p_j over the selected (norm_topk_prob); each selected expert receives
  a copy of x[t] (dispatch) and returns expert_out[t, k]; y[t] = sum_k w_k * expert_out[t, k]
  (combine). The router also adds the Switch/HF load-balancing loss
  aux = 0.001 * E * sum_e (count_e / T) * mean_t p[t, e], count_e = number of (t, k) routed to e
  (not differentiated).

Inputs (saved tensors and incoming gradients)
- x               bfloat16 [T, H]
- w_gate          bfloat16 [E, H]
- probs           float32  [T, E]   saved softmax output p
- topk_idx        int64    [T, 8]   saved selection (consistent with probs: the 8 largest p)
- expert_out      bfloat16 [T, 8, H] saved expert outputs, in topk_idx order
- grad_y          bfloat16 [T, H]   dL/dy
- grad_expert_in  bfloat16 [T, 8, H] dL/d(expert input copy), from the experts' backward
The loss's upstream gradient for aux is 1.

Gradients (computed explicitly in float32; the reference promotes to float64 for the anchor):
  g_w[t,k]  = <grad_y[t], expert_out[t,k]>
  g_sel[t,k] = (g_w[t,k] - sum_j g_w[t,j] w_j) / S_t,   S_t = sum of the selected p
  g_p = g_sel scattered to [T, E] at topk_idx, plus 0.001 * E * count_e / T^2 for every (t, e)
  g_logits = p * (g_p - sum_e g_p * p)               (softmax backward)
  grad_x = sum_k grad_expert_in[t, k] + g_logits @ w_gate      -> bfloat16 [T, H]
  grad_w_gate = g_logits^T @ x                                  -> float32 [E, H] (fp32 main grad)
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype
from mkb.problems.routing import expert_popularity

TOP_K, AUX_COEF = 8, 0.001
SIZES = {"full": (8192, 2048, 128), "smoke": (16, 64, 16)}  # tokens, hidden, experts
_T, _H, _E = SIZES["full"]

META = ProblemMeta(
    number=46,
    name="router_dispatch_backward_qwen3_coder_30b_bf16",
    family="moe",
    dtypes=("bfloat16", "float32", "int64"),
    source_model="Qwen/Qwen3-Coder-30B-A3B-Instruct",
    source_config="hidden_size 2048, num_experts 128, num_experts_per_tok 8, norm_topk_prob true, softmax router, router_aux_loss_coef 0.001",
    inputs=("x", "w_gate", "probs", "topk_idx", "expert_out", "grad_y", "grad_expert_in"),
    outputs=(Output("grad_x"), Output("grad_w_gate")),
    structure_inputs=("topk_idx",),
    flops=_T * TOP_K * _H * 2 + _T * TOP_K * _H + 2 * (2 * _T * _E * _H),
    bytes=(_T * _H * 2 * 2 + _E * _H * 2 + _T * _E * 4 + _T * TOP_K * 8 + 2 * _T * TOP_K * _H * 2
           + _T * _H * 2 + _E * _H * 4),
    peak="memory",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/46_router_dispatch_backward_qwen3_coder_30b_bf16.json',
        matches=('outputs', 'in_place', 'dtypes', "exactness"),
        differs=(
            ('computation', "upstream's backward takes hidden states, the gate weight, routing probabilities, selected experts, the routing-weight sums and three incoming gradients (routing weights, expert mask, router logits); mkb's takes x, w_gate, probs, topk_idx, expert outputs and two gradients - not yet converted (issue #15 follow-up)"),
            ('shapes', 'upstream: 65536 tokens, hidden 2048, 128 experts, top 8; mkb: 8192 tokens (same hidden and experts) - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream draws its tensors N(0, 1) (scales hidden); mkb's differ - not yet converted (issue #15 follow-up)"),
            ('structure_per_draw', "mkb's topk_idx is fixed per size (a structure input); upstream draws the selection per draw - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="T = 8192 tokens (2 x 4k training sequences). topk_idx is a fixed (size-determined) routing with a popularity skew; probs are drawn per seed and arranged so the selected experts hold the 8 largest p.",
)


def reference(x, w_gate, probs, topk_idx, expert_out, grad_y, grad_expert_in):
    cdt = compute_dtype(x, probs)
    t, e = probs.shape
    p = probs.to(cdt)
    psel = p.gather(1, topk_idx)
    s = psel.sum(-1, keepdim=True)
    w = psel / s
    g_w = torch.einsum("th,tkh->tk", grad_y.to(cdt), expert_out.to(cdt))
    g_sel = (g_w - (g_w * w).sum(-1, keepdim=True)) / s
    count = torch.zeros(e, dtype=cdt, device=x.device).index_add_(0, topk_idx.flatten(), torch.ones(topk_idx.numel(), dtype=cdt, device=x.device))
    g_p = (AUX_COEF * e / t**2) * count[None, :].expand(t, e).clone()
    g_p.scatter_add_(1, topk_idx, g_sel)
    g_logits = p * (g_p - (g_p * p).sum(-1, keepdim=True))
    grad_x = grad_expert_in.to(cdt).sum(1) + g_logits @ w_gate.to(cdt)
    grad_w = g_logits.T @ x.to(cdt)
    out_dt = torch.bfloat16 if cdt == torch.float32 else cdt
    return grad_x.to(out_dt), grad_w


def make_inputs(seed, *, device, size="full"):
    t, h, e = SIZES[size]
    sg = torch.Generator().manual_seed(4601)  # routing structure: size-determined
    pop = expert_popularity(e, seed=4602, spread=0.3)
    topk_idx = (torch.rand(t, e, generator=sg, dtype=torch.float64) + 0.3 * pop.sigmoid()).topk(TOP_K, -1).indices.sort(-1).values
    gen = torch.Generator(device=device).manual_seed(seed)
    topk_idx = topk_idx.to(device)
    z = torch.randn(t, e, generator=gen, device=device) * 1.5
    zs = z.sort(-1, descending=True).values
    sel = torch.zeros(t, e, dtype=torch.bool, device=device).scatter_(1, topk_idx, True)
    perm = torch.rand(t, e, generator=gen, device=device).argsort(-1)
    # put the 8 largest logits on the selected experts and the rest elsewhere, each in random order
    order = (perm + (~sel).long() * e).argsort(-1)  # selected experts first, in random order
    logits = torch.empty_like(z).scatter_(1, order, zs)
    probs = torch.softmax(logits, -1)
    bf = torch.bfloat16
    x = torch.randn(t, h, generator=gen, device=device).to(bf)
    w_gate = (torch.randn(e, h, generator=gen, device=device) * h**-0.5).to(bf)
    expert_out = torch.randn(t, TOP_K, h, generator=gen, device=device).mul(0.5).to(bf)
    grad_y = torch.randn(t, h, generator=gen, device=device).mul(0.1).to(bf)
    grad_expert_in = torch.randn(t, TOP_K, h, generator=gen, device=device).mul(0.02).to(bf)
    return x, w_gate, probs, topk_idx, expert_out, grad_y, grad_expert_in
