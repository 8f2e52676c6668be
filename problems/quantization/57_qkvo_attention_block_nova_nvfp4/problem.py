"""A GQA attention block with nvfp4 (W4A4) q, k, v and o projections around an unquantised causal attention core, RoPE on q and k.

Upstream MetaKernelBench's problem 57 (a SOL-ExecBench recipe, "Nova"): batch 64 x 128 tokens, hidden
8192, 64 query heads and 8 key/value heads of dimension 128; four separate nvfp4 weights, each
activation quantised to nvfp4 inside the call with its own dynamic global scale; cos/sin [B, S, 128]
passed as inputs.

Inputs (B = 64, S = 128, H = 8192, Hq = 64, Hkv = 8, D = 128, Q = Hq D = 8192, K = Hkv D = 1024)
- hidden_states  bfloat16 [B, S, H]
- cos, sin       bfloat16 [B, S, D]   rotary table of each row's positions (first and second halves equal)
- q_w uint8 [Q, H/2], q_w_bs float8_e4m3fn [Q, H/16], q_w_g float32 []   (likewise k_w, v_w with K rows,
  and o_w [H, Q/2], o_w_bs [H, Q/16], o_w_g)   the projection weights in nvfp4

nvfp4 (mkb.problems.quant): e2m1 codes two per byte (element 2j in the low nibble), an e4m3 scale per 16
consecutive elements, value = e2m1 * block_scale * global_scale. An activation a is quantised in the call
with g = amax(|a|) / (6 * 448) over the whole tensor (float32), block_scale = e4m3(min(amax_block /
(6 g), 448)), code = e2m1(v / (block_scale * g)) (ties to even).
Numerics (float32; the reference promotes to float64 for the anchor; the quantisation casts are fixed):
  lin(a, w) = dequant(nvfp4(a)) @ dequant(w)^T, rounded to bfloat16 (as upstream rounds each projection
  to the input dtype)
  q, k, v = lin(hidden_states, q_w / k_w / v_w), split into heads
  RoPE (half-split, Llama rotate_half) on q and k: t * cos + cat(-t[D/2:], t[:D/2]) * sin
  attn = softmax(q k^T / sqrt(D), causal) v per head, query head h reading kv head h // 8 (unquantised);
  heads concatenated to [B, S, Q]
  out = lin(attn, o_w) -> bfloat16 [B, S, H]
"""

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_global_scale, nvfp4_linear, nvfp4_weight, out_dtype

ROPE_THETA, ROPE_LINEAR = 100000.0, 4.0
SIZES = {"full": (64, 128, 8192, 64, 8, 128), "smoke": (1, 16, 64, 4, 2, 16)}  # B, S, H, Hq, Hkv, D
_B, _S, _H, _HQ, _HKV, _D = SIZES["full"]
_T, _Q, _K = _B * _S, _HQ * _D, _HKV * _D

META = ProblemMeta(
    number=57,
    name="qkvo_attention_block_nova_nvfp4",
    family="quantization",
    dtypes=("bfloat16", "uint8", "float8_e4m3fn", "float32"),
    source_model="Nova (nvfp4 attention block); SOL-ExecBench recipe",
    source_config="batch 64 x 128 tokens, hidden 8192, 64 query / 8 kv heads, head_dim 128, causal, RoPE from "
                  "cos/sin [B, S, 128]; q/k/v/o weights in nvfp4 (block 16, e4m3 block scales, fp32 global "
                  "scales), activations quantised with dynamic global scales; attention core unquantised",
    inputs=("hidden_states", "cos", "sin", "q_w", "q_w_bs", "q_w_g", "k_w", "k_w_bs", "k_w_g", "v_w", "v_w_bs",
            "v_w_g", "o_w", "o_w_bs", "o_w_g"),
    outputs=(Output("out"),),
    flops=2 * _T * _H * (_Q + 2 * _K) + 2 * _T * _Q * _H + 2 * 2 * _B * _HQ * _S * _S * _D / 2,
    bytes=_T * _H * 2 * 2 + 2 * _T * _D * 2 + (2 * _Q * _H + 2 * _K * _H) * (0.5 + 1 / 16),
    peak="bf16_tc",
    insensitive_inputs=(("cos", "the table of each row is a real rotary table of contiguous positions from a random start; RoPE scores depend only on position differences, so a redraw (another start) changes them only by the tables' bf16 rounding, which at full size is below the output's tolerance (its fp64 gap is ~5% of max|out|: the attention output is re-quantised to nvfp4). The smoke audit checks the tables."), ("sin", "as cos: the table of each row is a real rotary table of contiguous positions from a random start; RoPE scores depend only on position differences, so a redraw (another start) changes them only by the tables' bf16 rounding, which at full size is below the output's tolerance (its fp64 gap is ~5% of max|out|: the attention output is re-quantised to nvfp4). The smoke audit checks the tables.")),
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/57_qkvo_attention_block_nova_nvfp4.json",
        matches=("computation", "outputs", "in_place", "shapes", "structure_per_draw", "exactness"),
        differs=(
            ("dtypes", "the recipe hides the input dtypes: mkb passes hidden_states, cos and sin in bfloat16 and "
             "the packed weight codes as uint8 (upstream's fp4x2 tensors viewed as bytes: the same bits, element "
             "2j in the low nibble), block scales float8_e4m3fn, global scales float32 0-dim"),
            ("distributions", "the recipe hides how cos and sin are drawn (one generator call each): mkb passes a "
             "real rotary table (theta 100000, linear scaling 4, a random start position per row up to 8192, "
             "redrawn per draw); hidden_states N(0, 1) and the weights N(0, 1)/sqrt(fan_in) as upstream, each "
             "weight then scaled by a per-seed factor in [1/4, 4] (mkb.problems.quant.nvfp4_weight) so its "
             "global scale changes between draws and a kernel that mishandles it fails; k's factor is the inverse "
             "of q's, so the scores keep upstream's spread (q k^T / sqrt(128) ~ N(0, 1)) at every draw (independent "
             "factors put it anywhere in 1/16 .. 16: at 1/16 the softmax is nearly uniform and the output hardly "
             "depends on q and k, which let redrawn q/k block and global scales pass the full-size audit)"),
        ),
    ),
    notes="Where the recipe hides it, RoPE, the scores, the softmax and P V run in float32 on the "
          "bfloat16-rounded projections and the attention output is quantised from its float32 value. Hopper has "
          "no fp4 tensor cores: the applicable peak is bf16; flops count the causal half of the scores.",
)


def _lin(a, w, w_bs, w_g, cdt, mdt):
    return nvfp4_linear(a, nvfp4_global_scale(a), w, w_bs, w_g, mdt=mdt).to(cdt).to(out_dtype(cdt))


def _rope(t, cos, sin):
    half = t.shape[-1] // 2
    return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin


def _block(hidden_states, cos, sin, q_w, q_w_bs, q_w_g, k_w, k_w_bs, k_w_g, v_w, v_w_bs, v_w_g, o_w, o_w_bs, o_w_g,
           *, mdt=None):
    cdt = compute_dtype(hidden_states)
    mdt = mdt or cdt
    b, s, _ = hidden_states.shape
    d = cos.shape[-1]
    q = _lin(hidden_states, q_w, q_w_bs, q_w_g, cdt, mdt).to(cdt).view(b, s, -1, d).transpose(1, 2)
    k = _lin(hidden_states, k_w, k_w_bs, k_w_g, cdt, mdt).to(cdt).view(b, s, -1, d).transpose(1, 2)
    v = _lin(hidden_states, v_w, v_w_bs, v_w_g, cdt, mdt).to(cdt).view(b, s, -1, d).transpose(1, 2)
    co, si = cos.to(cdt).unsqueeze(1), sin.to(cdt).unsqueeze(1)
    q, k = _rope(q, co, si), _rope(k, co, si)
    if mdt == torch.bfloat16:
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        attn = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
    attn = attn.transpose(1, 2).reshape(b, s, -1)
    return _lin(attn, o_w, o_w_bs, o_w_g, cdt, mdt)


def reference(*inputs):
    return _block(*inputs)


def eager(*inputs):
    """bf16 GEMMs on the exact e2m1 x e4m3 operands (fp32 accumulation) and PyTorch's fused causal SDPA in fp32.

    A bf16 SDPA would move re-quantised attention codes by a quantum beyond the output tolerance, so
    attention stays in float32.
    """
    return _block(*inputs, mdt=torch.bfloat16)


def _weight_factor(seed: int, index: int) -> float:
    """The per-seed factor mkb.problems.quant.nvfp4_weight scales weight `index` by (2^(4 f - 2), f its hash)."""
    return 2.0 ** (4 * (((int(seed) * 2654435761 + index * 2147483648) % 2**32) / 2**32) - 2)


def make_inputs(seed, *, device, size="full"):
    b, s, h, hq, hkv, d = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    hidden_states = torch.randn(b, s, h, generator=gen, device=device).to(torch.bfloat16)
    start = torch.randint(0, 8192, (b, 1), generator=gen, device=device).double()
    pos = (start + torch.arange(s, device=device, dtype=torch.float64)) / ROPE_LINEAR
    inv = ROPE_THETA ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)
    ang = pos[..., None] * inv
    ang = torch.cat((ang, ang), dim=-1)
    weights = []
    for i, (rows, cols) in enumerate(((hq * d, h), (hkv * d, h), (hkv * d, h), (h, hq * d))):
        w = torch.randn(rows, cols, generator=gen, device=device) * cols**-0.5
        if i == 1:  # k: nvfp4_weight scales it by its own factor; this makes the product of q's and k's factors 1
            w = w / (_weight_factor(seed, 0) * _weight_factor(seed, 1))
        weights += nvfp4_weight(w, seed, i)
    return (hidden_states, ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16), *weights)
