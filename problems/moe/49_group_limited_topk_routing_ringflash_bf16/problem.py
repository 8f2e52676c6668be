"""Ring-flash-2.0 (BailingMoeV2) router: gate GEMM, sigmoid scores, expert bias, 8 groups keep 4, top-8.

Inputs (T = 16384 tokens, gating dim D = 4096, E = 256 experts; upstream's SOL-ExecBench recipe)
- hidden_states          bfloat16 [T, D]
- weight                 bfloat16 [E, D]   router gate (nn.Linear layout, no bias)
- expert_bias            bfloat16 [E]      aux-free load-balancing bias (selection only)
- routed_scaling_factor  float (Python constant 2.5)

Numerics (float32, the promotion of bf16 and float32; the reference promotes to float64 for the anchor):
  logits = hidden_states @ weight.T; s = sigmoid(logits); c = s + expert_bias; the experts form 8
  contiguous groups of 32; a group's score is the sum of its 2 largest c; the 4 best groups are kept;
  the 8 experts with the largest c among them are selected, in descending order of c.
  weight_k = s_k / sum of the 8 selected s (norm_topk_prob), times routed_scaling_factor.

Outputs
- topk_indices  int64   [T, 8]  selected experts, best first; compared exactly (as upstream)
- topk_weights  float32 [T, 8]  in the same order
"""

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype
from mkb.problems.routing import group_mask

N_GROUP, TOPK_GROUP, TOP_K, SCALE = 8, 4, 8, 2.5
DECISION_MARGIN, REDRAW_LIMIT = 1e-4, 16
SIZES = {"full": (16384, 4096, 256), "smoke": (32, 128, 256)}  # tokens, gating dim, experts
_T, _D, _E = SIZES["full"]

META = ProblemMeta(
    number=49,
    name="group_limited_topk_routing_ringflash_bf16",
    family="moe",
    dtypes=("bfloat16", "float32", "int64"),
    source_model="inclusionAI/Ring-flash-2.0",
    source_config="hidden_size 4096, num_experts 256, num_experts_per_tok 8, n_group 8, topk_group 4, score_function sigmoid, moe_router_enable_expert_bias true, norm_topk_prob true, routed_scaling_factor 2.5; SOL-ExecBench workload T = 16384",
    inputs=("hidden_states", "weight", "expert_bias", "routed_scaling_factor"),
    outputs=(Output("topk_indices", compare="exact"), Output("topk_weights")),
    flops=2.0 * _T * _D * _E + _T * _E * 6,
    bytes=2.0 * (_T * _D + _E * _D + _E) + _T * TOP_K * (8 + 4),
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/49_group_limited_topk_routing_ringflash_bf16.json",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=(
        "Inputs as upstream's recipe: hidden N(0, 1), weight N(0, 1)/sqrt(4096), expert_bias N(0, 1), all bf16; "
        "rows of hidden_states are redrawn (up to 16 times) until the 4th/5th group scores and every adjacent pair "
        "of the 9 best kept expert scores differ by >= 1e-4 (mkb computes these gaps in float64), so the selection "
        "and its order are properties of the inputs and the indices can be compared exactly. The router GEMM "
        "reads bf16 operands, so a bf16 tensor-core GEMM with fp32 accumulation moves the logits by ~1e-6 only. "
        "Smoke: 32 tokens, gating dim 128, the full routing (256 experts)."
    ),
)


def _scores(hidden_states, weight, cdt):
    return torch.sigmoid(hidden_states.to(cdt) @ weight.to(cdt).T)


def _kept(c):
    return c.masked_fill(~group_mask(c, N_GROUP, TOPK_GROUP), float("-inf"))


def reference(hidden_states, weight, expert_bias, routed_scaling_factor):
    cdt = compute_dtype(hidden_states)
    s = _scores(hidden_states, weight, cdt)
    idx = _kept(s + expert_bias.to(cdt)).topk(TOP_K, dim=-1, sorted=True).indices
    w = s.gather(1, idx)
    return idx, w / w.sum(-1, keepdim=True) * routed_scaling_factor


def _unstable(hidden_states, weight, expert_bias):
    c = _scores(hidden_states, weight, torch.float64) + expert_bias.double()
    t, e = c.shape
    gs = c.view(t, N_GROUP, e // N_GROUP).topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
    group_gap = gs[:, TOPK_GROUP - 1] - gs[:, TOPK_GROUP]
    top = _kept(c).topk(TOP_K + 1, dim=-1, sorted=True).values
    expert_gap = (top[:, :-1] - top[:, 1:]).min(dim=-1).values
    return (group_gap < DECISION_MARGIN) | (expert_gap < DECISION_MARGIN)


def make_inputs(seed, *, device, size="full"):
    t, d, e = SIZES[size]
    meta = str(device) == "meta"  # shapes only: no values, so no margin check
    gen = torch.Generator(device="cpu" if meta else device).manual_seed(seed)
    bf = torch.bfloat16
    hidden = torch.randn(t, d, generator=gen, device=device).to(bf)
    weight = (torch.randn(e, d, generator=gen, device=device) / math.sqrt(d)).to(bf)
    bias = torch.randn(e, generator=gen, device=device).to(bf)
    rows = torch.arange(t, device=device)
    for _ in range(REDRAW_LIMIT):
        if meta:
            break
        bad = rows[_unstable(hidden[rows], weight, bias)]
        if bad.numel() == 0:
            break
        hidden[bad] = torch.randn(bad.numel(), d, generator=gen, device=device).to(bf)
        rows = bad
    else:
        raise RuntimeError(f"problem 49: routing margins under {DECISION_MARGIN} persist after {REDRAW_LIMIT} redraws (seed {seed})")
    return hidden, weight, bias, SCALE
