"""Qwen3-Coder-480B-A35B MoE routing with capacity-factor token dropping and dispatch into expert buffers.

For a training micro-batch of T tokens (hidden H = 6144, E = 160 experts, top-8) this subgraph turns
router logits into a dropped, capacity-limited dispatch, as Megatron-style expert parallelism does
before the all-to-all.

Inputs
- hidden         bfloat16 [T, H]
- router_logits  float32  [T, E]   (the gate GEMM is upstream)

Numerics (float32; the reference promotes to float64 for the anchor):
1. p = softmax(router_logits) over E; the 8 experts with the largest p are selected and reported in
   ascending expert order; weight_k = p_k / sum of the 8 selected p (norm_topk_prob).
2. Capacity C = ceil(1.25 * T * 8 / E) slots per expert (capacity factor 1.25). Within each expert,
   assignments are ranked by token index (position policy); the assignment of token t to expert e
   gets slot = number of tokens t' < t also routed to e. If slot >= C the assignment is dropped:
   its slot is -1 and its weight is 0 (the weights of a token's kept assignments are not
   renormalised).
3. dispatched[e, slot] = hidden[t] for every kept assignment; unused slots are 0.

Outputs
- topk_idx     int64    [T, 8]  selected experts, ascending (compare: topk over softmax(router_logits))
- topk_weight  float32  [T, 8]  normalised weights, 0 where dropped
- slot         int32    [T, 8]  slot in the expert buffer, -1 where dropped (exact)
- dispatched   bfloat16 [E, C, H] (exact: copies of hidden rows, zero elsewhere)
"""

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype
from mkb.problems.routing import expert_popularity, select_topk, separate_topk, skewed_logits

TOP_K, CAPACITY_FACTOR = 8, 1.25
SIZES = {"full": (4096, 6144, 160), "smoke": (16, 64, 32)}  # tokens, hidden, experts
_T, _H, _E = SIZES["full"]
_C = math.ceil(CAPACITY_FACTOR * _T * TOP_K / _E)

META = ProblemMeta(
    number=45,
    name="capacity_factor_expert_dispatch_qwen3_coder_480b_bf16",
    family="moe",
    dtypes=("bfloat16", "float32", "int64", "int32"),
    source_model="Qwen/Qwen3-Coder-480B-A35B-Instruct",
    source_config="hidden_size 6144, num_experts 160, num_experts_per_tok 8, norm_topk_prob true, softmax router; capacity factor 1.25 (Megatron-style, position drop policy)",
    inputs=("hidden", "router_logits"),
    outputs=(
        Output("topk_idx", compare="topk", topk_scores="router_probs"),
        Output("topk_weight"),
        Output("slot", compare="exact"),
        Output("dispatched", compare="exact"),
    ),
    flops=_T * _E * 5 + _T * TOP_K * 4,
    bytes=_T * _H * 2 + _T * _E * 4 + _T * TOP_K * (8 + 4 + 4) + _E * _C * _H * 2,
    peak="memory",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/45_capacity_factor_expert_dispatch_qwen3_coder_480b_bf16.json',
        matches=('in_place', 'dtypes', 'structure_per_draw'),
        differs=(
            ('computation', "upstream's problem takes the selected experts and routing weights and runs the capacity-limited dispatch, batched SwiGLU experts (gate/up [160, 6144, 2560], down [160, 2560, 6144]) and the combine; mkb's takes hidden states and router logits and computes only the routing and capacity-limited dispatch - not yet converted (issue #15 follow-up)"),
            ('outputs', 'upstream returns the combined [8192, 6144] output; mkb the dispatch (buffers and indices) - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: 8192 tokens, hidden 6144, intermediate 2560, 160 experts, top 8; mkb: 4096 tokens, hidden 6144, 160 experts - not yet converted (issue #15 follow-up)'),
            ('distributions', 'upstream: expert choices by Gumbel top-8 over a N(0, 0.25) popularity; mkb: skewed router logits - not yet converted (issue #15 follow-up)'),
            ("exactness", "mkb compares `topk_idx` as `topk` (index sets equal up to swaps of near-tied scores), where upstream compares the indices exactly"),
        ),
    ),
    notes=(
        "T = 4096 tokens (one 4k-sequence micro-batch), C = 256. A fixed per-expert popularity skew makes the "
        "popular experts overflow (about 4% of assignments dropped at full size); logits are nudged so the top-8 beats "
        "the 9th by >= 1e-5 in probability. dispatched and slot are exact copies/integers (their fp64 gap is 0); "
        "topk_weight carries the rounding."
    ),
)


def router_probs(hidden, router_logits):
    return torch.softmax(router_logits.to(compute_dtype(router_logits)), dim=-1)


def reference(hidden, router_logits):
    cdt = compute_dtype(router_logits, hidden)
    t, h = hidden.shape
    e = router_logits.shape[1]
    cap = math.ceil(CAPACITY_FACTOR * t * TOP_K / e)
    p = torch.softmax(router_logits.to(cdt), dim=-1)
    idx = select_topk(p, TOP_K)
    w = p.gather(1, idx)
    w = w / w.sum(-1, keepdim=True)
    onehot = torch.zeros(t, e, dtype=torch.int64, device=hidden.device).scatter_(1, idx, 1)
    pos = (onehot.cumsum(0) - onehot).gather(1, idx)  # earlier tokens routed to the same expert
    keep = pos < cap
    slot = torch.where(keep, pos, -1).to(torch.int32)
    w = torch.where(keep, w, 0)
    disp = torch.zeros(e * cap, h, dtype=hidden.dtype, device=hidden.device)
    tok = torch.arange(t, device=hidden.device)[:, None].expand(t, TOP_K)
    dest = (idx * cap + pos)[keep]
    disp[dest] = hidden[tok[keep]]
    return idx, w, slot, disp.view(e, cap, h)


def make_inputs(seed, *, device, size="full"):
    t, h, e = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    pop = expert_popularity(e, seed=4501, spread=0.15).to(device)
    logits = skewed_logits(t, e, gen=gen, popularity=pop, std=1.0)
    logits = separate_topk(logits, lambda z: torch.softmax(z, dim=-1), top_k=TOP_K, margin=1e-5).float()
    hidden = (torch.randn(t, h, generator=gen, device=device)).to(torch.bfloat16)
    return hidden, logits
