"""Qwen3-8B SwiGLU MLP in nvfp4 (W4A4): gate and up GEMMs, SiLU gating, the mid-chain re-quantisation, and the down GEMM.

Upstream MetaKernelBench's problem 61 (a SOL-ExecBench recipe): batch 32 x 512 tokens, hidden 4096,
intermediate 12288; three separate nvfp4 weights, the input and the gated activation quantised to nvfp4
inside the call with dynamic global scales.

Inputs (B = 32, S = 512, H = 4096, I = 12288)
- x  bfloat16 [B, S, H]
- gate_w uint8 [I, H/2], gate_w_bs float8_e4m3fn [I, H/16], gate_w_g float32 []   (likewise up_w)
- down_w uint8 [H, I/2], down_w_bs float8_e4m3fn [H, I/16], down_w_g float32 []

nvfp4 (mkb.problems.quant): e2m1 codes two per byte (element 2j in the low nibble), an e4m3 scale per 16
consecutive elements, value = e2m1 * block_scale * global_scale. An activation a is quantised in the call
with g = amax(|a|) / (6 * 448) over the whole tensor (float32), block_scale = e4m3(min(amax_block /
(6 g), 448)), code = e2m1(v / (block_scale * g)) (ties to even).
Numerics (float32; the reference promotes to float64 for the anchor; the quantisation casts are fixed):
  lin(a, w) = dequant(nvfp4(a)) @ dequant(w)^T, rounded to bfloat16 (as upstream rounds each GEMM to the
  input dtype)
  gate = lin(x, gate_w), up = lin(x, up_w)        (one quantisation of x serves both)
  hidden = silu(gate) * up, rounded to bfloat16 (upstream's gating runs on the bfloat16 GEMM outputs)
  out = lin(hidden, down_w) -> bfloat16 [B, S, H]
"""

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_global_scale, nvfp4_linear, nvfp4_weight, out_dtype

SIZES = {"full": (32, 512, 4096, 12288), "smoke": (2, 4, 64, 96)}  # B, S, H, I
_B, _S, _H, _I = SIZES["full"]
_T = _B * _S

META = ProblemMeta(
    number=61,
    name="mlp_silu_gating_qwen3_8b_nvfp4",
    family="quantization",
    dtypes=("bfloat16", "uint8", "float8_e4m3fn", "float32"),
    source_model="Qwen3-8B (nvfp4 MLP); SOL-ExecBench recipe",
    source_config="batch 32 x 512 tokens, hidden 4096, intermediate 12288, SiLU gating; gate/up/down weights in "
                  "nvfp4 (block 16, e4m3 block scales, fp32 global scales); input and gated activation quantised "
                  "with dynamic global scales",
    inputs=("x", "gate_w", "gate_w_bs", "gate_w_g", "up_w", "up_w_bs", "up_w_g", "down_w", "down_w_bs", "down_w_g"),
    outputs=(Output("out"),),
    flops=2 * _T * _H * 2 * _I + 2 * _T * _I * _H + 6 * _T * _I + 4 * _T * (_H + _I),
    bytes=_T * _H * 2 + 3 * _I * _H * (0.5 + 1 / 16) + _T * _H * 2,
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/61_mlp_silu_gating_qwen3_8b_nvfp4.json",
        matches=("computation", "outputs", "in_place", "shapes", "structure_per_draw", "exactness"),
        differs=(
            ("dtypes", "upstream passes each weight's global scale as a Python float (made a tensor in its "
             "reference) and its codes as fp4x2 tensors; mkb passes float32 0-dim tensors and uint8 codes (the "
             "same bits, element 2j in the low nibble); x bfloat16 (the recipe hides its dtype)"),
            ("distributions", "the recipe hides the weights' scale (a three-token factor): mkb draws each weight "
             "N(0, 1)/sqrt(fan_in), quantised at draw time as upstream quantises them, then scaled by a per-seed "
             "factor in [1/4, 4] (mkb.problems.quant.nvfp4_weight) so its global scale changes between draws and "
             "a kernel that mishandles it fails; x N(0, 1) as upstream"),
        ),
    ),
    notes="Hopper has no fp4 tensor cores: the applicable peak is bf16 (e2m1 x e4m3 products are exact in bf16, "
          "so a bf16 GEMM with the global scales applied afterwards is exact up to summation order). Where the "
          "recipe hides it, the gating is computed in float32 from the rounded GEMM outputs and rounded once.",
)


def _lin(a, w, w_bs, w_g, cdt, mdt):
    return nvfp4_linear(a, nvfp4_global_scale(a), w, w_bs, w_g, mdt=mdt).to(cdt).to(out_dtype(cdt))


def _mlp(x, gate_w, gate_w_bs, gate_w_g, up_w, up_w_bs, up_w_g, down_w, down_w_bs, down_w_g, *, mdt=None):
    cdt = compute_dtype(x)
    mdt = mdt or cdt
    gate = _lin(x, gate_w, gate_w_bs, gate_w_g, cdt, mdt).to(cdt)
    up = _lin(x, up_w, up_w_bs, up_w_g, cdt, mdt).to(cdt)
    hidden = (F.silu(gate) * up).to(out_dtype(cdt))
    return _lin(hidden, down_w, down_w_bs, down_w_g, cdt, mdt)


def reference(*inputs):
    return _mlp(*inputs)


def eager(*inputs):
    """bf16 GEMMs on the exact e2m1 x e4m3 operands with fp32 accumulation, global scales applied after."""
    return _mlp(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    b, s, h, inter = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(b, s, h, generator=gen, device=device).to(torch.bfloat16)
    weights = []
    for i, (rows, cols) in enumerate(((inter, h), (inter, h), (h, inter))):
        weights += nvfp4_weight(torch.randn(rows, cols, generator=gen, device=device) * cols**-0.5, seed, i)
    return (x, *weights)
