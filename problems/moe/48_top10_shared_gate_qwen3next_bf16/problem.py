"""Qwen3-Next-80B-A3B sparse MoE block: router GEMM, softmax top-10 of 512 experts, sigmoid-gated shared expert.

Inputs (upstream's SOL-ExecBench recipe: B x S = 64 x 613 tokens, hidden H = 2048, E = 512 experts,
top-10, expert intermediate I = 512, shared expert intermediate Is = 512; all bfloat16)
- hidden_states       [B, S, H]
- router_weight       [E, H]       router (nn.Linear layout, no bias)
- w_gate, w_up        [E, I, H]    expert gate_proj / up_proj
- w_down              [E, H, I]
- shared_gate_proj, shared_up_proj [Is, H],  shared_down_proj [H, Is]
- shared_expert_gate  [1, H]       Linear H -> 1, no bias

Numerics (float32, the promotion of bf16 and float32; the reference promotes to float64 for the anchor):
  router_logits = hidden @ router_weight.T; p = softmax(router_logits); select the 10 largest p;
  w_k = p_k / sum of the 10 selected (norm_topk_prob), rounded to the hidden dtype (bf16) as the HF block
  does; expert(x) = down(silu(gate(x)) * up(x)).
  out = sum_k w_k * expert_k(x) + sigmoid(x . shared_expert_gate) * shared_expert(x)
Outputs: out bfloat16 [B, S, H] (rounded once) and router_logits bfloat16 [B*S, E].
"""

import math

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype

TOP_K = 10
DECISION_MARGIN, REDRAW_LIMIT = 1e-5, 16
SIZES = {"full": (64, 613, 2048, 512, 512, 512), "smoke": (2, 8, 64, 32, 512, 32)}  # B, S, H, I, E, Is
_B, _S, _H, _I, _E, _IS = SIZES["full"]
_T = _B * _S

META = ProblemMeta(
    number=48,
    name="top10_shared_gate_qwen3next_bf16",
    family="moe",
    dtypes=("bfloat16",),
    source_model="Qwen/Qwen3-Next-80B-A3B-Instruct",
    source_config="hidden_size 2048, num_experts 512, num_experts_per_tok 10, moe_intermediate_size 512, shared_expert_intermediate_size 512, norm_topk_prob true, shared_expert_gate Linear(2048, 1); SOL-ExecBench workload 64 x 613 tokens",
    inputs=("hidden_states", "router_weight", "w_gate", "w_up", "w_down", "shared_gate_proj", "shared_up_proj",
            "shared_down_proj", "shared_expert_gate"),
    outputs=(Output("out"), Output("router_logits")),
    flops=_T * (2 * _H * _E + TOP_K * 3 * 2 * _H * _I + 3 * 2 * _H * _IS + 2 * _H),
    bytes=2 * (_E * 3 * _H * _I + 3 * _H * _IS + _H + _E * _H + 2 * _T * _H + _T * _E),
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/48_top10_shared_gate_qwen3next_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(
            ("computation", "the recipe's reference body is masked; mkb reads its two outputs as (block output, router logits in the hidden dtype) and keeps the HF block's rounding of the normalised routing weights to bf16; everything else is fp32."),
        ),
    ),
    notes=(
        "Inputs as upstream's recipe: hidden N(0, 1), every weight N(0, 1)/sqrt(fan-in), all bf16; rows of "
        "hidden_states are redrawn (up to 16 times) until the 10th and 11th probabilities differ by >= 1e-5 "
        "(mkb computes the gap in float64). The recipe's reference body is masked: its two outputs are read as "
        "(block output, router logits in the hidden dtype), and its rounding of the normalised routing weights "
        "to the hidden dtype (the HF block's) is kept; everything else is float32. ~2.7 TFLOP over 39232 tokens "
        "(~770 tokens per expert). The eager baseline groups tokens by expert into zero-padded blocks and runs "
        "bf16 bmm's (a per-expert loop over 512 experts is launch-bound). Smoke: 16 tokens, H 64, I 32, Is 32, "
        "the full routing."
    ),
)


def _route(x, router_weight, cdt, dt):
    logits = x.to(cdt) @ router_weight.to(cdt).T
    p = torch.softmax(logits, dim=-1)
    w, idx = p.topk(TOP_K, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dt).to(cdt)
    return logits, idx, w


def _shared(x, shared_gate_proj, shared_up_proj, shared_down_proj, shared_expert_gate, cdt, mdt):
    a = F.silu((x.to(mdt) @ shared_gate_proj.to(mdt).T).to(cdt)) * (x.to(mdt) @ shared_up_proj.to(mdt).T).to(cdt)
    y = (a.to(mdt) @ shared_down_proj.to(mdt).T).to(cdt)
    return torch.sigmoid(x.to(cdt) @ shared_expert_gate.to(cdt).T) * y


def reference(hidden_states, router_weight, w_gate, w_up, w_down, sg, su, sd, shared_expert_gate):
    cdt = compute_dtype(hidden_states)
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    logits, idx, w = _route(x, router_weight, cdt, hidden_states.dtype)
    out = _shared(x, sg, su, sd, shared_expert_gate, cdt, cdt)
    xc = x.to(cdt)
    for e in idx.unique().tolist():
        tok, slot = (idx == e).nonzero(as_tuple=True)
        a = F.silu(xc[tok] @ w_gate[e].to(cdt).T) * (xc[tok] @ w_up[e].to(cdt).T)
        out.index_add_(0, tok, (a @ w_down[e].to(cdt).T) * w[tok, slot, None])
    dt = torch.bfloat16 if cdt == torch.float32 else cdt
    return out.reshape(hidden_states.shape).to(dt), logits.to(dt)


def eager(hidden_states, router_weight, w_gate, w_up, w_down, sg, su, sd, shared_expert_gate):
    """bf16 GEMMs (fp32 accumulation) with a bf16 hidden activation, the router in fp32, as the HF model runs.

    The routed experts run as bmm's over tokens grouped by expert and zero-padded to the busiest expert's
    count (one host sync): a per-expert loop over 512 experts is launch-bound and leaves the eager band.
    """
    cdt, mdt = torch.float32, hidden_states.dtype
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    logits, idx, w = _route(x, router_weight, cdt, mdt)
    out = _shared(x, sg, su, sd, shared_expert_gate, cdt, mdt)
    flat = idx.flatten()
    order = flat.argsort(stable=True)
    exp_sorted = flat[order]
    counts = torch.bincount(flat, minlength=w_gate.shape[0])
    pos = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[exp_sorted]
    tok = order // TOP_K
    xg = torch.zeros(w_gate.shape[0], int(counts.max()), x.shape[1], dtype=mdt, device=x.device)
    xg[exp_sorted, pos] = x[tok]
    a = F.silu(torch.bmm(xg, w_gate.transpose(1, 2)).float()) * torch.bmm(xg, w_up.transpose(1, 2)).float()
    y = torch.bmm(a.to(mdt), w_down.transpose(1, 2))
    out.index_add_(0, tok, y[exp_sorted, pos].float() * w.flatten()[order][:, None])
    return out.reshape(hidden_states.shape).to(mdt), logits.to(mdt)


def _unstable(x, router_weight):
    p = torch.softmax(x.double() @ router_weight.double().T, dim=-1)
    top = p.topk(TOP_K + 1, dim=-1).values
    return top[:, TOP_K - 1] - top[:, TOP_K] < DECISION_MARGIN


def make_inputs(seed, *, device, size="full"):
    b, s, h, inter, e, ish = SIZES[size]
    meta = str(device) == "meta"  # shapes only: no values, so no margin check
    gen = torch.Generator(device="cpu" if meta else device).manual_seed(seed)
    bf = torch.bfloat16

    def w(*shape):
        return (torch.randn(*shape, generator=gen, device=device) / math.sqrt(shape[-1])).to(bf)

    hidden = torch.randn(b, s, h, generator=gen, device=device).to(bf)
    router_weight = w(e, h)
    weights = (w(e, inter, h), w(e, inter, h), w(e, h, inter), w(ish, h), w(ish, h), w(h, ish), w(1, h))
    flat = hidden.view(-1, h)
    rows = torch.arange(b * s, device=device)
    for _ in range(REDRAW_LIMIT):
        if meta:
            break
        bad = rows[_unstable(flat[rows], router_weight)]
        if bad.numel() == 0:
            break
        flat[bad] = torch.randn(bad.numel(), h, generator=gen, device=device).to(bf)
        rows = bad
    else:
        raise RuntimeError(f"problem 48: routing margins under {DECISION_MARGIN} persist after {REDRAW_LIMIT} redraws (seed {seed})")
    return (hidden, router_weight) + weights
