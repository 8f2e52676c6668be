"""DeepSeek-V3 MoE layer on one expert-parallel rank: grouped sigmoid routing, fp8 block-scaled experts.

Computes, for T tokens with hidden size H = 7168, the routed-expert output of a DeepSeek-V3 MoE layer
whose 256 experts are split over 8 expert-parallel ranks; this rank owns the 32 experts
[local_expert_offset, local_expert_offset + 32). Shared experts are not part of this subgraph.

Inputs
- routing_logits  float32 [T, 256]      router logits (the gate GEMM is upstream).
- routing_bias    float32 [256]         e_score_correction_bias (used for selection only).
- hidden          float8_e4m3fn [T, H]  token activations, fp8 with 1x128 block scales:
- hidden_scale    float32 [T, H/128]    value = float(hidden[t, c]) * hidden_scale[t, c // 128].
- w13             float8_e4m3fn [32, 2I, H]  per local expert: rows 0..I-1 gate_proj, rows I..2I-1 up_proj
- w13_scale       float32 [32, 2I/128, H/128] (I = 2048), 128x128 block scales.
- w2              float8_e4m3fn [32, H, I]   down_proj, with
- w2_scale        float32 [32, H/128, I/128] 128x128 block scales.
- local_expert_offset  int (Python constant; 96 at full size, rank 3 of 8).

Routing (DeepSeek-V3 "noaux_tc"), in float32:
  s = sigmoid(logits); c = s + bias; groups are 8 contiguous blocks of 32 experts; a group's score is
  the sum of its two largest c; keep the 4 best groups (other experts' c set to -inf); select the
  8 experts with the largest c; weight_k = s_k / sum_j s_j (over the 8 selected) * 2.5.
Experts (for every (token, k) whose expert is local): x = dequantised hidden row;
  h = x @ dequant(w13[e])^T; a = silu(h[:I]) * h[I:]; a is re-quantised to fp8 e4m3 with 1x128 block
  scales (scale = amax/448 in float32, round to nearest even; mkb.problems.quant.fp8_quantize) and
  dequantised; y = a @ dequant(w2[e])^T. out[t] = sum over local selected experts of weight_k * y.
  Tokens with no local expert give 0. All arithmetic except the fp8 casts is float32 (the
  reference promotes to float64 for the anchor); the output is rounded once to bfloat16 [T, H].
"""

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta
from mkb.problems.quant import blocky_weight, compute_dtype, fp8_dequantize, fp8_quantize
from mkb.problems.routing import expert_popularity, select_topk, separate_topk, skewed_logits

N_GROUP, TOPK_GROUP, TOP_K, SCALE = 8, 4, 8, 2.5
EP_RANK, EP_SIZE = 3, 8
# size -> (tokens, hidden, moe_intermediate, routed experts)
SIZES = {"full": (1024, 7168, 2048, 256), "smoke": (8, 256, 128, 64)}

META = ProblemMeta(
    number=44,
    name="grouped_routing_block_scale_deepseek_fp8",
    family="moe",
    dtypes=("float8_e4m3fn", "float32", "bfloat16"),
    source_model="deepseek-ai/DeepSeek-V3",
    source_config=(
        "hidden_size 7168, moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8, "
        "n_group 8, topk_group 4, scoring_func sigmoid, topk_method noaux_tc, norm_topk_prob true, "
        "routed_scaling_factor 2.5, quantization fp8 e4m3 weight_block_size [128, 128], dynamic 1x128 activations; "
        "EP 8 (32 local experts)"
    ),
    inputs=("routing_logits", "routing_bias", "hidden", "hidden_scale", "w13", "w13_scale", "w2", "w2_scale", "local_expert_offset"),
    outputs=(Output("out"),),
    flops=1024 * 8 / EP_SIZE * 2 * 3 * 7168 * 2048,
    bytes=32 * 3 * 7168 * 2048 + 32 * 3 * 56 * 16 * 4 + 1024 * 7168 * (1 + 2) + 1024 * 56 * 4 + 1024 * 256 * 4 + 256 * 4,
    peak="memory",
    notes=(
        "T=1024 decode/serving batch on one EP rank; expert load ~T*8/8 token-expert pairs. Router logits are drawn "
        "with a fixed per-expert popularity skew and nudged so the selected groups and experts beat the rest by >= 1e-3."
    ),
)



def _moe(routing_logits, routing_bias, hidden, hidden_scale, w13, w13_scale, w2, w2_scale, local_expert_offset, *, mm_dtype=None):
    cdt = compute_dtype(routing_logits)
    mdt = mm_dtype or cdt
    s = torch.sigmoid(routing_logits.to(cdt))
    idx = select_topk(s + routing_bias.to(cdt), TOP_K, n_group=N_GROUP, topk_group=TOPK_GROUP)
    wts = s.gather(1, idx)
    wts = wts / wts.sum(-1, keepdim=True) * SCALE
    x = fp8_dequantize(hidden, hidden_scale, (1, 128), mdt)
    t, h = x.shape
    inter = w2.shape[-1]
    out = torch.zeros(t, h, dtype=cdt, device=x.device)
    for le in range(w13.shape[0]):
        tok, slot = (idx == local_expert_offset + le).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        hh = x[tok] @ fp8_dequantize(w13[le], w13_scale[le], (128, 128), mdt).T
        a = (F.silu(hh[:, :inter].to(cdt)) * hh[:, inter:].to(cdt))
        aq, asc = fp8_quantize(a, (1, 128))
        a = fp8_dequantize(aq, asc, (1, 128), mdt)
        y = (a @ fp8_dequantize(w2[le], w2_scale[le], (128, 128), mdt).T).to(cdt)
        out.index_add_(0, tok, y * wts[tok, slot, None])
    return out.to(torch.bfloat16 if cdt == torch.float32 else cdt)


def reference(*inputs):
    return _moe(*inputs)


def eager(*inputs):
    """Same computation with the expert GEMMs in bfloat16 (fp32 accumulation), as a serving stack would run it."""
    return _moe(*inputs, mm_dtype=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    t, h, inter, e = SIZES[size]
    el = e // EP_SIZE
    gen = torch.Generator(device=device).manual_seed(seed)
    pop = expert_popularity(e, seed=4401, spread=0.5).to(device)
    logits = skewed_logits(t, e, gen=gen, popularity=pop, std=1.5)
    bias = ((torch.rand(e, generator=gen, device=device) - 0.5) * 0.2).float()
    b64 = bias.double()
    logits = separate_topk(logits, lambda z: torch.sigmoid(z) + b64, top_k=TOP_K, margin=1e-3,
                           n_group=N_GROUP, topk_group=TOPK_GROUP, lower=True).float()
    x = torch.randn(t, h, generator=gen, device=device) * (0.5 + torch.rand(t, 1, generator=gen, device=device))
    hidden, hidden_scale = fp8_quantize(x, (1, 128))
    w13, w13_scale = fp8_quantize(blocky_weight((el, 2 * inter, h), (128, 128), gen, device, std=h**-0.5), (128, 128))
    w2, w2_scale = fp8_quantize(blocky_weight((el, h, inter), (128, 128), gen, device, std=inter**-0.5), (128, 128))
    return logits, bias, hidden, hidden_scale, w13, w13_scale, w2, w2_scale, EP_RANK * el
