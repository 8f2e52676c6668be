"""Qwen3-Coder-480B-A35B MoE experts with capacity-factor token dropping: dispatch, batched SwiGLU experts, combine.

For T tokens (hidden H = 6144, E = 160 experts, top-8, expert intermediate I = 2560), given the router's
selection and weights, as Megatron-style expert parallelism runs it with a capacity factor:

1. Capacity C = ceil(1.25 * T * 8 / E) slots per expert. Within each expert, assignments are ranked by
   token index (then by slot k); the assignment of token t to expert e is kept if fewer than C earlier
   assignments went to e, else dropped (its contribution is 0; a token's kept weights are not renormalised).
2. Each kept assignment runs the expert: y = (silu(x @ gate[e]) * (x @ up[e])) @ down[e]
   (weights in [E, in, out] layout).
3. out[t] = sum over the token's kept assignments of routing_weights[t, k] * y.

Inputs (upstream's SOL-ExecBench recipe)
- hidden_states        bfloat16 [T, H]
- selected_experts     int64    [T, 8]     8 distinct experts per token
- routing_weights      bfloat16 [T, 8]
- expert_gate_weights  bfloat16 [E, H, I];  expert_up_weights [E, H, I];  expert_down_weights [E, I, H]
Output: out bfloat16 [T, H] (the reference computes in float32 and rounds once).
"""

import math

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype

TOP_K, CAPACITY_FACTOR, POPULARITY_STD = 8, 1.25, 0.5
SIZES = {"full": (8192, 6144, 2560, 160), "smoke": (16, 64, 32, 16)}  # tokens, hidden, intermediate, experts
_T, _H, _I, _E = SIZES["full"]
_C = math.ceil(CAPACITY_FACTOR * _T * TOP_K / _E)

META = ProblemMeta(
    number=45,
    name="capacity_factor_expert_dispatch_qwen3_coder_480b_bf16",
    family="moe",
    dtypes=("bfloat16", "int64"),
    source_model="Qwen/Qwen3-Coder-480B-A35B-Instruct",
    source_config="hidden_size 6144, num_experts 160, num_experts_per_tok 8, moe_intermediate_size 2560, hidden_act silu; SOL-ExecBench workload T = 8192; capacity factor 1.25 (mkb's)",
    inputs=("hidden_states", "selected_experts", "routing_weights", "expert_gate_weights", "expert_up_weights",
            "expert_down_weights"),
    outputs=(Output("out"),),
    structure_inputs=("selected_experts",),
    flops=_T * TOP_K * 3 * 2 * _H * _I,
    bytes=2 * (3 * _E * _H * _I + 2 * _T * _H + _T * TOP_K) + 8 * _T * TOP_K,
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/45_capacity_factor_expert_dispatch_qwen3_coder_480b_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe's capacity rule is masked (its constants list no capacity factor): mkb "
             "uses capacity C = ceil(1.25 * T * 8 / E) with assignments ranked by token index and dropped "
             "assignments contributing 0, the Switch/Megatron default; the rest of its masked body is read "
             "from its description (dispatch, batched SwiGLU experts with [E, in, out] weights, combine of the "
             "survivors weighted by routing_weights, fp32 throughout)."),
        ),
    ),
    notes=(
        "Inputs as upstream's recipe: hidden N(0, 1); selected_experts the Gumbel top-8 over a per-draw expert "
        "popularity 0.5 N(0, 1) (so popular experts overflow their capacity: the cutoff is observable); "
        "routing_weights U(0, 1) normalised to sum 1 per token; weights N(0, 1)/sqrt(fan-in), all bf16. "
        "C = 512 at full size. The eager baseline dispatches into [E, C, H] capacity buffers and runs bf16 bmm's "
        "(fp32 accumulation, bf16 hidden activation). Smoke: 16 tokens, H 64, I 32, 16 experts (C = 10)."
    ),
)


def _dispatch(selected_experts, n_experts):
    """Per assignment (t, k), row-major: its position in its expert's queue, and whether it fits the capacity."""
    t = selected_experts.shape[0]
    cap = math.ceil(CAPACITY_FACTOR * t * TOP_K / n_experts)
    flat = selected_experts.flatten()
    onehot = torch.zeros(flat.numel(), n_experts, dtype=torch.int64, device=flat.device)
    onehot.scatter_(1, flat[:, None], 1)
    pos = (onehot.cumsum(0) - onehot).gather(1, flat[:, None]).squeeze(1)
    return flat, pos, pos < cap, cap


def reference(hidden_states, selected_experts, routing_weights, expert_gate_weights, expert_up_weights,
              expert_down_weights):
    cdt = compute_dtype(hidden_states)
    x = hidden_states.to(cdt)
    flat, _, keep, _ = _dispatch(selected_experts, expert_gate_weights.shape[0])
    wts = routing_weights.to(cdt).flatten()
    tok_all = torch.arange(flat.numel(), device=flat.device) // TOP_K
    out = torch.zeros_like(x)
    for e in flat[keep].unique().tolist():
        sel = keep & (flat == e)
        tok = tok_all[sel]
        xe = x[tok]
        a = F.silu(xe @ expert_gate_weights[e].to(cdt)) * (xe @ expert_up_weights[e].to(cdt))
        out.index_add_(0, tok, (a @ expert_down_weights[e].to(cdt)) * wts[sel, None])
    return out.to(hidden_states.dtype)


def eager(hidden_states, selected_experts, routing_weights, expert_gate_weights, expert_up_weights,
          expert_down_weights):
    """Capacity buffers [E, C, H] filled with the kept assignments, bf16 bmm's, weighted combine."""
    n_e = expert_gate_weights.shape[0]
    flat, pos, keep, cap = _dispatch(selected_experts, n_e)
    tok = (torch.arange(flat.numel(), device=flat.device) // TOP_K)[keep]
    e, p = flat[keep], pos[keep]
    buf = hidden_states.new_zeros(n_e, cap, hidden_states.shape[1])
    buf[e, p] = hidden_states[tok]
    a = F.silu(torch.bmm(buf, expert_gate_weights).float()) * torch.bmm(buf, expert_up_weights).float()
    y = torch.bmm(a.to(hidden_states.dtype), expert_down_weights)
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    out.index_add_(0, tok, y[e, p].float() * routing_weights.flatten()[keep].float()[:, None])
    return out.to(hidden_states.dtype)


def make_inputs(seed, *, device, size="full"):
    t, h, inter, n_e = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    hidden = torch.randn(t, h, generator=gen, device=device).to(bf)
    popularity = torch.randn(n_e, generator=gen, device=device) * POPULARITY_STD
    gumbel = -torch.log(-torch.log(torch.rand(t, n_e, generator=gen, device=device)))
    selected = (popularity + gumbel).argsort(dim=-1, descending=True)[:, :TOP_K]
    rw = torch.rand(t, TOP_K, generator=gen, device=device).to(bf)
    rw = rw / rw.sum(dim=-1, keepdim=True)

    def w(*shape):
        return (torch.randn(*shape, generator=gen, device=device) / math.sqrt(shape[1])).to(bf)

    return hidden, selected, rw, w(n_e, h, inter), w(n_e, h, inter), w(n_e, inter, h)
