"""Qwen3-8B MLP gate/up projection in nvfp4 (W4A4), SiLU gating, and nvfp4 re-quantisation for down_proj.

Inputs (T tokens, hidden H = 4096, intermediate I = 12288)
- x          bfloat16 [T, H]
- g_x        float32 []            static (calibrated) global scale of x's nvfp4 quantisation
- w_gate_up  uint8 [2I, H/2], w_bs float8_e4m3fn [2I, H/16], w_g float32 []   rows 0..I-1 gate, I..2I-1 up
- g_a        float32 []            static global scale of the gated activation's nvfp4 quantisation

nvfp4 (mkb.problems.quant): e2m1 codes two per byte (element 2j in the low nibble, 2j+1 high),
one e4m3 scale per 16 consecutive elements of a row, value = e2m1 * block_scale * g. Quantising v
with global scale g: block_scale = e4m3(min(amax/(6 g), 448)), code = e2m1(v / (block_scale * g)),
float32 division, round to nearest with ties to the even code, saturating at 6.
Numerics: [gate, up] = dequant(nvfp4(x, g_x)) @ dequant(w_gate_up)^T in float32 (the reference
promotes to float64 for the anchor); a = silu(gate) * up, rounded to float32, is quantised to nvfp4
with the static global scale g_a (an input, calibrated offline as down_proj's input_scale).
Outputs
- a_fp4  uint8 [T, I/2]             compare: quantized (values e2m1 * a_bs, in units of g_a)
- a_bs   float8_e4m3fn [T, I/16]    compare: quantized (one quantum = e4m3 spacing)
The fp64 gap of both outputs is that of a before quantisation (`gated`, Output.quantized_from).
"""

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import (
    compute_dtype,
    fp8_spacing,
    nvfp4_global_scale,
    nvfp4_linear,
    nvfp4_quantize,
    nvfp4_values_and_quantum,
    nvfp4_weight,
)

SIZES = {"full": (4096, 4096, 12288), "smoke": (8, 64, 96)}  # T, H, I
_T, _H, _I = SIZES["full"]

META = ProblemMeta(
    number=61,
    name="mlp_silu_gating_qwen3_8b_nvfp4",
    family="quantization",
    dtypes=("bfloat16", "uint8", "float8_e4m3fn", "float32"),
    source_model="Qwen/Qwen3-8B (nvfp4)",
    source_config="hidden_size 4096, intermediate_size 12288, hidden_act silu; nvfp4 block 16, e4m3 block scales, fp32 global scales (static, calibrated, for x and for the gated activation)",
    inputs=("x", "g_x", "w_gate_up", "w_bs", "w_g", "g_a"),
    outputs=(
        Output("a_fp4", compare="quantized", dequantize="dequantize_a", quantized_from="gated"),
        Output("a_bs", compare="quantized", dequantize="dequantize_bs", quantized_from="gated"),
    ),
    flops=2 * _T * _H * 2 * _I + 6 * _T * _I,
    bytes=_T * _H * 2 + 2 * _I * _H * (0.5 + 1 / 16) + _T * _I * (0.5 + 1 / 16) + 3 * 4,
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/61_mlp_silu_gating_qwen3_8b_nvfp4.json',
        matches=('in_place', 'dtypes', 'structure_per_draw'),
        differs=(
            ('computation', 'upstream: the whole MLP - nvfp4 gate and up GEMMs (separate weights), silu(gate) * up, re-quantisation to nvfp4 and the nvfp4 down GEMM; mkb: a fused gate_up GEMM, silu gating and the re-quantised activation as output (no down projection) - not yet converted (issue #15 follow-up)'),
            ('outputs', 'upstream returns the MLP output [32, 512, 4096]; mkb the nvfp4 activation and its scales - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: 32 x 512 = 16384 tokens, hidden 4096, intermediate 12288; mkb: 4096 tokens (same hidden and intermediate) - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: N(0, 1) activations, weights scaled N(0, 1) quantised at draw time; mkb's differ - not yet converted (issue #15 follow-up)"),
            ("exactness", "mkb compares `a_fp4` and `a_bs` as `quantized` (dequantised values at most one quantum off on at most 0.1% of elements), where upstream applies its own rule to the encoded output (exact for integer encodings, fp64-anchored for float8)"),
        ),
    ),
    notes=(
        "T = 4096 tokens. Hopper has no fp4 tensor cores: the applicable peak is bf16 (a solution unpacks the codes; "
        "e2m1 x e4m3 products are exact in bf16, so a bf16 GEMM with the global scales applied afterwards is exact "
        "up to summation order)."
    ),
)


def dequantize_a(outputs):
    a_fp4, a_bs = outputs
    return nvfp4_values_and_quantum(a_fp4, a_bs, torch.ones((), dtype=torch.float64, device=a_fp4.device))


def dequantize_bs(outputs):
    _, a_bs = outputs
    return a_bs.to(torch.float64), fp8_spacing(a_bs)


def gated(x, g_x, w_gate_up, w_bs, w_g, g_a, *, mdt=None):
    """a = silu(gate) * up before quantisation, in the compute dtype (float64 for the anchor): the fp64 gap."""
    cdt = compute_dtype(x)
    gu = nvfp4_linear(x, g_x, w_gate_up, w_bs, w_g, mdt=mdt or cdt).to(cdt)
    inter = gu.shape[-1] // 2
    return F.silu(gu[:, :inter]) * gu[:, inter:]


def _mlp(x, g_x, w_gate_up, w_bs, w_g, g_a, *, mdt=None):
    return nvfp4_quantize(gated(x, g_x, w_gate_up, w_bs, w_g, g_a, mdt=mdt).float(), g_a)


def reference(*inputs):
    return _mlp(*inputs)


def eager(*inputs):
    """bf16 GEMM on the exact e2m1 x e4m3 operands with fp32 accumulation, global scales applied after."""
    return _mlp(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    t, h, inter = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, h, generator=gen, device=device).to(torch.bfloat16)
    w, w_bs, w_g = nvfp4_weight(torch.randn(2 * inter, h, generator=gen, device=device) * h**-0.5, seed)
    g_x = nvfp4_global_scale(x)
    gu = nvfp4_linear(x, g_x, w, w_bs, w_g, mdt=torch.float32)
    g_a = nvfp4_global_scale(F.silu(gu[:, :inter]) * gu[:, inter:])  # calibrated on this batch
    return x, g_x, w, w_bs, w_g, g_a
