"""MLA prologue: the q up-projection GEMM, NeoX RoPE on q_pe and k_pe, and the compressed paged-cache write, bf16.

vLLM's MLA RoPE + KV-cache-concat fusion (tests/compile/passes/test_mla_rope_kvcache_cat_fusion.py), as
upstream MetaKernelBench states it. Per token t, `qkv_lora[t]` = [q_c (1536) | kv_c (512) | k_pe (64)]:

    q[t]      = q_c[t] @ q_b_weight^T, viewed as [16 heads, 192] = [q_nope (128) | q_pe (64)]
    q_out[t]  = [q_nope | rope(q_pe)]                          bf16 [T, 16, 192]
    kv_cache[s // B, s % B, 0] = [kv_c[t] | rope(k_pe[t])]     s = slot_mapping[t], only where s >= 0

rope is the NeoX form on halves: x1 = x[:32], x2 = x[32:], out = [x1 cos - x2 sin | x2 cos + x1 sin],
with cos, sin = cos_sin_cache[positions[t]] (bf16 [max_position, 64], cos then sin, base 10000).
Layouts: q_b_weight bf16 [16 * 192, 1536]; positions int64 [T]; slot_mapping int64 [T] (distinct
slots, the last 1..128 entries -1: padding tokens that write nothing); kv_cache bf16
[num_blocks, 16, 1, 576]. The cache is updated in place (META.mutates) and returned. Slots and the
padding count are redrawn on every draw. Numerics as upstream's: the GEMM output in bf16 (fp32
accumulation), the rotation in bf16 arithmetic; in the fp64 anchor every such rounding vanishes. Full size (upstream's): 2048 tokens, 256 blocks of 16.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.paged import padded_slots
from mkb.problems.rope import cos_sin_cache as rope_table, neox_rotate

TOKENS = {"full": 2048, "smoke": 24}
MAX_PAD = {"full": 128, "smoke": 4}
HEADS = {"full": 16, "smoke": 2}
Q_LORA = {"full": 1536, "smoke": 64}
KV_LORA = {"full": 512, "smoke": 32}
NOPE = {"full": 128, "smoke": 16}
ROPE = {"full": 64, "smoke": 16}
BLOCK = {"full": 16, "smoke": 4}
BLOCKS = {"full": 256, "smoke": 8}
MAX_POS = {"full": 4096, "smoke": 64}
THETA = 10000.0

_f = "full"
_T, _H, _QL, _C, _R = TOKENS[_f], HEADS[_f], Q_LORA[_f], KV_LORA[_f], ROPE[_f]
_QD = NOPE[_f] + _R

META = ProblemMeta(
    number=20,
    name="mla_rope_compressed_cache_update_bf16",
    family="kv_cache",
    dtypes=("bf16", "int64"),
    source_model="DeepSeek-V3-style MLA (vLLM MLA RoPE + KV-cache concat fusion test)",
    source_config="16 heads, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, "
    "NeoX RoPE base 10000, block size 16 with 1 cache head [blocks, 16, 1, 576]",
    inputs=("qkv_lora", "q_b_weight", "positions", "cos_sin_cache", "slot_mapping", "kv_cache"),
    outputs=(Output("q_out"), Output("kv_cache")),
    flops=float(2 * _T * _H * _QD * _QL + _T * (_H + 1) * _R * 3),
    bytes=float(_T * (_QL + _C + _R) * 2 + _H * _QD * _QL * 2  # read qkv_lora and the weight
                + _T * _H * _QD * 2 + _T * (_C + _R) * 2  # write q_out and the cache rows
                + _T * (8 + 8 + _R * 2)),  # positions, slots, cos/sin rows
    peak="bf16_tc",
    mutates=("kv_cache",),
    structure_inputs=("slot_mapping",),
    fixed_inputs=("cos_sin_cache",),
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/20_mla_rope_compressed_cache_update_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes="The reference is itself an efficient eager (a bf16 GEMM, elementwise RoPE). The mutated cache is also returned. "
    "cos_sin_cache is a constant of the config (the same for every seed).",
)


def _split(qkv_lora: torch.Tensor, kv_cache: torch.Tensor):
    """(q_c, kv_c, k_pe), the rope dim and the q head dim, from the packed input (the cache row fixes the size)."""
    size = _size_of(kv_cache.shape[-1])
    c, r = KV_LORA[size], ROPE[size]
    return qkv_lora.split([qkv_lora.shape[-1] - c - r, c, r], dim=-1), r, NOPE[size] + r


def _size_of(c_r: int) -> str:
    for size in TOKENS:
        if KV_LORA[size] + ROPE[size] == c_r:
            return size
    raise ValueError(f"cache rows of {c_r} elements match no size of this problem")


def reference(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    # Upstream's numerics: the GEMM's output is in the input dtype (accumulated wider), and the rotation runs
    # in the input dtype; in the fp64 anchor (float64 inputs) every such rounding vanishes.
    dt = qkv_lora.dtype
    (q_c, kv_c, k_pe), r, qd = _split(qkv_lora, kv_cache)
    q = torch.nn.functional.linear(q_c, q_b_weight).reshape(qkv_lora.shape[0], -1, qd)
    cs = cos_sin_cache.index_select(0, positions).to(dt)
    cos, sin = cs[:, None, : r // 2], cs[:, None, r // 2 :]
    q_out = torch.cat((q[..., :-r], neox_rotate(q[..., -r:], cos, sin)), dim=-1)
    kpe = neox_rotate(k_pe[:, None], cos, sin)[:, 0]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    bs = kv_cache.shape[1]
    kv_cache[slots // bs, slots % bs, 0] = torch.cat((kv_c, kpe), dim=-1)[valid].to(kv_cache.dtype)
    return q_out, kv_cache


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, h, ql, c, r = TOKENS[size], HEADS[size], Q_LORA[size], KV_LORA[size], ROPE[size]
    bs, nb = BLOCK[size], BLOCKS[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    qkv_lora = torch.randn(t, ql + c + r, generator=g, device=device).to(bf)
    w = (torch.randn(h * (NOPE[size] + r), ql, generator=g, device=device) * 0.02).to(bf)
    positions = torch.randint(0, MAX_POS[size], (t,), generator=g, device=device, dtype=torch.int64)
    kv_cache = torch.randn(nb, bs, 1, c + r, generator=g, device=device).to(bf)
    # slots and the padding count come from the seed too (drawn on the CPU: the same on every device)
    slots = padded_slots(torch.Generator().manual_seed(seed), nb * bs, t, MAX_PAD[size])
    table = rope_table(MAX_POS[size], r, THETA)
    return qkv_lora, w, positions, table.to(device), slots.to(device), kv_cache
