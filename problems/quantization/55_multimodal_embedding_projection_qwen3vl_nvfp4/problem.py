"""Qwen3-VL-8B vision-to-language projection (patch merger MLP) with nvfp4 weights and activations (W4A4).

Inputs (N merged patch tokens; merged width M = 4 x 1152 = 4608, language hidden H = 4096)
- x        bfloat16 [N, M]       merged, normalised patch features (2x2 spatial merge)
- g_x      float32 []            static (calibrated) global scale of x's nvfp4 quantisation
- w1       uint8 [M, M/2], w1_bs float8_e4m3fn [M, M/16], w1_g float32 []   fc1 weight in nvfp4
- b1       bfloat16 [M]
- g_h      float32 []            static global scale of the fc1 activation's nvfp4 quantisation
- w2       uint8 [H, M/2], w2_bs float8_e4m3fn [H, M/16], w2_g float32 []   fc2 weight in nvfp4
- b2       bfloat16 [H]

nvfp4 (mkb.problems.quant): e2m1 codes, two per byte (element 2j in the low nibble), one e4m3 scale
per 16 consecutive elements of a row, value = e2m1 * block_scale * global_scale. Activations are
quantised with block_scale = e4m3(min(amax/(6 g), 448)), code = e2m1(v / (block_scale * g)) (float32,
round to nearest, ties to even).
Numerics (float32, the reference promotes to float64 for the anchor):
  h = gelu_erf(dequant(nvfp4(x, g_x)) @ dequant(w1)^T + b1);
  out = dequant(nvfp4(h, g_h)) @ dequant(w2)^T + b2 -> bfloat16 [N, H], rounded once.
"""

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_global_scale, nvfp4_linear, nvfp4_weight, out_dtype

SIZES = {"full": (8192, 4608, 4096), "smoke": (8, 64, 48)}  # N, M, H
_N, _M, _H = SIZES["full"]

META = ProblemMeta(
    number=55,
    name="multimodal_embedding_projection_qwen3vl_nvfp4",
    family="quantization",
    dtypes=("bfloat16", "uint8", "float8_e4m3fn", "float32"),
    source_model="Qwen/Qwen3-VL-8B-Instruct (merger quantised to nvfp4)",
    source_config="vision hidden_size 1152, spatial_merge_size 2 (merged width 4608), out_hidden_size 4096, merger fc1 4608->4608, GELU (erf), fc2 4608->4096, biases; nvfp4 block 16 with e4m3 scales and fp32 global scales",
    inputs=("x", "g_x", "w1", "w1_bs", "w1_g", "b1", "g_h", "w2", "w2_bs", "w2_g", "b2"),
    outputs=(Output("out"),),
    flops=2 * _N * _M * (_M + _H),
    bytes=_N * _M * 2 + (_M + _H) * _M * (0.5 + 1 / 16) + (_M + _H) * 2 + _N * _H * 2,
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/55_multimodal_embedding_projection_qwen3vl_nvfp4.json',
        matches=('in_place', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('computation', 'upstream: text-embedding lookup (vocab 151936, hidden 8192) plus an nvfp4 projection of 384 vision tokens per sequence (3584 -> 8192, with bias) scattered by a vision-token mask; mkb: a two-layer nvfp4 MLP projector (the Qwen3-VL merger) without the embedding and scatter - not yet converted (issue #15 follow-up)'),
            ('outputs', 'upstream returns the merged [32, 1024, 8192] input embeddings; mkb the projected vision tokens - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: batch 32 x 1024 tokens, 384 vision tokens each, hidden 8192; mkb: 8192 x 4608 -> 4096 - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream draws N(0, 1) features, weight N(0, 1)/sqrt(3584); mkb's differ - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="N = 8192 merged tokens (several images). Hopper has no fp4 tensor cores, so the peak that applies is bf16 (a solution unpacks the codes). Global activation scales are calibrated on the drawn batch (amax / 2688).",
)


def _proj(x, g_x, w1, w1_bs, w1_g, b1, g_h, w2, w2_bs, w2_g, b2, *, mdt=None):
    cdt = compute_dtype(x)
    mdt = mdt or cdt
    h = F.gelu(nvfp4_linear(x, g_x, w1, w1_bs, w1_g, mdt=mdt).to(cdt) + b1.to(cdt))
    out = nvfp4_linear(h, g_h, w2, w2_bs, w2_g, mdt=mdt).to(cdt) + b2.to(cdt)
    return out.to(out_dtype(cdt))


def reference(*inputs):
    return _proj(*inputs)


def eager(*inputs):
    """Dequantise to bfloat16 and run bf16 GEMMs (fp32 accumulation)."""
    return _proj(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    n, m, h = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, m, generator=gen, device=device).to(torch.bfloat16)
    w1, w1_bs, w1_g = nvfp4_weight(torch.randn(m, m, generator=gen, device=device) * m**-0.5, seed)
    w2, w2_bs, w2_g = nvfp4_weight(torch.randn(h, m, generator=gen, device=device) * m**-0.5, seed, 1)
    b1 = (torch.randn(m, generator=gen, device=device) * 0.1).to(torch.bfloat16)
    b2 = (torch.randn(h, generator=gen, device=device) * 0.1).to(torch.bfloat16)
    g_x = nvfp4_global_scale(x)
    hid = F.gelu(nvfp4_linear(x, g_x, w1, w1_bs, w1_g, mdt=torch.float32) + b1.float())
    return x, g_x, w1, w1_bs, w1_g, b1, nvfp4_global_scale(hid), w2, w2_bs, w2_g, b2
