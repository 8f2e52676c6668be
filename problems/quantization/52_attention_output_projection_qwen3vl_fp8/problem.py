"""Qwen3-VL attention output projection with both operands quantised to block-scaled fp8 inside the call, bf16 in and out.

Upstream MetaKernelBench's problem 52 (a SOL-ExecBench recipe): 16384 x 7680 -> 16384 x 7680 with a
bias, where the reference itself quantises the activation (1x128 blocks, dynamic) and the weight
(128x128 blocks) to fp8 e4m3 before the GEMM.

Inputs (T = 32 x 512 tokens, K = N = 7680)
- attn_output    bfloat16 [T, K]
- o_proj_weight  bfloat16 [N, K]   (nn.Linear layout; block magnitudes vary, see make_inputs)
- o_proj_bias    bfloat16 [N]

Numerics (mkb.problems.quant): a block's scale = max(amax over the block, 1e-10) / 448 in float32,
code = e4m3(clamp(v / scale, -448, 448)) (round to nearest even). out = dequant(q(attn_output)) @
dequant(q(o_proj_weight))^T + bias in float32 (the reference promotes to float64 for the anchor;
the quantisation casts are fixed), rounded once to bfloat16 [T, N].
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, expand_block_scale, fp8_linear, fp8_quantize, out_dtype

SIZES = {"full": (32 * 512, 7680, 7680), "smoke": (16, 256, 256)}  # T, K, N
_T, _K, _N = SIZES["full"]

META = ProblemMeta(
    number=52,
    name="attention_output_projection_qwen3vl_fp8",
    family="quantization",
    dtypes=("bfloat16",),
    source_model="Qwen3-VL (FP8 block quantisation); SOL-ExecBench recipe",
    source_config="32 x 512 tokens, 7680 -> 7680 with bias; block-wise fp8 e4m3 (activations 1x128 dynamic, weights "
                  "128x128), both quantised in the call",
    inputs=("attn_output", "o_proj_weight", "o_proj_bias"),
    outputs=(Output("out"),),
    flops=2 * _T * _K * _N + 4 * (_T * _K + _N * _K),
    bytes=_T * _K * 2 + _N * _K * 2 + _N * 2 + _T * _N * 2,
    peak="fp8_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/52_attention_output_projection_qwen3vl_fp8.json",
        matches=("computation", "outputs", "in_place", "shapes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("dtypes", "the recipe hides the input dtypes: mkb passes the activation, weight and bias in bfloat16 and "
             "returns bfloat16 (the output is cast to the activation's dtype, as upstream casts it)"),
        ),
    ),
    notes="Inputs as the recipe: attn_output and bias N(0, 1), weight N(0, 1)/sqrt(7680) times a per-128x128-block "
          "gain U(0.5, 2). The weight is quantised on every call, as upstream's reference does.",
)


def _proj(attn_output, o_proj_weight, o_proj_bias, *, mdt=None):
    cdt = compute_dtype(attn_output)
    w, w_scale = fp8_quantize(o_proj_weight, (128, 128))
    y = fp8_linear(attn_output, w, w_scale, mdt=mdt or cdt).to(cdt) + o_proj_bias.to(cdt)
    return y.to(out_dtype(cdt))


def reference(*inputs):
    return _proj(*inputs)


def eager(*inputs):
    """The same quantisation; the GEMM on the dequantised operands rounded to bfloat16 (fp32 accumulation)."""
    return _proj(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    t, k, n = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    attn_output = torch.randn(t, k, generator=gen, device=device).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen, device=device) * k**-0.5
    gain = torch.rand(n // 128, k // 128, generator=gen, device=device) * 1.5 + 0.5
    o_proj_weight = (w * expand_block_scale(gain, (128, 128), w.shape)).to(torch.bfloat16)
    o_proj_bias = torch.randn(n, generator=gen, device=device).to(torch.bfloat16)
    return attn_output, o_proj_weight, o_proj_bias
