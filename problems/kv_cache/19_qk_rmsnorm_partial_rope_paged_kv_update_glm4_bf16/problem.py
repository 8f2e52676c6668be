"""GLM-4.5 attention prologue: per-head q/k RMSNorm, partial RoPE, paged KV-cache write, bf16.

After the fused QKV projection of a GLM-4.5 attention layer (use_qk_norm, partial_rotary_factor
0.5), for every token t of a chunked-prefill batch:

    q, k, v = split(qkv[t], [H*D, Hkv*D, Hkv*D])  viewed as [H, D], [Hkv, D], [Hkv, D]
    q = rmsnorm(q) * q_norm_weight ; k = rmsnorm(k) * k_norm_weight    (per head over D, eps 1e-5)
    rope on the first R = D/2 dims, NeoX (rotate-half) pairing (i, i + R/2), angle from
        cos_sin_cache[positions[t]] = [cos(R/2) | sin(R/2)];  dims R..D pass through
    k_cache[slot // B, slot % B] = k ; v_cache[slot // B, slot % B] = v   with slot = slot_mapping[t]

Layouts: qkv bf16 [T, (H + 2 Hkv) D]; q/k_norm_weight bf16 [D]; positions int64 [T];
cos_sin_cache fp32 [max_pos, R]; slot_mapping int64 [T]; k_cache, v_cache bf16
[num_blocks, B, Hkv, D] (vLLM flash layout). Outputs: q_out bf16 [T, H, D] and both caches
(updated in place, META.mutates, also returned); slots not named by slot_mapping are unchanged.
Numerics: all arithmetic in fp32 (the promoted dtype), one rounding to bf16 per stored value.
The batch: 8 sequences with unequal cached contexts (positions start at the context length) and
unequal new-token counts, pages scattered through a shuffled pool.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, page_table, structure_rng, token_slots

HEADS = {"full": 96, "smoke": 4}
KV_HEADS = {"full": 8, "smoke": 2}
HEAD_DIM = {"full": 128, "smoke": 32}
SEQS = {"full": 8, "smoke": 3}
NEW = {"full": (128, 2048), "smoke": (1, 12)}
CTX = {"full": (1, 16384), "smoke": (1, 40)}
MAX_POS = {"full": 32768, "smoke": 64}
BLOCK = 16
EPS = 1e-5
THETA = 1_000_000.0


def _structure(size: str):
    rng = structure_rng(19, size)
    n = SEQS[size]
    new = draw_lengths(rng, n, *NEW[size])
    ctx = draw_lengths(rng, n, *CTX[size])
    pt = page_table(rng, [c + m for c, m in zip(ctx, new)], BLOCK)
    slots = np.concatenate([s[c:] for s, c in zip(token_slots(pt), ctx)])
    pos = np.concatenate([np.arange(c, c + m) for c, m in zip(ctx, new)])
    return slots.astype(np.int64), pos.astype(np.int64), pt.num_pages


_SLOTS, _, _PAGES = _structure("full")
_T, _H, _Hkv, _D = len(_SLOTS), HEADS["full"], KV_HEADS["full"], HEAD_DIM["full"]

META = ProblemMeta(
    number=19,
    name="qk_rmsnorm_partial_rope_paged_kv_update_glm4_bf16",
    family="kv_cache",
    dtypes=("bf16", "fp32", "int64"),
    source_model="zai-org/GLM-4.5",
    source_config="num_attention_heads=96, num_key_value_heads=8, head_dim=128, use_qk_norm=true, "
    "rms_norm_eps=1e-5, partial_rotary_factor=0.5 (NeoX rotate-half on dims 0..63), rope_theta=1e6; "
    "vLLM paged cache, block_size=16",
    inputs=(
        "qkv", "q_norm_weight", "k_norm_weight", "positions", "cos_sin_cache", "slot_mapping", "k_cache", "v_cache",
    ),
    outputs=(Output("q_out"), Output("k_cache"), Output("v_cache")),
    flops=float(_T * (_H + _Hkv) * _D * 8),  # norm (~4/elem) + rope (~4/elem on half the dims, counted generously)
    # qkv in; q, k, v out; per token the position, the slot and one cos/sin row
    bytes=float(2 * _T * (_H + 2 * _Hkv) * _D * 2 + _T * (8 + 8 + (_D // 2) * 4)),
    peak="memory",
    mutates=("k_cache", "v_cache"),
    structure_inputs=("positions", "cos_sin_cache", "slot_mapping"),
    notes=f"Full: {_T} new tokens of 8 sequences (contexts up to 16k), cache pool {_PAGES} blocks. "
    "Mutated caches are also returned. Unlike HF (which rounds to bf16 before the norm weight), "
    "the spec keeps fp32 until each stored value.",
)


def reference(qkv, q_norm_weight, k_norm_weight, positions, cos_sin_cache, slot_mapping, k_cache, v_cache):
    ct = torch.promote_types(qkv.dtype, torch.float32)
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    t = qkv.shape[0]
    h = qkv.shape[1] // d - 2 * hkv
    x = qkv.to(ct)
    q = x[:, : h * d].view(t, h, d)
    k = x[:, h * d : (h + hkv) * d].view(t, hkv, d)
    v = x[:, (h + hkv) * d :].view(t, hkv, d)

    def rms(y, w):
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + EPS) * w.to(ct)

    r = cos_sin_cache.shape[1]
    cs = cos_sin_cache[positions].to(ct)
    cos, sin = cs[:, None, : r // 2], cs[:, None, r // 2 :]

    def rope(y):
        y1, y2, rest = y[..., : r // 2], y[..., r // 2 : r], y[..., r:]
        return torch.cat([y1 * cos - y2 * sin, y2 * cos + y1 * sin, rest], dim=-1)

    q = rope(rms(q, q_norm_weight))
    k = rope(rms(k, k_norm_weight))
    k_cache.flatten(0, 1)[slot_mapping] = k.to(k_cache.dtype)
    v_cache.flatten(0, 1)[slot_mapping] = v.to(v_cache.dtype)
    return q.to(qkv.dtype), k_cache, v_cache


def _cos_sin_cache(max_pos: int, rot: int, device) -> torch.Tensor:
    inv_freq = 1.0 / (THETA ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).to(torch.float32).to(device)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    slots, pos, pages = _structure(size)
    h, hkv, d = HEADS[size], KV_HEADS[size], HEAD_DIM[size]
    t = len(slots)
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g, device=device)
    qkv[:, : (h + hkv) * d] *= 3.0  # pre-norm q/k are not unit scale
    qw = 1.0 + 0.2 * torch.randn(d, generator=g, device=device)
    kw = 1.0 + 0.2 * torch.randn(d, generator=g, device=device)
    k_cache = torch.randn(pages, BLOCK, hkv, d, generator=g, device=device).to(bf)  # stale contents
    v_cache = torch.randn(pages, BLOCK, hkv, d, generator=g, device=device).to(bf)
    return (
        qkv.to(bf),
        qw.to(bf),
        kw.to(bf),
        torch.from_numpy(pos).to(device),
        _cos_sin_cache(MAX_POS[size], d // 2, device),
        torch.from_numpy(slots).to(device),
        k_cache,
        v_cache,
    )
