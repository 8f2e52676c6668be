"""Bria FIBO joint-attention block: AdaLN modulation, image q/k/v and text k/v projections, 3-axis RoPE, output.

The SOL-ExecBench recipe's subgraph, from the block's inputs to its attention output. Per batch b:
  emb = silu(timestep_embedding) @ adaln_linear_weight^T + adaln_linear_bias       [B, 6 * 3072]
  (shift, scale, gate) = the first three 3072-wide chunks of emb (the other three feed the block's MLP)
  x = LayerNorm(hidden_states; no affine, eps 1e-6) * (1 + scale) + shift          (AdaLN-Zero)
  q, k, v = x @ to_{q,k,v}_weight^T + to_{q,k,v}_bias        (image tokens, 24 heads of 128)
  q, k = RoPE(q), RoPE(k): interleaved pairs (x[2i], x[2i+1]) rotated by the angle of pair i; the 64 pair
      angles of a token are cat(axis0[pos_idx_axis0], axis1[pos_idx_axis1], axis2[pos_idx_axis2]) of the
      per-axis tables (8, 28, 28 pairs), i.e. cos_axisN[p] / sin_axisN[p] gathered by the token's position
  joint block (is_joint_block = 1): keys and values also hold the text tokens,
      k_ctx, v_ctx = encoder_hidden_states @ to_{k,v}_context_weight^T + bias  (4096 -> 3072, no RoPE:
      text positions are 0 in FIBO), appended after the image tokens; is_joint_block = 0 attends image only
  o = softmax(q k^T / sqrt(128)) v  (no mask), heads flattened back to 3072
  out = hidden_states + gate * (o @ to_out_weight^T + to_out_bias)                  -> [B, 1024, 3072]

Inputs (float32, the recipe's order): hidden_states [4, 1024, 3072], timestep_embedding [4, 3072],
encoder_hidden_states [4, 256, 4096], adaln_linear_weight [18432, 3072], adaln_linear_bias [18432],
to_q/k/v_weight [3072, 3072] and biases [3072], to_k/v_context_weight [3072, 4096] and biases, to_out_weight
[3072, 3072] and bias, pos_idx_axis0..2 int64 [1024] (the 4x16x16 raster grid), cos_axis0/sin_axis0 [4, 8],
cos_axis1/sin_axis1 [16, 28], cos_axis2/sin_axis2 [16, 28] (positions of the axis x pair angles,
theta^(-2i/d) with d = 16, 56, 56 and theta 1e4), and the Python constant is_joint_block = 1.

Numerics: float32 (float64 for the fp64 anchor), no intermediate rounding.
Sizes: full as the recipe; smoke = batch 2, a 2x2x4 grid (16 image tokens), 8 text tokens, hidden 64
(2 heads of 32, axes 8/12/12), joint dim 48.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta, Upstream

NUMBER = 13
ROPE_THETA, LN_EPS, IS_JOINT_BLOCK = 10000.0, 1e-6, 1
# batch, grid (axis0, axis1, axis2), text tokens, hidden, joint dim, rotary dims per axis (sum = head_dim)
_SIZES = {
    "full": (4, (4, 16, 16), 256, 3072, 4096, (16, 56, 56)),
    "smoke": (2, (2, 2, 4), 8, 64, 48, (8, 12, 12)),
}


def _rope_pairs(x, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) by the angle whose cos/sin are [..., i]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def reference(hidden_states, timestep_embedding, encoder_hidden_states, adaln_linear_weight, adaln_linear_bias,
              to_q_weight, to_q_bias, to_k_weight, to_k_bias, to_v_weight, to_v_bias,
              to_k_context_weight, to_k_context_bias, to_v_context_weight, to_v_context_bias,
              to_out_weight, to_out_bias, pos_idx_axis0, pos_idx_axis1, pos_idx_axis2,
              cos_axis0, sin_axis0, cos_axis1, sin_axis1, cos_axis2, sin_axis2, is_joint_block):
    dt = torch.promote_types(hidden_states.dtype, torch.float32)

    def f(t):
        return t.to(dt)

    h = f(hidden_states)
    batch, seq, hidden = h.shape
    cos = torch.cat([f(cos_axis0)[pos_idx_axis0], f(cos_axis1)[pos_idx_axis1], f(cos_axis2)[pos_idx_axis2]], -1)
    sin = torch.cat([f(sin_axis0)[pos_idx_axis0], f(sin_axis1)[pos_idx_axis1], f(sin_axis2)[pos_idx_axis2]], -1)
    head_dim = 2 * cos.shape[-1]
    heads = hidden // head_dim
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]

    emb = F.linear(F.silu(f(timestep_embedding)), f(adaln_linear_weight), f(adaln_linear_bias))
    shift, scale, gate = (c[:, None, :] for c in emb.chunk(6, dim=-1)[:3])
    x = F.layer_norm(h, (hidden,), eps=LN_EPS) * (1.0 + scale) + shift
    q = F.linear(x, f(to_q_weight), f(to_q_bias)).view(batch, seq, heads, head_dim)
    k = F.linear(x, f(to_k_weight), f(to_k_bias)).view(batch, seq, heads, head_dim)
    v = F.linear(x, f(to_v_weight), f(to_v_bias)).view(batch, seq, heads, head_dim)
    q, k = _rope_pairs(q, cos, sin), _rope_pairs(k, cos, sin)
    if is_joint_block:
        ctx = f(encoder_hidden_states)
        s_txt = ctx.shape[1]
        k_ctx = F.linear(ctx, f(to_k_context_weight), f(to_k_context_bias)).view(batch, s_txt, heads, head_dim)
        v_ctx = F.linear(ctx, f(to_v_context_weight), f(to_v_context_bias)).view(batch, s_txt, heads, head_dim)
        k, v = torch.cat([k, k_ctx], dim=1), torch.cat([v, v_ctx], dim=1)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * head_dim**-0.5
    o = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v).reshape(batch, seq, hidden)
    out = h + gate * F.linear(o, f(to_out_weight), f(to_out_bias))
    return out.to(hidden_states.dtype)


def _positions(grid, device):
    """The raster grid's per-axis positions of tokens 0..N-1 (axis 2 fastest)."""
    token = torch.arange(grid[0] * grid[1] * grid[2], device=device)
    return token // (grid[1] * grid[2]), (token // grid[2]) % grid[1], token % grid[2]


def _axis_tables(grid, axes, device):
    """cos/sin [positions of the axis, rotary dims / 2] per axis, computed in float64 and stored as float32."""
    dev = "cpu" if str(device) == "meta" else device
    out = []
    for n, d in zip(grid, axes):
        inv_freq = ROPE_THETA ** -(torch.arange(0, d, 2, dtype=torch.float64, device=dev) / d)
        ang = torch.arange(n, dtype=torch.float64, device=dev)[:, None] * inv_freq[None, :]
        out += [torch.cos(ang).float().to(device), torch.sin(ang).float().to(device)]
    return out


def make_inputs(seed: int, *, device, size: str = "full"):
    batch, grid, s_txt, hidden, joint, axes = _SIZES[size]
    seq = grid[0] * grid[1] * grid[2]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    def linear(n_out, n_in):
        return randn(n_out, n_in) / math.sqrt(n_in), 0.1 * randn(n_out)

    hidden_states = randn(batch, seq, hidden)
    timestep_embedding = randn(batch, hidden)
    encoder_hidden_states = randn(batch, s_txt, joint)
    adaln = linear(6 * hidden, hidden)
    qkv = [t for _ in range(3) for t in linear(hidden, hidden)]
    ctx = [t for _ in range(2) for t in linear(hidden, joint)]
    out = linear(hidden, hidden)
    return (hidden_states, timestep_embedding, encoder_hidden_states, *adaln, *qkv, *ctx, *out,
            *_positions(grid, device), *_axis_tables(grid, axes, device), IS_JOINT_BLOCK)


def _cost():
    batch, grid, s_txt, hidden, joint, axes = _SIZES["full"]
    seq = grid[0] * grid[1] * grid[2]
    flops = (2.0 * batch * hidden * 6 * hidden + 4 * 2.0 * batch * seq * hidden * hidden
             + 2 * 2.0 * batch * s_txt * joint * hidden + 4.0 * batch * seq * (seq + s_txt) * hidden)
    weights = 6 * hidden * hidden + 4 * hidden * hidden + 2 * hidden * joint + 12 * hidden
    acts = 2 * batch * seq * hidden + batch * hidden + batch * s_txt * joint
    nbytes = 4 * (weights + acts) + 8 * 3 * seq + 4 * 2 * sum(n * d // 2 for n, d in zip(grid, axes))
    return flops, float(nbytes)


_FLOPS, _BYTES = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="dual_stream_joint_attention_fibo_fp32",
    family="attention",
    dtypes=("float32", "int64"),
    source_model="briaai/FIBO (diffusers BriaFiboTransformer2DModel joint block), at the SOL-ExecBench recipe's "
    "workload",
    source_config="hidden 3072 = 24 heads x 128, joint_attention_dim 4096, AdaLN modulation 6 x 3072, "
    "axes_dims_rope [16, 56, 56], rope_theta 10000 (interleaved pairs), LayerNorm eps 1e-6; batch 4, "
    "1024 image tokens on a 4x16x16 grid, 256 text tokens",
    inputs=("hidden_states", "timestep_embedding", "encoder_hidden_states", "adaln_linear_weight",
            "adaln_linear_bias", "to_q_weight", "to_q_bias", "to_k_weight", "to_k_bias", "to_v_weight", "to_v_bias",
            "to_k_context_weight", "to_k_context_bias", "to_v_context_weight", "to_v_context_bias",
            "to_out_weight", "to_out_bias", "pos_idx_axis0", "pos_idx_axis1", "pos_idx_axis2",
            "cos_axis0", "sin_axis0", "cos_axis1", "sin_axis1", "cos_axis2", "sin_axis2", "is_joint_block"),
    outputs=(Output("out"),),
    flops=_FLOPS,
    bytes=_BYTES,
    peak="fp32_simt",
    fixed_inputs=("pos_idx_axis0", "pos_idx_axis1", "pos_idx_axis2", "cos_axis0", "sin_axis0", "cos_axis1",
                  "sin_axis1", "cos_axis2", "sin_axis2"),
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/13_dual_stream_joint_attention_fibo_fp32.json",
        matches=("outputs", "in_place", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe's reference body and ROPE_THETA are masked; mkb reads it as FIBO's joint "
             "block up to its attention output: AdaLN-Zero modulation (silu, linear, the first three of six "
             "chunks as shift/scale/gate, non-affine LayerNorm eps 1e-6), image q/k/v and text k/v projections "
             "with biases (the recipe has no text query projection and no q/k norm weights, so text tokens are "
             "keys and values only and q/k are not normalised), interleaved-pair RoPE on the image q/k from the "
             "per-axis tables gathered by the position indices (theta 1e4, FIBO's), unmasked softmax(q k^T / "
             "sqrt(128)) over image then text keys, the output projection, and the gated residual "
             "hidden + gate * out (is_joint_block = 0 drops the text keys)."),
            ("shapes", "every tensor at the recipe's shape except the six rotary tables, whose lines are masked: "
             "mkb's are [positions of the axis (4, 16, 16), rotary dims of the axis / 2 (8, 28, 28)]."),
        ),
    ),
    notes="The position indices and rotary tables are the same for every draw (the recipe's authored grid: "
    "META.fixed_inputs); everything else is drawn as the recipe draws it: hidden states, timestep embedding and "
    "text states N(0, 1), weights N(0, 1)/sqrt(fan-in), biases 0.1 N(0, 1). ~0.43 TFLOP of fp32 (projections "
    "0.37, attention 0.06) and ~0.6 GB of weights and activations; fp32 problem: the eager baseline runs with "
    "TF32 off.",
)
