"""Qwen3-VL-8B fused QKV projection in block fp8 followed by per-head RMSNorm of q and k (QK-norm).

Inputs (T tokens, hidden H = 4096, 32 query heads, 8 kv heads, head_dim D = 128)
- x          bfloat16 [T, H]
- w_qkv      float8_e4m3fn [(32 + 8 + 8) * D, H]  rows: q_proj (4096), k_proj (1024), v_proj (1024)
- w_qkv_scale float32 [48, 32]  128x128 block scales
- q_norm_w   bfloat16 [D],  k_norm_w bfloat16 [D]   (RMSNorm weights, eps 1e-6)

Numerics: x is quantised to fp8 e4m3 with 1x128 block scales (amax/448 in float32, round to
nearest even; mkb.problems.quant); qkv = dequant(x) @ dequant(w_qkv)^T accumulated in float32 (the
reference promotes to float64 for the anchor). Per head: q <- q / sqrt(mean(q^2) + 1e-6) * q_norm_w,
likewise k with k_norm_w; v unchanged. No RoPE here.
Outputs bfloat16: q [T, 32, D], k [T, 8, D], v [T, 8, D], each rounded once.
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import blocky_weight, compute_dtype, fp8_linear, fp8_quantize, out_dtype

EPS = 1e-6
GQA = 4  # query heads per kv head
SIZES = {"full": (8192, 4096, 32, 8, 128), "smoke": (8, 256, 4, 1, 128)}  # T, H, Hq, Hkv, D
_T, _H, _HQ, _HKV, _D = SIZES["full"]
_NQKV = (_HQ + 2 * _HKV) * _D

META = ProblemMeta(
    number=54,
    name="qkv_projection_qk_norm_qwen3vl_fp8",
    family="quantization",
    dtypes=("bfloat16", "float8_e4m3fn", "float32"),
    source_model="Qwen/Qwen3-VL-8B-Instruct-FP8",
    source_config="text hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, head_dim 128, rms_norm_eps 1e-6, q_norm/k_norm per head; fp8 e4m3 weight_block_size [128, 128], dynamic 1x128 activations",
    inputs=("x", "w_qkv", "w_qkv_scale", "q_norm_w", "k_norm_w"),
    outputs=(Output("q"), Output("k"), Output("v")),
    flops=2 * _T * _H * _NQKV + 4 * _T * (_HQ + _HKV) * _D,
    bytes=_T * _H * 2 + _NQKV * _H + (_NQKV // 128) * (_H // 128) * 4 + 2 * _D * 2 + _T * _NQKV * 2,
    peak="fp8_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/54_qkv_projection_qk_norm_qwen3vl_fp8.json',
        matches=('outputs', 'in_place', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('computation', 'upstream: separate q/k/v weights with biases, quantised blockwise inside the reference, per-head RMSNorm of q and k (eps 1e-5 as an input); mkb: a fused pre-quantised w_qkv without biases - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: 64 x 256 = 16384 tokens, hidden 7680, 60 query heads, 8 kv heads, head dim 128; mkb: 8192 tokens, hidden 4096, 32 / 8 heads - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: N(0, 1) hidden and biases, weights / sqrt(in) x block gain U(0.5, 2), norm weights 1 + 0.1 N; mkb's differ - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="T = 8192 tokens (a prefill chunk).",
)


def _rms(v, w, cdt):
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS) * w.to(cdt)


def _qkv(x, w_qkv, w_qkv_scale, q_norm_w, k_norm_w, *, mdt=None):
    cdt = compute_dtype(x)
    d = q_norm_w.shape[0]
    qkv = fp8_linear(x, w_qkv, w_qkv_scale, mdt=mdt or cdt).to(cdt)
    t = x.shape[0]
    hkv = qkv.shape[1] // d // (GQA + 2)
    hq = GQA * hkv
    q, k, v = qkv.view(t, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=1)
    od = out_dtype(cdt)
    return _rms(q, q_norm_w, cdt).to(od), _rms(k, k_norm_w, cdt).to(od), v.to(od)


def reference(*inputs):
    return _qkv(*inputs)


def eager(*inputs):
    """Dequantise to bfloat16 and run a bf16 GEMM (fp32 accumulation)."""
    return _qkv(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    t, h, hq, hkv, d = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    chan = torch.where(torch.rand(h, generator=gen, device=device) < 0.01, 6.0, 1.0)
    x = (torch.randn(t, h, generator=gen, device=device) * chan).to(torch.bfloat16)
    w, ws = fp8_quantize(blocky_weight(((hq + 2 * hkv) * d, h), (128, 128), gen, device, std=h**-0.5), (128, 128))
    qn = (1 + 0.2 * torch.randn(d, generator=gen, device=device)).to(torch.bfloat16)
    kn = (1 + 0.2 * torch.randn(d, generator=gen, device=device)).to(torch.bfloat16)
    return x, w, ws, qn, kn
