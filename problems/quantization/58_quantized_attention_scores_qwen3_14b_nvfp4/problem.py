"""Qwen3-14B GQA attention core with both GEMMs in nvfp4: Q and K quantised for the scores, the probabilities and V for the output.

Upstream MetaKernelBench's problem 58 (a SOL-ExecBench recipe): batch 64 x 256 tokens, 40 query heads
and 8 key/value heads of dimension 128, an additive causal mask passed as an input; the reference
returns the attention output and the probabilities.

Inputs (B = 64, Hq = 40, Hkv = 8, S = 256, D = 128)
- query_states  bfloat16 [B, Hq, S, D]
- key_states, value_states  bfloat16 [B, Hkv, S, D]
- attention_mask  bfloat16 [B, 1, S, S]   0 on and below the diagonal, bfloat16's lowest value above
  (the same for every draw)

nvfp4 (mkb.problems.quant): for a tensor t, a dynamic per-tensor global scale g = amax(|t|) / (6 * 448)
(float32, over the whole tensor), per 16 consecutive elements along the last dim block_scale =
e4m3(min(amax_block / (6 g), 448)) and code = e2m1(v / (block_scale * g)) (ties to even).
Numerics (float32; the reference promotes to float64 for the anchor; the quantisation casts are
fixed). Query head h reads kv head h // 5.
  scores = dequant(nvfp4(q)) @ dequant(nvfp4(k))^T, rounded to bfloat16 (as upstream rounds the
           GEMM to the input dtype); s = scores / sqrt(D) + attention_mask
  attn_weights = softmax(s) over keys, rounded to bfloat16          -> output 2 [B, Hq, S, S]
  attn_output = dequant(nvfp4(attn_weights)) @ dequant(nvfp4(v^T))^T, v^T = [.., D, S] so V's
           blocks run along the key positions (the PV contraction), rounded to bfloat16
                                                                     -> output 1 [B, Hq, S, D]
"""

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_dequantize, nvfp4_global_scale, nvfp4_quantize, out_dtype

SIZES = {"full": (64, 40, 8, 256, 128), "smoke": (1, 4, 1, 32, 32)}  # B, Hq, Hkv, S, D
_B, _HQ, _HKV, _S, _D = SIZES["full"]

META = ProblemMeta(
    number=58,
    name="quantized_attention_scores_qwen3_14b_nvfp4",
    family="quantization",
    dtypes=("bfloat16",),
    source_model="Qwen3-14B (nvfp4 attention GEMMs); SOL-ExecBench recipe",
    source_config="batch 64 x 256 tokens, 40 query / 8 kv heads, head_dim 128, additive causal mask; q, k, softmax "
                  "probabilities and v quantised to nvfp4 (block 16, e4m3 block scales, dynamic fp32 per-tensor "
                  "scales) for the two attention GEMMs",
    inputs=("query_states", "key_states", "value_states", "attention_mask"),
    outputs=(Output("attn_output"), Output("attn_weights")),
    fixed_inputs=("attention_mask",),
    flops=2 * 2 * _B * _HQ * _S * _S * _D + 8 * _B * _HQ * _S * _S,
    bytes=_B * (_HQ + 2 * _HKV) * _S * _D * 2 + _B * _S * _S * 2 + _B * _HQ * _S * _D * 2 + _B * _HQ * _S * _S * 2,
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/58_quantized_attention_scores_qwen3_14b_nvfp4.json",
        matches=("computation", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("outputs", "the recipe hides the output layout: mkb returns attn_output [64, 40, 256, 128] and "
             "attn_weights [64, 40, 256, 256] (heads before positions, as the inputs), both bfloat16"),
        ),
    ),
    notes="Inputs as the recipe: q, k, v N(0, 1) in bfloat16; the mask is causal for every batch row. Where the "
          "recipe hides the order, the 1/sqrt(D) scale and the mask are applied in float32 to the bfloat16-rounded "
          "scores. Hopper has no fp4 tensor cores: the applicable peak is bf16; flops count the full S x S "
          "scores, as upstream computes them.",
)


def _bmm_f32(a, b):
    """Batched bfloat16 a @ b with float32 accumulation and result (cuBLAS on CUDA)."""
    if a.is_cuda:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def _nvfp4_mm(a, b, *, mdt):
    """dequant(nvfp4(a)) @ dequant(nvfp4(b))^T over the last dims of 3-D a [N, M, K], b [N, P, K], in float32 or wider.

    The global scales multiply the product (exact reassociation: e2m1 x e4m3 values are exact in
    bfloat16), so a bfloat16 `mdt` differs from the wide computation only by summation order.
    """
    ga, gb = nvfp4_global_scale(a), nvfp4_global_scale(b)
    one = torch.ones((), dtype=torch.float32, device=a.device)
    da = nvfp4_dequantize(*nvfp4_quantize(a, ga), one, mdt)
    db = nvfp4_dequantize(*nvfp4_quantize(b, gb), one, mdt)
    y = _bmm_f32(da, db.transpose(1, 2)) if mdt == torch.bfloat16 else da @ db.transpose(1, 2)
    wide = compute_dtype(a, y)
    return y.to(wide) * (ga.to(wide) * gb.to(wide))


def _attention(query_states, key_states, value_states, attention_mask, *, mdt=None):
    cdt = compute_dtype(query_states)
    od = out_dtype(cdt)
    b, hq, s, d = query_states.shape
    hkv = key_states.shape[1]
    rep = hq // hkv
    # query heads h = j * rep + r share kv head j: group them so no kv head is copied
    q = query_states.reshape(b * hkv, rep * s, d)
    scores = _nvfp4_mm(q, key_states.reshape(b * hkv, s, d), mdt=mdt or cdt).to(od).to(cdt)
    scores = scores.view(b, hq, s, s) / math.sqrt(d) + attention_mask.to(cdt)
    attn_weights = torch.softmax(scores, dim=-1).to(od)
    vt = value_states.transpose(-1, -2).reshape(b * hkv, d, s)
    out = _nvfp4_mm(attn_weights.reshape(b * hkv, rep * s, s), vt, mdt=mdt or cdt)
    return out.view(b, hq, s, d).to(od), attn_weights


def reference(*inputs):
    return _attention(*inputs)


def eager(*inputs):
    """The same quantisations; both GEMMs on the exact bfloat16 e2m1 x e4m3 products with float32 accumulation."""
    return _attention(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    b, hq, hkv, s, d = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    q = torch.randn(b, hq, s, d, generator=gen, device=device).to(torch.bfloat16)
    k = torch.randn(b, hkv, s, d, generator=gen, device=device).to(torch.bfloat16)
    v = torch.randn(b, hkv, s, d, generator=gen, device=device).to(torch.bfloat16)
    above = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
    mask = torch.zeros(b, 1, s, s, dtype=torch.bfloat16, device=device)
    mask.masked_fill_(above, torch.finfo(torch.bfloat16).min)
    return q, k, v, mask
