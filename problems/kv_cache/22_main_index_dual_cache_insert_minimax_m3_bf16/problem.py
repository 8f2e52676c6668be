"""MiniMax-M3 attention input stage: QK RMSNorm with (1 + w) weights, partial NeoX RoPE on four streams, and
insertion of the new keys and values into a main paged K/V cache and a sparse-index key cache.

vLLM's fused MiniMax-M3 kernel (tests/kernels/test_fused_minimax_m3_qknorm_rope_kv_insert.py), as upstream
MetaKernelBench states it. `qkv` bf16 [T, (Hq + 2 Hkv + Hiq + 1) * D] packs, per token, q (Hq heads),
k (Hkv), v (Hkv), the index queries iq (Hiq heads) and one index key ik. For each of q, k, iq, ik
(each with its own norm weight w, bf16 [D]):

    n   = bf16( x * rsqrt(mean(x^2) + eps) * (1 + w) )                  (in float32)
    out = bf16( concat(x1 cos - x2 sin, x2 cos + x1 sin) ) ++ n[rot:]    x1 = n[:rot/2], x2 = n[rot/2:rot]

with cos, sin = cos_sin_cache[positions[t]] (bf16 [max_position, rot], cos then sin; base 5e6).
Then, with s = slot_mapping[t] and u = index_slot_mapping[t] (int64, distinct slots):

    kv_cache[s // B, :, s % B, :D] = k[t] ;  kv_cache[s // B, :, s % B, D:] = v[t]
    index_cache[u // B, u % B] = ik[t]

Layouts: kv_cache bf16 [num_blocks, Hkv, B, 2 D], index_cache bf16 [num_blocks, B, D]. Returns
(q [T, Hq, D], iq [T, Hiq, D], kv_cache, index_cache); both caches are updated in place (META.mutates).
Slots are redrawn on every draw (distinct, a random subset of the pool). Full size (upstream's):
513 tokens, 16 q / 4 kv / 4 index-q heads of 128, rotary dim 64, 10 blocks of 64.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.paged import padded_slots
from mkb.problems.rope import cos_sin_cache, neox_rotate

TOKENS = {"full": 513, "smoke": 9}
Q_HEADS = {"full": 16, "smoke": 4}
KV_HEADS = {"full": 4, "smoke": 2}
IQ_HEADS = {"full": 4, "smoke": 2}
HEAD_DIM = {"full": 128, "smoke": 32}
ROT = {"full": 64, "smoke": 16}
BLOCK = {"full": 64, "smoke": 8}
BLOCKS = {"full": 10, "smoke": 3}
MAX_POS = {"full": 4096, "smoke": 64}
ROPE_BASE = 5_000_000.0
EPS = 1e-6

_f = "full"
_T, _D = TOKENS[_f], HEAD_DIM[_f]
_W = (Q_HEADS[_f] + 2 * KV_HEADS[_f] + IQ_HEADS[_f] + 1) * _D
_NORMED = (Q_HEADS[_f] + KV_HEADS[_f] + IQ_HEADS[_f] + 1) * _D  # elements normalised and (partly) rotated per token

META = ProblemMeta(
    number=22,
    name="main_index_dual_cache_insert_minimax_m3_bf16",
    family="kv_cache",
    dtypes=("bf16", "int64"),
    source_model="MiniMax-M3 (vLLM fused_minimax_m3_qknorm_rope_kv_insert)",
    source_config="16 q heads, 4 kv heads, 4 index-q heads, 1 index k head, head_dim=128, rotary_dim=64 (NeoX), "
    "rope_theta=5e6, rms eps=1e-6 with (1 + w) weights, block size 64",
    inputs=("qkv", "q_norm_weight", "k_norm_weight", "index_q_norm_weight", "index_k_norm_weight", "positions",
            "cos_sin_cache", "slot_mapping", "index_slot_mapping", "kv_cache", "index_cache"),
    outputs=(Output("q"), Output("iq"), Output("kv_cache"), Output("index_cache")),
    flops=float(_T * _NORMED * 6),  # square, sum, scale, weight, and the rotation's multiply-adds, per element
    bytes=float(_T * _W * 2 + _T * (Q_HEADS[_f] + IQ_HEADS[_f]) * _D * 2  # read qkv, write q and iq
                + _T * (2 * KV_HEADS[_f] + 1) * _D * 2  # write k, v, ik into the caches
                + _T * (8 + 8 + 8 + ROT[_f] * 2) + 4 * _D * 2),  # positions, slots, cos/sin rows, weights
    peak="memory",
    mutates=("kv_cache", "index_cache"),
    structure_inputs=("slot_mapping", "index_slot_mapping"),
    fixed_inputs=("cos_sin_cache",),
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/22_main_index_dual_cache_insert_minimax_m3_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes="The caches are returned under their input names. cos_sin_cache is a constant of the config (the same "
    "for every seed). Positions are independent per token (upstream draws them uniformly).",
)


def _norm_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> torch.Tensor:
    wide = torch.promote_types(x.dtype, torch.float32)
    xw = x.to(wide)
    xw = xw * torch.rsqrt(xw.pow(2).mean(dim=-1, keepdim=True) + EPS)
    n = (xw * (1.0 + w.to(wide))).to(x.dtype)
    rotated = neox_rotate(n[..., :rot].to(wide), cos, sin).to(x.dtype)
    return torch.cat((rotated, n[..., rot:]), dim=-1)


def _size_of(heads: int, hkv: int) -> str:
    for size in TOKENS:
        if Q_HEADS[size] + 2 * KV_HEADS[size] + IQ_HEADS[size] + 1 == heads and KV_HEADS[size] == hkv:
            return size
    raise ValueError(f"qkv packs {heads} heads with {hkv} kv heads, which is no size of this problem")


def reference(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
              cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache):
    t = qkv.shape[0]
    d = index_cache.shape[-1]
    hkv, bs = kv_cache.shape[1], kv_cache.shape[2]
    rot = cos_sin_cache.shape[-1]
    size = _size_of(qkv.shape[1] // d, hkv)  # qkv packs hq + 2 hkv + hiq + 1 heads: the size fixes hq and hiq
    hq, hiq = Q_HEADS[size], IQ_HEADS[size]
    q, k, v, iq, ik = qkv.split([hq * d, hkv * d, hkv * d, hiq * d, d], dim=-1)
    wide = torch.promote_types(qkv.dtype, torch.float32)
    cs = cos_sin_cache.index_select(0, positions).to(wide)
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2 :]
    q = _norm_rope(q.reshape(t, hq, d), q_norm_weight, cos, sin, rot)
    k = _norm_rope(k.reshape(t, hkv, d), k_norm_weight, cos, sin, rot)
    iq = _norm_rope(iq.reshape(t, hiq, d), index_q_norm_weight, cos, sin, rot)
    ik = _norm_rope(ik.reshape(t, 1, d), index_k_norm_weight, cos, sin, rot)[:, 0]
    blk, off = slot_mapping // bs, slot_mapping % bs
    kv_cache[blk, :, off, :d] = k.to(kv_cache.dtype)
    kv_cache[blk, :, off, d:] = v.reshape(t, hkv, d).to(kv_cache.dtype)
    iblk, ioff = index_slot_mapping // bs, index_slot_mapping % bs
    index_cache[iblk, ioff] = ik.to(index_cache.dtype)
    return q, iq, kv_cache, index_cache


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, d, hkv, bs, nb = TOKENS[size], HEAD_DIM[size], KV_HEADS[size], BLOCK[size], BLOCKS[size]
    width = (Q_HEADS[size] + 2 * hkv + IQ_HEADS[size] + 1) * d
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    qkv = torch.randn(t, width, generator=g, device=device).to(bf)
    weights = [(torch.randn(d, generator=g, device=device) * 0.1).to(bf) for _ in range(4)]
    positions = torch.randint(0, MAX_POS[size], (t,), generator=g, device=device, dtype=torch.int64)
    kv_cache = torch.randn(nb, hkv, bs, 2 * d, generator=g, device=device).to(bf)
    index_cache = torch.randn(nb, bs, d, generator=g, device=device).to(bf)
    # slots come from the seed too (drawn on the CPU: the same on every device): distinct, a subset of the pool
    gs = torch.Generator().manual_seed(seed)
    slots, islots = padded_slots(gs, nb * bs, t), padded_slots(gs, nb * bs, t)
    table = cos_sin_cache(MAX_POS[size], ROT[size], ROPE_BASE)
    return (qkv, *weights, positions, table.to(device), slots.to(device), islots.to(device), kv_cache, index_cache)
