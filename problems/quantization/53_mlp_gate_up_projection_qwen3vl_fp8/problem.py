"""Qwen2.5/3-VL MLP gate and up projections in fp8 (block-scaled operands) with SiLU gating, bf16 out.

Upstream MetaKernelBench's problem 53 (a SOL-ExecBench recipe): 8704 x 3584 -> 8704 x 18944, from
operands already quantised to fp8 e4m3 with block scales.

Inputs (M tokens = 8704, hidden H = 3584, intermediate I = 18944)
- x           float8_e4m3fn [M, H], x_scale float32 [M, H/128]          1x128 activation blocks
- w_gate      float8_e4m3fn [I, H], w_gate_scale float32 [I/128, H/128]  128x128 weight blocks
- w_up        float8_e4m3fn [I, H], w_up_scale float32 [I/128, H/128]
value = float(code) * the scale of its block (mkb.problems.quant.fp8_dequantize).

Numerics: gate = dequant(x) @ dequant(w_gate)^T, up = dequant(x) @ dequant(w_up)^T, out =
silu(gate) * up in float32 (the reference promotes to float64 for the anchor), rounded once to
bfloat16 [M, I]. The eager baseline runs both GEMMs on bfloat16 operands (fp32 accumulation).
"""

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, expand_block_scale, fp8_dequantize, fp8_quantize, out_dtype

SIZES = {"full": (8704, 3584, 18944), "smoke": (8, 256, 256)}  # M, H, I
_M, _H, _I = SIZES["full"]

META = ProblemMeta(
    number=53,
    name="mlp_gate_up_projection_qwen3vl_fp8",
    family="quantization",
    dtypes=("float8_e4m3fn", "float32", "bfloat16"),
    source_model="Qwen-VL 7B-class text MLP (hidden 3584, intermediate 18944), fp8; SOL-ExecBench recipe",
    source_config="hidden_size 3584, intermediate_size 18944, hidden_act silu; fp8 e4m3 weight blocks [128, 128], "
                  "1x128 activation blocks; M 8704 tokens",
    inputs=("x", "x_scale", "w_gate", "w_gate_scale", "w_up", "w_up_scale"),
    outputs=(Output("out"),),
    flops=2 * 2 * _M * _H * _I + 4 * _M * _I,
    bytes=_M * _H + _M * (_H // 128) * 4 + 2 * (_I * _H + (_I // 128) * (_H // 128) * 4) + _M * _I * 2,
    peak="fp8_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/53_mlp_gate_up_projection_qwen3vl_fp8.json",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("distributions", "weights as upstream (N(0, 1)/sqrt(3584) times a per-128x128-block gain U(0.5, 2), then "
             "quantised); the recipe hides the activation's draw: mkb quantises N(0, 1) activations"),
        ),
    ),
    notes="The recipe's input order is (x, its scales, gate weight, its scales, up weight, its scales). "
          "Smoke: 8 x 256 -> 256.",
)


def _gate_up(x, x_scale, w_gate, w_gate_scale, w_up, w_up_scale, *, mdt=None):
    cdt = compute_dtype(x_scale)
    mdt = mdt or cdt
    a = fp8_dequantize(x, x_scale, (1, 128), cdt).to(mdt)
    gate = (a @ fp8_dequantize(w_gate, w_gate_scale, (128, 128), cdt).to(mdt).T).to(cdt)
    up = (a @ fp8_dequantize(w_up, w_up_scale, (128, 128), cdt).to(mdt).T).to(cdt)
    return (F.silu(gate) * up).to(out_dtype(cdt))


def reference(*inputs):
    return _gate_up(*inputs)


def eager(*inputs):
    """Both GEMMs on bfloat16 operands (the dequantised values rounded to bf16), fp32 accumulation."""
    return _gate_up(*inputs, mdt=torch.bfloat16)


def _gained_weight(rows, cols, gen, device):
    w = torch.randn(rows, cols, generator=gen, device=device) * cols**-0.5
    gain = torch.rand(rows // 128, cols // 128, generator=gen, device=device) * 1.5 + 0.5
    return w * expand_block_scale(gain, (128, 128), w.shape)


def make_inputs(seed, *, device, size="full"):
    m, h, inter = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x, x_scale = fp8_quantize(torch.randn(m, h, generator=gen, device=device), (1, 128))
    w_gate, w_gate_scale = fp8_quantize(_gained_weight(inter, h, gen, device), (128, 128))
    w_up, w_up_scale = fp8_quantize(_gained_weight(inter, h, gen, device), (128, 128))
    return x, x_scale, w_gate, w_gate_scale, w_up, w_up_scale
