"""Nemotron Mamba2 output projection as an nvfp4 x nvfp4 GEMM of pre-quantised operands (batched, batch 1), fp32 out.

Upstream MetaKernelBench's problem 60 (a SOL-ExecBench recipe): 1 x 8192 x 1920 -> 1 x 8192 x 1920
from operands already quantised to nvfp4.

Inputs (batch 1, M = 8192 tokens, K = N = 1920)
- hidden_states  uint8 [1, M, K/2]           nvfp4 codes of the activation
- weight         uint8 [1, N, K/2]           nvfp4 codes of the weight (nn.Linear layout)
- hidden_states_scale  float8_e4m3fn [1, M, K/16], global_decode_scale_input  float32 []
- weight_scale         float8_e4m3fn [1, N, K/16], global_decode_scale_weight float32 []

nvfp4 (mkb.problems.quant): e2m1 codes two per byte (element 2j in the low nibble), an e4m3 scale
per 16 consecutive elements, value = e2m1 * block_scale * global_decode_scale.
Numerics: out = dequant(hidden_states) @ dequant(weight)^T per batch, in float32 (the reference
promotes to float64 for the anchor), returned in float32 [1, M, N] as upstream returns it.
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_dequantize, nvfp4_global_scale, nvfp4_quantize, nvfp4_weight

SIZES = {"full": (1, 8192, 1920, 1920), "smoke": (1, 16, 64, 48)}  # batch, M, K, N
_Bt, _M, _K, _N = SIZES["full"]

META = ProblemMeta(
    number=60,
    name="mamba2_output_projection_nemotron_nvfp4",
    family="quantization",
    dtypes=("uint8", "float8_e4m3fn", "float32"),
    source_model="NVIDIA Nemotron (Mamba2 out_proj, nvfp4); SOL-ExecBench recipe",
    source_config="out_proj 1920 -> 1920 over 8192 tokens, batch 1; nvfp4 block 16, e4m3 block scales, fp32 global "
                  "decode scales; operands pre-quantised",
    inputs=("hidden_states", "weight", "hidden_states_scale", "global_decode_scale_input", "weight_scale",
            "global_decode_scale_weight"),
    outputs=(Output("out"),),
    flops=2 * _Bt * _M * _K * _N,
    bytes=_Bt * (_M + _N) * _K * (0.5 + 1 / 16) + _Bt * _M * _N * 4,
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/60_mamba2_output_projection_nemotron_nvfp4.json",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("distributions", "the recipe hides the activation's draw: mkb quantises N(0, 1) activations and an "
             "N(0, 1)/sqrt(1920) weight (as upstream) and scales the weight by a per-seed factor in [1/4, 4] "
             "(mkb.problems.quant.nvfp4_weight) so its global scale changes between draws"),
        ),
    ),
    notes="Hopper has no fp4 tensor cores: the applicable peak is bf16 (e2m1 x e4m3 products are exact in bf16). The "
          "eager baseline is the reference (an fp32 GEMM of the dequantised operands, as upstream's reference).",
)


def reference(hidden_states, weight, hidden_states_scale, global_decode_scale_input, weight_scale,
              global_decode_scale_weight):
    cdt = compute_dtype(global_decode_scale_input)
    a = nvfp4_dequantize(hidden_states, hidden_states_scale, global_decode_scale_input, cdt)
    b = nvfp4_dequantize(weight, weight_scale, global_decode_scale_weight, cdt)
    return torch.bmm(a, b.transpose(1, 2))


def make_inputs(seed, *, device, size="full"):
    bt, m, k, n = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(bt, m, k, generator=gen, device=device)
    g_x = nvfp4_global_scale(x)
    xq, xs = nvfp4_quantize(x, g_x)
    w, w_bs, w_g = nvfp4_weight(torch.randn(bt, n, k, generator=gen, device=device) * k**-0.5, seed)
    return xq, w, xs, g_x, w_bs, w_g
