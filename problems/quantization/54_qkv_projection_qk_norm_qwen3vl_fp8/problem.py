"""Qwen3-VL QKV projections in block fp8 (both operands quantised inside the call) with biases, then per-head RMSNorm of q and k.

Upstream MetaKernelBench's problem 54 (a SOL-ExecBench recipe): 64 x 256 tokens, hidden 7680, 60 query
heads and 8 key/value heads of dimension 128, three separate projections with biases, eps 1e-5 passed
as an input.

Inputs (B = 64, S = 256, H = 7680, Hq = 60, Hkv = 8, D = 128)
- hidden_states  bfloat16 [B, S, H]
- q_weight bfloat16 [Hq*D, H], k_weight / v_weight bfloat16 [Hkv*D, H]   (nn.Linear layout)
- q_bias bfloat16 [Hq*D], k_bias / v_bias bfloat16 [Hkv*D]
- q_norm_weight, k_norm_weight  bfloat16 [D]
- eps  float 1e-5

Numerics (mkb.problems.quant): hidden_states is quantised to fp8 e4m3 with dynamic 1x128 block
scales and each weight with 128x128 block scales (scale = max(amax, 1e-10) / 448 in float32, code =
e4m3(clamp(v / scale, -448, 448)), round to nearest even). Per projection p in (q, k, v):
p = dequant(q(hidden_states)) @ dequant(q(p_weight))^T + p_bias in float32 (the reference promotes to
float64 for the anchor; the quantisation casts are fixed), rounded to bfloat16 as upstream rounds
the projection to the input dtype. Then per head of q and k: x * rsqrt(mean(x^2) + eps) * norm_weight
in float32; v is the rounded projection.
Outputs bfloat16: q [B, S, Hq, D], k [B, S, Hkv, D], v [B, S, Hkv, D].
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, expand_block_scale, fp8_linear, fp8_quantize, out_dtype

EPS = 1e-5
SIZES = {"full": (64, 256, 7680, 60, 8, 128), "smoke": (2, 4, 256, 2, 1, 128)}  # B, S, H, Hq, Hkv, D
_B, _S, _H, _HQ, _HKV, _D = SIZES["full"]
_T = _B * _S
_N = (_HQ + 2 * _HKV) * _D

META = ProblemMeta(
    number=54,
    name="qkv_projection_qk_norm_qwen3vl_fp8",
    family="quantization",
    dtypes=("bfloat16",),
    source_model="Qwen3-VL (FP8 block quantisation); SOL-ExecBench recipe",
    source_config="64 x 256 tokens, hidden 7680, 60 query / 8 kv heads, head_dim 128, q/k/v projections with biases, "
                  "per-head q/k RMSNorm eps 1e-5; block-wise fp8 e4m3 (activations 1x128 dynamic, weights 128x128), "
                  "both quantised in the call",
    inputs=("hidden_states", "q_weight", "k_weight", "v_weight", "q_bias", "k_bias", "v_bias", "q_norm_weight",
            "k_norm_weight", "eps"),
    outputs=(Output("q"), Output("k"), Output("v")),
    flops=2 * _T * _H * _N + 4 * (_T * _H + _N * _H) + 4 * _T * (_HQ + _HKV) * _D,
    bytes=_T * _H * 2 + _N * _H * 2 + _N * 2 + 2 * _D * 2 + _T * _N * 2,
    peak="fp8_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/54_qkv_projection_qk_norm_qwen3vl_fp8.json",
        matches=("computation", "in_place", "shapes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("outputs", "the recipe hides the output layout: mkb returns q, k, v as [64, 256, heads, 128] "
             "(heads 60, 8, 8), q and k normalised per head, v the biased projection"),
            ("dtypes", "the recipe hides the input dtypes: mkb passes activations, weights, biases and norm weights "
             "in bfloat16 and returns bfloat16 (the projections are cast to the activation's dtype, as upstream "
             "casts them)"),
        ),
    ),
    notes="Inputs as the recipe: hidden_states and biases N(0, 1), each weight N(0, 1)/sqrt(7680) times a "
          "per-128x128-block gain U(0.5, 2), norm weights 1 + 0.1 N(0, 1). The weights are quantised on every "
          "call, as upstream's reference does.",
)


def _rms(x, w, eps, cdt):
    x = x.to(cdt)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.to(cdt)


def _qkv(hidden_states, q_weight, k_weight, v_weight, q_bias, k_bias, v_bias, q_norm_weight, k_norm_weight, eps,
         *, mdt=None):
    cdt = compute_dtype(hidden_states)
    od = out_dtype(cdt)
    d = q_norm_weight.shape[0]
    lead = hidden_states.shape[:-1]
    outs = []
    for w, b in ((q_weight, q_bias), (k_weight, k_bias), (v_weight, v_bias)):
        wq, ws = fp8_quantize(w, (128, 128))
        p = (fp8_linear(hidden_states, wq, ws, mdt=mdt or cdt).to(cdt) + b.to(cdt)).to(od)
        outs.append(p.view(*lead, -1, d))
    q, k, v = outs
    return _rms(q, q_norm_weight, eps, cdt).to(od), _rms(k, k_norm_weight, eps, cdt).to(od), v


def reference(*inputs):
    return _qkv(*inputs)


def eager(*inputs):
    """The same quantisation; the GEMMs on the dequantised operands rounded to bfloat16 (fp32 accumulation)."""
    return _qkv(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    b, s, h, hq, hkv, d = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def weight(rows):
        w = torch.randn(rows, h, generator=gen, device=device) * h**-0.5
        gain = torch.rand(rows // 128, h // 128, generator=gen, device=device) * 1.5 + 0.5
        return (w * expand_block_scale(gain, (128, 128), w.shape)).to(torch.bfloat16)

    hidden_states = torch.randn(b, s, h, generator=gen, device=device).to(torch.bfloat16)
    q_weight, k_weight, v_weight = weight(hq * d), weight(hkv * d), weight(hkv * d)
    q_bias, k_bias, v_bias = (torch.randn(n * d, generator=gen, device=device).to(torch.bfloat16)
                              for n in (hq, hkv, hkv))
    q_norm_weight, k_norm_weight = ((1 + 0.1 * torch.randn(d, generator=gen, device=device)).to(torch.bfloat16)
                                    for _ in range(2))
    return (hidden_states, q_weight, k_weight, v_weight, q_bias, k_bias, v_bias, q_norm_weight, k_norm_weight, EPS)
