"""Varlen vision attention block (QKV projection, RoPE, per-sequence attention, output projection), bf16.

Qwen-Image-Edit-2509 encodes its image inputs with a Qwen2.5-VL-style vision tower; in its attention
blocks the image sequences of a batch are packed ragged (cu_seqlens) and every token attends to all
tokens of its own sequence (no causal mask). This is upstream's SOL-ExecBench recipe of that block:

    qkv = hidden @ qkv_weight.T + qkv_bias           ([T, 1152] -> [T, 3, 16, 72])
    q' = q * cos + rotate_half(q) * sin, k' likewise  (rotate_half(x) = cat(-x[36:], x[:36]))
    for each sequence s: o[s] = softmax(q'[s] k'[s]^T / sqrt(72)) v[s]   (per head, non-causal)
    out = o.reshape(T, 1152) @ proj_weight.T + proj_bias

Inputs: hidden_states bf16 [7168, 1152]; cu_seqlens int64 [28] (the end of each of the 28 sequences,
cumulative lengths without the leading 0); cos, sin bf16 [7168, 16, 72] (1D RoPE, theta 1e4, over each
sequence's own positions 0..len-1, angle = cat(f, f) with f = pos * theta^(-i/36), i < 36, broadcast over
heads); qkv_weight bf16 [3456, 1152], qkv_bias [3456], proj_weight [1152, 1152], proj_bias [1152].
Output: out bf16 [7168, 1152].

Numerics: the reference computes in float32 (float64 for the fp64 anchor) with no intermediate rounding
and rounds once to bf16. The eager baseline runs the block in bf16 (GEMMs with fp32 accumulation,
scaled_dot_product_attention per sequence).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream

NUMBER = 11
ROPE_THETA = 10000.0
# sequence lengths (fixed, as upstream's recipe authors them), heads, head dim
_SPLITS = {
    "full": (255, 85, 425, 170, 680, 85, 170, 340, 85, 510, 170, 255, 85, 340, 170, 425, 85, 255, 170, 85, 170,
             510, 340, 170, 255, 170, 85, 623),
    "smoke": (6, 3, 7),
}
_HEADS = {"full": (16, 72), "smoke": (2, 8)}


def _rope(size, device):
    heads, head_dim = _HEADS[size]
    lengths = torch.tensor(_SPLITS[size], dtype=torch.int64, device=device)
    ends = lengths.cumsum(0)
    total = int(sum(_SPLITS[size]))
    positions = torch.arange(total, dtype=torch.int64, device=device) - torch.repeat_interleave(ends - lengths, lengths,
                                                                                               output_size=total)
    half = head_dim // 2
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(half, dtype=torch.float32, device=device) / half))
    freqs = torch.outer(positions.to(torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :].expand(total, heads, head_dim)
    return ends, emb.cos().to(torch.bfloat16).contiguous(), emb.sin().to(torch.bfloat16).contiguous()


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _bounds(cu_seqlens):
    ends = cu_seqlens.tolist()
    return list(zip([0] + ends[:-1], ends))


def reference(hidden_states, cu_seqlens, cos, sin, qkv_weight, qkv_bias, proj_weight, proj_bias):
    dt = torch.promote_types(hidden_states.dtype, torch.float32)
    total, embed = hidden_states.shape
    heads, head_dim = cos.shape[1], cos.shape[2]
    qkv = (hidden_states.to(dt) @ qkv_weight.to(dt).T + qkv_bias.to(dt)).view(total, 3, heads, head_dim)
    c, s = cos.to(dt), sin.to(dt)
    q = qkv[:, 0] * c + _rotate_half(qkv[:, 0]) * s
    k = qkv[:, 1] * c + _rotate_half(qkv[:, 1]) * s
    v = qkv[:, 2]
    o = torch.empty_like(q)
    for a, b in _bounds(cu_seqlens):
        scores = torch.einsum("ihd,jhd->hij", q[a:b], k[a:b]) / math.sqrt(head_dim)
        o[a:b] = torch.einsum("hij,jhd->ihd", torch.softmax(scores, dim=-1), v[a:b])
    return (o.reshape(total, embed) @ proj_weight.to(dt).T + proj_bias.to(dt)).to(hidden_states.dtype)


def eager(hidden_states, cu_seqlens, cos, sin, qkv_weight, qkv_bias, proj_weight, proj_bias):
    total, embed = hidden_states.shape
    heads, head_dim = cos.shape[1], cos.shape[2]
    qkv = F.linear(hidden_states, qkv_weight, qkv_bias).view(total, 3, heads, head_dim)
    q = qkv[:, 0] * cos + _rotate_half(qkv[:, 0]) * sin
    k = qkv[:, 1] * cos + _rotate_half(qkv[:, 1]) * sin
    v = qkv[:, 2]
    o = torch.empty_like(q)
    for a, b in _bounds(cu_seqlens):
        o[a:b] = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                v[a:b].transpose(0, 1)).transpose(0, 1)
    return F.linear(o.reshape(total, embed), proj_weight, proj_bias)


def make_inputs(seed: int, *, device, size: str = "full"):
    heads, head_dim = _HEADS[size]
    embed = heads * head_dim
    total = int(sum(_SPLITS[size]))
    ends, cos, sin = _rope(size, device)
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    hidden = torch.randn(total, embed, generator=g, device=device).to(bf)
    qkv_weight = (torch.randn(3 * embed, embed, generator=g, device=device) / math.sqrt(embed)).to(bf)
    qkv_bias = (0.1 * torch.randn(3 * embed, generator=g, device=device)).to(bf)
    proj_weight = (torch.randn(embed, embed, generator=g, device=device) / math.sqrt(embed)).to(bf)
    proj_bias = (0.1 * torch.randn(embed, generator=g, device=device)).to(bf)
    return hidden, ends, cos, sin, qkv_weight, qkv_bias, proj_weight, proj_bias


def _cost():
    heads, head_dim = _HEADS["full"]
    embed, total = heads * head_dim, sum(_SPLITS["full"])
    sq = sum(n * n for n in _SPLITS["full"])
    flops = 2.0 * total * embed * 4 * embed + 4.0 * sq * embed
    nbytes = 2 * (2 * total * embed + 2 * total * embed + 4 * embed * embed + 4 * embed) + 8 * len(_SPLITS["full"])
    return flops, float(nbytes)


_FLOPS, _BYTES = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="varlen_vision_attention_qwen_image_edit_bf16",
    family="attention",
    dtypes=("bf16", "int64"),
    source_model="Qwen/Qwen-Image-Edit-2509 (vision attention block)",
    source_config="embed 1152 = 16 heads x 72, fused QKV with bias, output projection with bias, 1D RoPE theta 1e4 "
                  "over each sequence's positions; SOL-ExecBench workload: 28 sequences, 7168 tokens",
    inputs=("hidden_states", "cu_seqlens", "cos", "sin", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias"),
    outputs=(Output("out"),),
    flops=_FLOPS,
    bytes=_BYTES,
    peak="bf16_tc",
    fixed_inputs=("cu_seqlens", "cos", "sin"),
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/11_varlen_vision_attention_qwen_image_edit_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(
            ("computation", "the recipe's reference body is masked; mkb reads it as the Qwen2.5-VL vision attention block its description names (fused QKV with bias, rotate-half RoPE from the given cos/sin, non-causal softmax(q k^T / sqrt(72)) v per sequence, output projection with bias), cu_seqlens as the recipe builds it (cumulative lengths without a leading 0), in fp32 without intermediate rounding."),
        ),
    ),
    notes="Inputs as upstream's recipe: hidden N(0, 1), weights N(0, 1)/sqrt(1152), biases 0.1 N(0, 1); the 28 "
    "sequence splits are the recipe's fixed ones (so cu_seqlens, cos and sin are the same every draw, as upstream's). "
    "The recipe's reference body and the casts of cos/sin are masked: the block is read as the Qwen2.5-VL "
    "vision attention it names (fused QKV, rotate-half RoPE, non-causal attention per sequence, output projection), "
    "cu_seqlens as the recipe builds it (cumulative lengths, no leading 0) and cos/sin in bf16. "
    "Smoke: sequences of 6, 3 and 7 tokens, 2 heads x 8.",
)
