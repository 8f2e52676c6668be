"""Qwen3-VL multimodal input embeddings: a text-embedding lookup merged with nvfp4 (W4A4) projections of the vision tokens.

Upstream MetaKernelBench's problem 55 (a SOL-ExecBench recipe): batch 32 x 1024 positions, 384 of them
vision positions per row; text vocabulary 151936 x hidden 8192; vision features 3584 wide projected
to 8192 with a bias through an nvfp4 weight, the features quantised to nvfp4 inside the call.

Inputs (B = 32, S = 1024, V = 384 vision tokens per row, H = 8192, vocabulary W = 151936, F = 3584)
- input_ids            int64 [B, S]       token ids in [0, W)
- embed_tokens_weight  bfloat16 [W, H]
- vision_features      bfloat16 [B, V, F]
- w uint8 [H, F/2], w_bs float8_e4m3fn [H, F/16], w_g float32 []   the projection weight in nvfp4
- vision_proj_bias     bfloat16 [H]
- vision_token_mask    bool [B, S]        exactly V True per row, at positions redrawn per draw

nvfp4 (mkb.problems.quant): e2m1 codes two per byte (element 2j in the low nibble), an e4m3 scale per
16 consecutive elements, value = e2m1 * block_scale * global_scale. The features are quantised in the
call with a dynamic global scale g = amax(|vision_features|) / (6 * 448) over the whole tensor
(float32), block_scale = e4m3(min(amax_block / (6 g), 448)), code = e2m1(v / (block_scale * g)) (ties
to even).
Numerics (float32; the reference promotes to float64 for the anchor; the quantisation casts are fixed):
  text = embed_tokens_weight[input_ids]                                        (an exact copy)
  vision = round_bf16(dequant(nvfp4(vision_features, g)) @ dequant(w)^T) + vision_proj_bias
           (the GEMM rounded to bfloat16 as upstream rounds it to the input dtype)
  out = text, with row b's True positions of vision_token_mask, in ascending order, replaced by
        vision[b, 0..V-1]; bfloat16 [B, S, H].
"""

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.quant import compute_dtype, nvfp4_global_scale, nvfp4_linear, nvfp4_weight, out_dtype

SIZES = {"full": (32, 1024, 384, 8192, 151936, 3584), "smoke": (2, 16, 4, 32, 64, 48)}  # B, S, V, H, W, F
_B, _S, _V, _H, _W, _F = SIZES["full"]

META = ProblemMeta(
    number=55,
    name="multimodal_embedding_projection_qwen3vl_nvfp4",
    family="quantization",
    dtypes=("int64", "bfloat16", "uint8", "float8_e4m3fn", "float32", "bool"),
    source_model="Qwen3-VL (nvfp4 vision projection); SOL-ExecBench recipe",
    source_config="batch 32 x 1024 positions with 384 vision tokens each; text embedding 151936 x 8192; vision "
                  "projection 3584 -> 8192 with bias in nvfp4 (block 16, e4m3 block scales, fp32 global scales, "
                  "dynamic activation global scale)",
    inputs=("input_ids", "embed_tokens_weight", "vision_features", "w", "w_bs", "w_g", "vision_proj_bias",
            "vision_token_mask"),
    outputs=(Output("inputs_embeds"),),
    flops=2 * _B * _V * _F * _H + 4 * _B * _V * _F,
    bytes=_B * _S * 8 + _B * _S * _H * 2 + _B * _V * _F * 2 + _H * _F * (0.5 + 1 / 16) + _H * 2 + _B * _S
    + _B * _S * _H * 2,
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/55_multimodal_embedding_projection_qwen3vl_nvfp4.json",
        matches=("computation", "outputs", "in_place", "shapes", "structure_per_draw", "exactness"),
        differs=(
            ("dtypes", "the recipe hides most input dtypes: mkb passes ids as int64, the table, features and bias in "
             "bfloat16, the mask as bool, and the packed weight codes as uint8 (upstream's fp4x2 tensor viewed as "
             "bytes: the same bits, element 2j in the low nibble)"),
            ("distributions", "the weight is N(0, 1)/sqrt(3584) as upstream, then scaled by a per-seed factor in "
             "[1/4, 4] (mkb.problems.quant.nvfp4_weight) so its global scale changes between draws and a kernel "
             "that mishandles it fails; ids uniform over the vocabulary, table, features and bias N(0, 1), and the "
             "vision positions a uniform random 384-subset of each row, as upstream"),
        ),
    ),
    notes="The vision positions are redrawn on every draw. Hopper has no fp4 tensor cores: the applicable peak is "
          "bf16. The features' global scale is an amax over the whole tensor, computed in the call.",
)


def _merge(input_ids, embed_tokens_weight, vision_features, w, w_bs, w_g, vision_proj_bias, vision_token_mask,
           *, mdt=None):
    cdt = compute_dtype(vision_features)
    od = out_dtype(cdt)
    g = nvfp4_global_scale(vision_features)
    vision = nvfp4_linear(vision_features, g, w, w_bs, w_g, mdt=mdt or cdt).to(cdt).to(od)
    vision = (vision.to(cdt) + vision_proj_bias.to(cdt)).to(od)
    out = torch.nn.functional.embedding(input_ids, embed_tokens_weight).to(od)
    out[vision_token_mask] = vision.reshape(-1, vision.shape[-1])
    return out


def reference(*inputs):
    return _merge(*inputs)


def eager(*inputs):
    """Dequantise to bfloat16 and run a bf16 GEMM (fp32 accumulation); gather and masked scatter."""
    return _merge(*inputs, mdt=torch.bfloat16)


def make_inputs(seed, *, device, size="full"):
    b, s, v, h, vocab, f = SIZES[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    input_ids = torch.randint(0, vocab, (b, s), generator=gen, device=device)
    table = torch.randn(vocab, h, generator=gen, device=device, dtype=torch.bfloat16)
    features = torch.randn(b, v, f, generator=gen, device=device).to(torch.bfloat16)
    w, w_bs, w_g = nvfp4_weight(torch.randn(h, f, generator=gen, device=device) * f**-0.5, seed)
    bias = torch.randn(h, generator=gen, device=device).to(torch.bfloat16)
    # a uniform random V-subset of each row's positions: the V smallest of S uniform keys
    keys = torch.rand(b, s, generator=gen, device=device)
    mask = torch.zeros(b, s, dtype=torch.bool, device=device)
    mask.scatter_(1, keys.topk(v, dim=1, largest=False).indices, True)
    return input_ids, table, features, w, w_bs, w_g, bias, mask
