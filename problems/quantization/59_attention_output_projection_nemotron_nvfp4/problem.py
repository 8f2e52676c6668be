"""Nemotron attention output projection in nvfp4 (W4A4): the activation quantised with its dynamic global scale, then the GEMM.

Upstream MetaKernelBench's problem 59 (a SOL-ExecBench recipe): 32768 tokens x 4096 -> 2816 (the
hidden size 2688 padded to 2816).

Inputs (T tokens, input width A = 4096, output width H = 2816)
- hidden_states  bfloat16 [T, A]
- w  uint8 [H, A/2], w_bs float8_e4m3fn [H, A/16], w_g float32 []   the projection weight in nvfp4

nvfp4 (mkb.problems.quant): e2m1 codes two per byte (element 2j in the low nibble), an e4m3 scale
per 16 consecutive elements, value = e2m1 * block_scale * global_scale. The activation is quantised
inside the call with a dynamic per-tensor global scale g = amax(|hidden_states|) / (6 * 448)
(float32, over the whole tensor), block_scale = e4m3(min(amax_block / (6 g), 448)), code =
e2m1(v / (block_scale * g)) (float32, ties to even). So a kernel needs the tensor's amax before it
can quantise any block.
Numerics: out = dequant(nvfp4(hidden_states, g)) @ dequant(w)^T in float32 (the reference promotes
to float64 for the anchor; the quantisation casts are fixed), rounded once to bfloat16 [T, H].
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_global_scale, nvfp4_linear, nvfp4_weight, out_dtype

SIZES = {"full": (32768, 4096, 2816), "smoke": (16, 64, 48)}  # T, A, H
_T, _A, _H = SIZES["full"]

META = ProblemMeta(
    number=59,
    name="attention_output_projection_nemotron_nvfp4",
    family="quantization",
    dtypes=("bfloat16", "uint8", "float8_e4m3fn", "float32"),
    source_model="NVIDIA Nemotron (nvfp4); SOL-ExecBench recipe",
    source_config="o_proj 4096 -> 2816 (hidden 2688 padded to 2816); nvfp4 block 16, e4m3 block scales, fp32 global "
                  "scales, dynamic activation global scale; batch 64 x 512 tokens",
    inputs=("hidden_states", "w", "w_bs", "w_g"),
    outputs=(Output("out"),),
    flops=2 * _T * _A * _H + 4 * _T * _A,
    bytes=_T * _A * 2 + _H * _A * (0.5 + 1 / 16) + _T * _H * 2,
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/59_attention_output_projection_nemotron_nvfp4.json",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("distributions", "the recipe hides the weight's scale: mkb draws it N(0, 1)/sqrt(4096), quantised at draw "
             "time, and scales it by a per-seed factor in [1/4, 4] (mkb.problems.quant.nvfp4_weight) so its global "
             "scale changes between draws and a kernel that mishandles it fails; hidden_states N(0, 1) as upstream"),
        ),
    ),
    notes="T = 32768 tokens (prefill). Hopper has no fp4 tensor cores: the applicable peak is bf16. The activation's "
          "global scale is an amax over the whole input, computed in the call.",
)


def _proj(hidden_states, w, w_bs, w_g, *, mdt=None):
    cdt = compute_dtype(hidden_states)
    g = nvfp4_global_scale(hidden_states)
    return nvfp4_linear(hidden_states, g, w, w_bs, w_g, mdt=mdt or cdt).to(cdt).to(out_dtype(cdt))


def reference(*inputs):
    return _proj(*inputs)


def eager(*inputs):
    """Dequantise to bfloat16 and run a bf16 GEMM (fp32 accumulation)."""
    return _proj(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    t, a, h = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    hidden_states = torch.randn(t, a, generator=gen, device=device).to(torch.bfloat16)
    w, w_bs, w_g = nvfp4_weight(torch.randn(h, a, generator=gen, device=device) * a**-0.5, seed)
    return hidden_states, w, w_bs, w_g
