"""Backward of Qwen3-Coder-30B-A3B's MoE router: top-k normalisation, top-k, softmax and router projection.

Forward being differentiated (per token t, hidden H = 2048, E = 128 experts, top-8):
  router_logits = x @ gate_weight^T; p = softmax(router_logits) (float32, saved as routing_probs);
  the 8 largest p are selected (saved as selected_experts) and normalised: w_k = p_k / S_t with
  S_t = sum of the selected p (saved as routing_weights_sum; norm_topk_prob). The router logits are
  also an output of the block (the load-balancing loss reads them).

Inputs (saved tensors and incoming gradients; upstream's SOL-ExecBench recipe, T = 65536)
- hidden_states          bfloat16 [T, H]
- gate_weight            bfloat16 [E, H]
- routing_probs          float32  [T, E]   saved softmax output p
- selected_experts       int64    [T, 8]   the 8 largest p, best first
- routing_weights_sum    float32  [T, 1]   S_t
- grad_routing_weights   bfloat16 [T, 8]   dL/dw
- grad_router_logits     bfloat16 [T, E]   dL/d(router_logits) from the block's other use of the logits

Gradients (explicit, in float32; the reference promotes to float64 for the anchor):
  g_sel[t,k] = (g_w[t,k] - sum_j g_w[t,j] w_j) / S_t          (normalisation backward)
  g_p = g_sel scattered to [T, E] at selected_experts           (top-k backward)
  g_logits = p * (g_p - sum_e g_p * p) + grad_router_logits     (softmax backward, plus the direct gradient)
  grad_hidden_states = g_logits @ gate_weight                   -> bfloat16 [T, H]
  grad_gate_weight   = g_logits^T @ hidden_states               -> bfloat16 [E, H]
"""

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype

TOP_K = 8
SIZES = {"full": (65536, 2048, 128), "smoke": (16, 64, 16)}  # tokens, hidden, experts
_T, _H, _E = SIZES["full"]

META = ProblemMeta(
    number=46,
    name="router_dispatch_backward_qwen3_coder_30b_bf16",
    family="moe",
    dtypes=("bfloat16", "float32", "int64"),
    source_model="Qwen/Qwen3-Coder-30B-A3B-Instruct",
    source_config="hidden_size 2048, num_experts 128, num_experts_per_tok 8, norm_topk_prob true, softmax router; SOL-ExecBench workload T = 65536",
    inputs=("hidden_states", "gate_weight", "routing_probs", "selected_experts", "routing_weights_sum",
            "grad_routing_weights", "grad_router_logits"),
    outputs=(Output("grad_hidden_states"), Output("grad_gate_weight")),
    structure_inputs=("selected_experts",),
    flops=2 * (2 * _T * _E * _H) + 8 * _T * _E,
    bytes=(2 * _T * _H * 2 + 2 * _E * _H * 2 + _T * _E * (4 + 2) + _T * TOP_K * (8 + 2) + _T * 4),
    peak="memory",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/46_router_dispatch_backward_qwen3_coder_30b_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "upstream's reference also takes grad_expert_mask [128, 8, 65536], the gradient of "
             "the block's one-hot expert mask; the mask is built from integer expert ids, so no gradient depends "
             "on it, and mkb omits it (an input no output depends on fails mkb's audit). The recipe's reference "
             "body is masked: mkb reads it as the normalisation, top-k and softmax backward plus the direct logit "
             "gradient, then the router projection's two gradients, both returned in bf16."),
            ("distributions", "the recipe's scales of gate_weight and of the incoming gradients are masked; mkb "
             "draws gate_weight N(0, 1)/sqrt(2048), grad_routing_weights N(0, 1) and grad_router_logits "
             "0.01 N(0, 1) (the scale of a load-balancing-loss gradient: at N(0, 1) it swamps the routing "
             "path, whose inputs then no longer change the outputs beyond tolerance). As upstream: hidden_states N(0, 1), "
             "routing_probs the softmax of N(0, 1) logits, selected_experts their top-8, routing_weights_sum their "
             "sum."),
        ),
    ),
    notes=(
        "The recipe's reference body is masked; the computation is read from its description (backward through "
        "normalisation, top-k, softmax and router projection), its inputs and its two outputs (the hidden-state "
        "and router-weight gradients, in the inputs' bf16). ~69 GFLOP of fp32 GEMMs over 65536 tokens "
        "(~1.4 ms without TF32). Smoke: 16 tokens, hidden 64, 16 experts."
    ),
)


def reference(hidden_states, gate_weight, routing_probs, selected_experts, routing_weights_sum,
              grad_routing_weights, grad_router_logits):
    cdt = compute_dtype(hidden_states, routing_probs)
    p, s = routing_probs.to(cdt), routing_weights_sum.to(cdt)
    g_w = grad_routing_weights.to(cdt)
    w = p.gather(1, selected_experts) / s
    g_sel = (g_w - (g_w * w).sum(-1, keepdim=True)) / s
    g_p = torch.zeros_like(p).scatter_add_(1, selected_experts, g_sel)
    g_logits = p * (g_p - (g_p * p).sum(-1, keepdim=True)) + grad_router_logits.to(cdt)
    grad_x = g_logits @ gate_weight.to(cdt)
    grad_w = g_logits.T @ hidden_states.to(cdt)
    return grad_x.to(hidden_states.dtype), grad_w.to(gate_weight.dtype)


def make_inputs(seed, *, device, size="full"):
    t, h, e = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    hidden = torch.randn(t, h, generator=gen, device=device).to(bf)
    gate_weight = (torch.randn(e, h, generator=gen, device=device) / math.sqrt(h)).to(bf)
    probs = torch.softmax(torch.randn(t, e, generator=gen, device=device), dim=-1)
    top, selected = probs.topk(TOP_K, dim=-1)
    wsum = top.sum(-1, keepdim=True)
    grad_w = torch.randn(t, TOP_K, generator=gen, device=device).to(bf)
    grad_logits = (torch.randn(t, e, generator=gen, device=device) * 0.01).to(bf)
    return hidden, gate_weight, probs, selected, wsum, grad_w, grad_logits
