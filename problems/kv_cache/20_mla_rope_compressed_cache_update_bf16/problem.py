"""DeepSeek-V3 MLA prologue: latent RMSNorm, interleaved RoPE on q_pe/k_pe, compressed cache write, bf16.

After the low-rank projections of a DeepSeek-V3 MLA layer, for every token t of a chunked-prefill
batch:

    c    = rmsnorm(kv_c[t]) * kv_norm_weight                      (over 512, eps 1e-6)
    kpe  = rope(k_pe[t]) ;  q_pe_out[t, h] = rope(q_pe[t, h])      (all 128 heads)
    kv_cache[slot // B, slot % B] = concat(c, kpe)                 slot = slot_mapping[t]

rope is the interleaved (GPT-J, `is_neox_style=False`) form DeepSeek uses: pairs (2i, 2i+1) rotate
by angle i of `cos_sin_cache[positions[t]] = [cos(32) | sin(32)]`:
    out[2i] = x[2i] cos_i - x[2i+1] sin_i ;  out[2i+1] = x[2i+1] cos_i + x[2i] sin_i

Layouts: q_pe bf16 [T, 128, 64]; kv_c bf16 [T, 512]; k_pe bf16 [T, 64]; kv_norm_weight bf16 [512];
positions int64 [T]; cos_sin_cache fp32 [max_pos, 64]; slot_mapping int64 [T]; kv_cache bf16
[num_blocks, 64, 576] (FlashMLA layout: latent then rope part). Outputs: q_pe_out bf16 [T, 128, 64]
and kv_cache (updated in place, META.mutates, also returned). Arithmetic in fp32 (the promoted
dtype), one rounding to bf16 per stored value. The batch: 8 sequences, unequal cached contexts and
new-token counts, pages scattered in a shuffled pool.
"""

from __future__ import annotations

import numpy as np
import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, page_table, structure_rng, token_slots

HEADS = {"full": 128, "smoke": 4}
LORA = {"full": 512, "smoke": 64}
ROPE = {"full": 64, "smoke": 16}
SEQS = {"full": 8, "smoke": 3}
NEW = {"full": (256, 4096), "smoke": (1, 12)}
CTX = {"full": (1, 16384), "smoke": (1, 100)}
MAX_POS = {"full": 32768, "smoke": 128}
BLOCK = 64
EPS = 1e-6
THETA = 10000.0


def _structure(size: str):
    rng = structure_rng(20, size)
    n = SEQS[size]
    new = draw_lengths(rng, n, *NEW[size])
    ctx = draw_lengths(rng, n, *CTX[size])
    pt = page_table(rng, [c + m for c, m in zip(ctx, new)], BLOCK)
    slots = np.concatenate([s[c:] for s, c in zip(token_slots(pt), ctx)])
    pos = np.concatenate([np.arange(c, c + m) for c, m in zip(ctx, new)])
    return slots.astype(np.int64), pos.astype(np.int64), pt.num_pages


_SLOTS, _, _PAGES = _structure("full")
_T, _H, _C, _R = len(_SLOTS), HEADS["full"], LORA["full"], ROPE["full"]

META = ProblemMeta(
    number=20,
    name="mla_rope_compressed_cache_update_bf16",
    family="kv_cache",
    dtypes=("bf16", "fp32", "int64"),
    source_model="deepseek-ai/DeepSeek-V3",
    source_config="num_attention_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, rms_norm_eps=1e-6, "
    "rope interleaved (is_neox_style=False), rope_theta=10000 (YaRN scaling would be folded into "
    "cos_sin_cache); FlashMLA cache [blocks, 64, 576]",
    inputs=("q_pe", "kv_c", "k_pe", "kv_norm_weight", "positions", "cos_sin_cache", "slot_mapping", "kv_cache"),
    outputs=(Output("q_pe_out"), Output("kv_cache")),
    flops=float(_T * (_H * _R * 3 + _C * 4 + _R * 3)),
    bytes=float(2 * _T * (_H * _R + _C + _R) * 2 + _T * (8 + 8 + _R * 4)),
    peak="memory",
    mutates=("kv_cache",),
    structure_inputs=("positions", "cos_sin_cache", "slot_mapping"),
    notes=f"Full: {_T} new tokens of 8 sequences (contexts up to 16k), cache pool {_PAGES} blocks of 64. "
    "The mutated cache is also returned. Plain RoPE table (no YaRN) generated from theta.",
)


def reference(q_pe, kv_c, k_pe, kv_norm_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    ct = torch.promote_types(q_pe.dtype, torch.float32)
    r = cos_sin_cache.shape[1]
    cs = cos_sin_cache[positions].to(ct)
    cos, sin = cs[:, : r // 2], cs[:, r // 2 :]

    def rope(x, c, s):  # x [..., r]; c, s broadcast to [..., r/2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)

    q_out = rope(q_pe.to(ct), cos[:, None], sin[:, None])
    kpe = rope(k_pe.to(ct), cos, sin)
    c = kv_c.to(ct)
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + EPS) * kv_norm_weight.to(ct)
    kv_cache.flatten(0, 1)[slot_mapping] = torch.cat([c, kpe], dim=-1).to(kv_cache.dtype)
    return q_out.to(q_pe.dtype), kv_cache


def _cos_sin_cache(max_pos: int, rot: int, device) -> torch.Tensor:
    inv_freq = 1.0 / (THETA ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).to(torch.float32).to(device)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    slots, pos, pages = _structure(size)
    h, c, r = HEADS[size], LORA[size], ROPE[size]
    t = len(slots)
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16

    def rn(*s):
        return torch.randn(*s, generator=g, device=device)

    q_pe = rn(t, h, r).to(bf)
    kv_c = (2.0 * rn(t, c)).to(bf)
    k_pe = rn(t, r).to(bf)
    w = (1.0 + 0.2 * rn(c)).to(bf)
    kv_cache = rn(pages, BLOCK, c + r).to(bf)  # stale contents of other requests
    return (
        q_pe, kv_c, k_pe, w,
        torch.from_numpy(pos).to(device),
        _cos_sin_cache(MAX_POS[size], r, device),
        torch.from_numpy(slots).to(device),
        kv_cache,
    )
