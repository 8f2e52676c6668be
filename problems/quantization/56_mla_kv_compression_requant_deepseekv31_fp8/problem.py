"""DeepSeek-V3.1 MLA KV compression: fp8 kv_a projection, latent RMSNorm, rope on k_pe, fp8 re-quantisation for the cache.

Inputs (T tokens, hidden H = 7168, kv_lora_rank C = 512, qk_rope_head_dim R = 64)
- x        bfloat16 [T, H]
- w_kva    float8_e4m3fn [C + R, H]   kv_a_proj_with_mqa (rows 0..511 latent, 512..575 k_pe)
- w_kva_scale float32 [5, 56]         128x128 block scales (the last row block covers 64 rows)
- kv_norm_w bfloat16 [C]              kv_a_layernorm weight, eps 1e-6
- cos, sin  float32 [T, R/2]          rotary table for each token's position (YaRN already applied)

Numerics (mkb.problems.quant; float32, the reference promotes to float64 for the anchor):
  x is quantised to fp8 e4m3 with 1x128 block scales; [c, k_pe] = dequant(x) @ dequant(w_kva)^T.
  c <- c / sqrt(mean(c^2) + 1e-6) * kv_norm_w; c is rounded to float32 and quantised to fp8 e4m3 with
  one scale per 128 elements (amax/448, round to nearest even), the FP8 MLA KV-cache layout.
  k_pe is rotated in interleaved pairs (DeepSeek's complex form): for i < 32,
  out[2i] = k[2i] cos_i - k[2i+1] sin_i, out[2i+1] = k[2i] sin_i + k[2i+1] cos_i.
Outputs
- kv_fp8   float8_e4m3fn [T, C]  compare: quantized (dequantised with kv_scale)
- kv_scale float32 [T, C/128]
- k_pe     bfloat16 [T, R]
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import blocky_weight, compute_dtype, fp8_linear, fp8_quantize, fp8_values_and_quantum, out_dtype

EPS, ROPE_THETA = 1e-6, 10000.0
SIZES = {"full": (16384, 7168, 512, 64), "smoke": (8, 256, 256, 64)}  # T, H, C, R
_T, _H, _C, _R = SIZES["full"]

META = ProblemMeta(
    number=56,
    name="mla_kv_compression_requant_deepseekv31_fp8",
    family="quantization",
    dtypes=("bfloat16", "float8_e4m3fn", "float32"),
    source_model="deepseek-ai/DeepSeek-V3.1",
    source_config="hidden_size 7168, kv_lora_rank 512, qk_rope_head_dim 64, rms_norm_eps 1e-6, rope interleaved (official inference apply_rotary_emb), fp8 e4m3 weight_block_size [128, 128]; FP8 latent cache with one fp32 scale per 128 elements",
    inputs=("x", "w_kva", "w_kva_scale", "kv_norm_w", "cos", "sin"),
    outputs=(Output("kv_fp8", compare="quantized", dequantize="dequantize_kv"), Output("kv_scale"), Output("k_pe")),
    flops=2 * _T * _H * (_C + _R) + 6 * _T * _C,
    bytes=_T * _H * 2 + (_C + _R) * _H + 5 * 56 * 4 + _C * 2 + 2 * _T * _R // 2 * 4 + _T * (_C + _C // 128 * 4 + _R * 2),
    peak="fp8_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/56_mla_kv_compression_requant_deepseekv31_fp8.json',
        matches=('in_place', 'dtypes', 'structure_per_draw'),
        differs=(
            ('computation', "upstream: kv_a projection to 640 (512 + 64 rope, padded), RMSNorm of the 512, re-quantisation and the kv_b expansion to 128 heads x (128 + 128) (two fp8 GEMMs, weights quantised inside); mkb stops after the RMSNorm + re-quantisation and returns the RoPE'd k_pe - not yet converted (issue #15 follow-up)"),
            ('outputs', 'upstream returns the expanded per-head k_nope and v; mkb the fp8 latent, its scales and k_pe - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: 64 x 256 = 16384 tokens, hidden 7168 (mkb has the same 16384 x 7168 input) plus the [32768, 512] kv_b weight mkb does not have - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: weights / sqrt(in) x block gain U(0.5, 2), norm weight 1 + 0.1 N; mkb's differ - not yet converted (issue #15 follow-up)"),
            ("exactness", "mkb compares `kv_fp8` as `quantized` (dequantised values at most one quantum off on at most 0.1% of elements), where upstream applies its own rule to the encoded output (exact for integer encodings, fp64-anchored for float8)"),
        ),
    ),
    notes="T = 16384 prefill tokens. Positions are random in [0, 32768); the rotary table is an input so YaRN's details stay upstream.",
)


def dequantize_kv(outputs):
    kv_fp8, kv_scale, _ = outputs
    return fp8_values_and_quantum(kv_fp8, kv_scale, (1, 128))


def reference(x, w_kva, w_kva_scale, kv_norm_w, cos, sin):
    cdt = compute_dtype(x)
    c_dim = kv_norm_w.shape[0]
    y = fp8_linear(x, w_kva, w_kva_scale, mdt=cdt)
    c, kpe = y[:, :c_dim], y[:, c_dim:]
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + EPS) * kv_norm_w.to(cdt)
    kv_fp8, kv_scale = fp8_quantize(c, (1, 128))
    k0, k1 = kpe[:, 0::2], kpe[:, 1::2]
    co, si = cos.to(cdt), sin.to(cdt)
    rot = torch.stack((k0 * co - k1 * si, k0 * si + k1 * co), dim=-1).flatten(-2)
    return kv_fp8, kv_scale, rot.to(out_dtype(cdt))


def make_inputs(seed, *, device, size="full"):
    t, h, c, r = SIZES[size]
    gen = torch.Generator(device=device).manual_seed(seed)
    chan = torch.where(torch.rand(h, generator=gen, device=device) < 0.01, 6.0, 1.0)
    x = (torch.randn(t, h, generator=gen, device=device) * chan).to(torch.bfloat16)
    w, ws = fp8_quantize(blocky_weight((c + r, h), (128, 128), gen, device, std=h**-0.5), (128, 128))
    nw = (1 + 0.2 * torch.randn(c, generator=gen, device=device)).to(torch.bfloat16)
    pos = torch.randint(0, 32768, (t,), generator=gen, device=device).double()
    inv = ROPE_THETA ** (-torch.arange(0, r, 2, device=device, dtype=torch.float64) / r)
    ang = pos[:, None] * inv[None, :]
    return x, w, ws, nw, ang.cos().float(), ang.sin().float()
