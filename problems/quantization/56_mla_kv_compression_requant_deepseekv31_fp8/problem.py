"""DeepSeek-V3.1 MLA KV path in block fp8: kv_a compression, latent RMSNorm, re-quantisation, kv_b expansion to k_nope, v.

Upstream MetaKernelBench's problem 56 (a SOL-ExecBench recipe): 64 x 256 tokens, hidden 7168, the kv_a
projection padded to 640 outputs (latent 512 + rope 64 + padding), kv_b expanding the latent to 128 heads
x (128 + 128); both weights and both activations quantised to fp8 inside the call.

Inputs (B = 64, S = 256, H = 7168, A = 640, C = 512, heads N = 128, Dk = Dv = 128)
- hidden_states          bfloat16 [B, S, H]
- kv_a_proj_weight       bfloat16 [A, H]      (nn.Linear layout; rows 0..C-1 the latent)
- kv_a_layernorm_weight  bfloat16 [C]
- kv_b_proj_weight       bfloat16 [N (Dk + Dv), C]
- eps                    float 1e-6

Numerics (mkb.problems.quant): activations are quantised to fp8 e4m3 with dynamic 1x128 block scales,
weights with 128x128 block scales (scale = max(amax, 1e-10) / 448 in float32, code = e4m3(clamp(v /
scale, -448, 448)), round to nearest even); a GEMM is dequant(a) @ dequant(w)^T in float32 (the
reference promotes to float64 for the anchor; the quantisation casts are fixed).
  ckv = fp8 GEMM(hidden_states, kv_a_proj_weight), rounded to bfloat16 (as upstream rounds the GEMM
        to the input dtype); c = ckv[..., :C]  (the rope and padding columns are not used)
  c = c * rsqrt(mean(c^2) + eps) * kv_a_layernorm_weight       (float32, not rounded)
  kv = fp8 GEMM(c, kv_b_proj_weight) -> [B, S, N, Dk + Dv], rounded to bfloat16
Outputs bfloat16: k_nope = kv[..., :Dk] [B, S, N, Dk], v = kv[..., Dk:] [B, S, N, Dv].
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, expand_block_scale, fp8_linear, fp8_quantize, out_dtype

EPS = 1e-6
HEAD_DIM = 128  # qk_nope_head_dim = v_head_dim
SIZES = {"full": (64, 256, 7168, 640, 512, 128), "smoke": (1, 8, 256, 256, 128, 2)}  # B, S, H, A, C, N
_B, _S, _H, _A, _C, _N = SIZES["full"]
_D = HEAD_DIM
_T = _B * _S

META = ProblemMeta(
    number=56,
    name="mla_kv_compression_requant_deepseekv31_fp8",
    family="quantization",
    dtypes=("bfloat16",),
    source_model="DeepSeek-V3.1 (FP8 block quantisation); SOL-ExecBench recipe",
    source_config="64 x 256 tokens, hidden 7168, kv_a_proj 7168 -> 640 (kv_lora_rank 512 + rope 64, padded), "
                  "kv_a_layernorm eps 1e-6, kv_b_proj 512 -> 128 heads x (128 + 128); block-wise fp8 e4m3 "
                  "(activations 1x128 dynamic, weights 128x128), all quantised in the call",
    inputs=("hidden_states", "kv_a_proj_weight", "kv_a_layernorm_weight", "kv_b_proj_weight", "eps"),
    outputs=(Output("k_nope"), Output("v")),
    flops=2 * _T * _H * _A + 2 * _T * _C * _N * 2 * _D + 4 * (_T * _H + _A * _H + _T * _C + 2 * _N * _D * _C)
    + 4 * _T * _C,
    bytes=_T * _H * 2 + _A * _H * 2 + _C * 2 + 2 * _N * _D * _C * 2 + _T * _N * 2 * _D * 2,
    peak="fp8_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/56_mla_kv_compression_requant_deepseekv31_fp8.json",
        matches=("computation", "in_place", "shapes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("outputs", "the recipe hides its return line: mkb returns the expansion split per head into k_nope "
             "and v, each [64, 256, 128, 128] bfloat16"),
            ("dtypes", "the recipe hides the input dtypes and its fifth input (three characters): mkb passes the "
             "activation and weights in bfloat16 and the RMSNorm eps as the float 1e-6 (DeepSeek-V3.1's "
             "rms_norm_eps), and returns bfloat16 (the GEMMs are cast to the activation's dtype, as upstream "
             "casts them)"),
        ),
    ),
    notes="Inputs as the recipe: hidden_states N(0, 1); each weight N(0, 1)/sqrt(fan_in) times a per-128x128-block "
          "gain U(0.5, 2); the norm weight 1 + 0.1 N(0, 1). The latent is re-quantised from its float32 normalised "
          "value (the recipe hides whether it is rounded to bfloat16 first).",
)


def _kv(hidden_states, kv_a_proj_weight, kv_a_layernorm_weight, kv_b_proj_weight, eps, *, mdt=None):
    cdt = compute_dtype(hidden_states)
    od = out_dtype(cdt)
    mdt = mdt or cdt
    c_dim = kv_a_layernorm_weight.shape[0]
    wa, wa_s = fp8_quantize(kv_a_proj_weight, (128, 128))
    ckv = fp8_linear(hidden_states, wa, wa_s, mdt=mdt).to(cdt).to(od)
    c = ckv[..., :c_dim].to(cdt)
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps) * kv_a_layernorm_weight.to(cdt)
    wb, wb_s = fp8_quantize(kv_b_proj_weight, (128, 128))
    kv = fp8_linear(c, wb, wb_s, mdt=mdt).to(cdt).to(od)
    kv = kv.view(*hidden_states.shape[:-1], -1, 2 * HEAD_DIM)
    return kv[..., :HEAD_DIM], kv[..., HEAD_DIM:]


def reference(*inputs):
    return _kv(*inputs)


def eager(*inputs):
    """The same quantisations; the GEMMs on the dequantised operands rounded to bfloat16 (fp32 accumulation)."""
    return _kv(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    b, s, h, a, c, n = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def weight(rows, cols):
        w = torch.randn(rows, cols, generator=gen, device=device) * cols**-0.5
        gain = torch.rand(rows // 128, cols // 128, generator=gen, device=device) * 1.5 + 0.5
        return (w * expand_block_scale(gain, (128, 128), w.shape)).to(torch.bfloat16)

    hidden_states = torch.randn(b, s, h, generator=gen, device=device).to(torch.bfloat16)
    kv_a = weight(a, h)
    norm_w = (1 + 0.1 * torch.randn(c, generator=gen, device=device)).to(torch.bfloat16)
    kv_b = weight(n * 2 * HEAD_DIM, c)
    return hidden_states, kv_a, norm_w, kv_b, EPS
