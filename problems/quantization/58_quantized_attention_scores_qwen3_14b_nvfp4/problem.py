"""Qwen3-14B causal GQA prefill attention whose scores come from nvfp4-quantised Q and K.

Inputs (batch B, 40 query heads, 8 kv heads, sequence S, head_dim D = 128; q and k after QK-norm and RoPE)
- q  bfloat16 [B, 40, S, D]
- k  bfloat16 [B, 8, S, D]
- v  bfloat16 [B, 8, S, D]

Numerics (mkb.problems.quant):
  q and k are each quantised to nvfp4 along D (16-element blocks, e4m3 block scales) with a dynamic
  per-tensor global scale g = amax(|t|) / (6 * 448) computed in float32 over the whole tensor;
  block_scale = e4m3(min(amax_block/(6 g), 448)), code = e2m1(value / (block_scale * g)) (ties to even).
  scores = dequant(q) @ dequant(k)^T / sqrt(D), query head h attending to kv head h // 5; causal mask
  (key position <= query position); p = softmax(scores) in float32; out = p @ v (v not quantised),
  float32 (the reference promotes to float64 for the anchor), rounded once to bfloat16 [B, 40, S, D].
"""

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_dequantize, nvfp4_global_scale, nvfp4_quantize, out_dtype

SIZES = {"full": (1, 40, 8, 4096, 128), "smoke": (1, 4, 1, 16, 32)}  # B, Hq, Hkv, S, D
_B, _HQ, _HKV, _S, _D = SIZES["full"]

META = ProblemMeta(
    number=58,
    name="quantized_attention_scores_qwen3_14b_nvfp4",
    family="quantization",
    dtypes=("bfloat16",),
    source_model="Qwen/Qwen3-14B",
    source_config="num_attention_heads 40, num_key_value_heads 8, head_dim 128, causal; Q/K quantised to nvfp4 (block 16, e4m3 scales, dynamic fp32 per-tensor scale) for the score GEMM, SageAttention-style",
    inputs=("q", "k", "v"),
    outputs=(Output("out"),),
    flops=2 * 2 * _B * _HQ * _S * _S * _D / 2,
    bytes=_B * (_HQ + 2 * _HKV) * _S * _D * 2 + _B * _HQ * _S * _D * 2,
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/58_quantized_attention_scores_qwen3_14b_nvfp4.json',
        matches=('in_place', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('outputs', "upstream's reference returns two tensors (a tuple); mkb returns the attention output only - not yet converted (issue #15 follow-up)"),
            ('computation', "upstream quantises q and k to nvfp4 for QK^T and also the softmax probabilities and v for the PV GEMM, and takes an explicit additive causal mask; mkb quantises only q and k (PV in float32 on bf16 v), causal mask implicit - not yet converted (issue #15 follow-up)"),
            ('shapes', 'upstream: batch 64 x 256 tokens, 40 query / 8 kv heads, head dim 128; mkb: batch 1 x 4096 tokens - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: q, k, v N(0, 1) in bf16; mkb's scales differ - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="B = 1, S = 4096 prefill; flops count the causal half. Hopper has no fp4 tensor cores: the applicable peak is bf16.",
)


def _dq(t, cdt):
    g = nvfp4_global_scale(t)
    packed, bs = nvfp4_quantize(t, g)
    return nvfp4_dequantize(packed, bs, g, cdt)


def reference(q, k, v):
    cdt = compute_dtype(q)
    b, hq, s, d = q.shape
    rep = hq // k.shape[1]
    qd = _dq(q, cdt)
    kd = _dq(k, cdt).repeat_interleave(rep, dim=1)
    vd = v.to(cdt).repeat_interleave(rep, dim=1)
    scores = qd @ kd.transpose(-1, -2) / math.sqrt(d)
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    p = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return (p @ vd).to(out_dtype(cdt))


def eager(q, k, v):
    """Dequantise q and k to bfloat16 and run PyTorch's fused causal SDPA (GQA)."""
    qd, kd = _dq(q, torch.bfloat16), _dq(k, torch.bfloat16)
    return torch.nn.functional.scaled_dot_product_attention(qd, kd, v, is_causal=True, enable_gqa=True)


def make_inputs(seed, *, device, size="full"):
    b, hq, hkv, s, d = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    qs = 1 + torch.rand(1, hq, 1, 1, generator=gen, device=device)  # per-head sharpness
    q = (torch.randn(b, hq, s, d, generator=gen, device=device) * qs).to(torch.bfloat16)
    k = (torch.randn(b, hkv, s, d, generator=gen, device=device) * 1.5).to(torch.bfloat16)
    v = torch.randn(b, hkv, s, d, generator=gen, device=device).to(torch.bfloat16)
    return q, k, v
