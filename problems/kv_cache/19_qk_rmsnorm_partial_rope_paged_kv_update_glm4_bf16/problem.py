"""GLM-4.5 MoE attention prologue: per-head q/k RMSNorm, partial NeoX RoPE and paged KV-cache update, bf16.

vLLM's QK-norm + RoPE + KV-cache fusion workload (tests/compile/passes/
test_rocm_aiter_qk_norm_rope_kvcache_fusion.py), as upstream MetaKernelBench states it. Per token t:

    q, k, v = split(qkv[t], [H D, Hkv D, Hkv D])  viewed as [H, D], [Hkv, D], [Hkv, D]
    q = rmsnorm(q) * q_norm_weight ; k = rmsnorm(k) * k_norm_weight      (per head over D, eps)
    NeoX RoPE on the first 64 dims (halves 0..31 and 32..63), angle from
        cos_sin_cache[positions[t]] = [cos (32) | sin (32)];  dims 64..127 pass through
    kv_cache[0, s // B, s % B] = k ; kv_cache[1, s // B, s % B] = v     s = slot_mapping[t], only where s >= 0

Layouts: qkv bf16 [T, (32 + 2 x 8) x 128]; positions int64 [T]; q/k_norm_weight bf16 [128];
cos_sin_cache bf16 [4096, 64] (base 10000); slot_mapping int64 [T] (distinct slots, the last 1..128
entries -1: padding tokens that write nothing); kv_cache bf16 [2, num_blocks, 16, 8, 128]; eps
the float 1e-5. Outputs: q bf16 [T, 32, 128] and kv_cache (updated in place, META.mutates, also
returned). Slots and the padding count are redrawn on every draw. Numerics as upstream's: the norm in
fp32, its result rounded to bf16 before the (bf16) weight, the rotation in bf16 arithmetic; in the fp64
anchor every one of these roundings vanishes. Full size (upstream's): 2048 tokens, 256 blocks of 16.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.paged import padded_slots
from mkb.problems.rope import cos_sin_cache, neox_rotate

TOKENS = {"full": 2048, "smoke": 24}
MAX_PAD = {"full": 128, "smoke": 4}
HEADS = {"full": 32, "smoke": 4}
KV_HEADS = {"full": 8, "smoke": 2}
HEAD_DIM = {"full": 128, "smoke": 32}
ROT = {"full": 64, "smoke": 16}
BLOCK = {"full": 16, "smoke": 4}
BLOCKS = {"full": 256, "smoke": 8}
MAX_POS = {"full": 4096, "smoke": 64}
BASE = 10000.0
EPS = 1e-5

_f = "full"
_T, _H, _Hkv, _D = TOKENS[_f], HEADS[_f], KV_HEADS[_f], HEAD_DIM[_f]

META = ProblemMeta(
    number=19,
    name="qk_rmsnorm_partial_rope_paged_kv_update_glm4_bf16",
    family="kv_cache",
    dtypes=("bf16", "int64"),
    source_model="GLM-4.5 MoE attention (vLLM QK-norm + RoPE + KV-cache fusion test)",
    source_config="32 q heads, 8 kv heads, head_dim=128, per-head q/k RMSNorm eps=1e-5, partial NeoX RoPE on "
    "64 dims, base 10000, max_position 4096; cache [2, blocks, 16, 8, 128]",
    inputs=("qkv", "positions", "q_norm_weight", "k_norm_weight", "cos_sin_cache", "slot_mapping", "kv_cache", "eps"),
    outputs=(Output("q"), Output("kv_cache")),
    flops=float(_T * (_H + _Hkv) * _D * 6),  # norm (~4/elem) and the rotation's multiply-adds (on half the dims)
    # qkv in; q, k, v out; per token the position, the slot and one cos/sin row
    bytes=float(_T * (_H + 2 * _Hkv) * _D * 2 * 2 + _T * (8 + 8 + ROT[_f] * 2) + 2 * _D * 2),
    peak="memory",
    mutates=("kv_cache",),
    structure_inputs=("slot_mapping",),
    fixed_inputs=("cos_sin_cache",),
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/19_qk_rmsnorm_partial_rope_paged_kv_update_glm4_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes="The mutated cache is also returned. cos_sin_cache is a constant of the config (the same for every "
    "seed); eps is a Python float input, as upstream passes it.",
)


def reference(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    # Upstream's roundings: the normalised value is rounded to the input dtype before the weight, and the
    # rotation runs in the input dtype; every such cast vanishes in the fp64 anchor (float64 inputs).
    ct = torch.promote_types(qkv.dtype, torch.float32)
    dt = qkv.dtype
    hkv, d = kv_cache.shape[3], kv_cache.shape[4]
    t = qkv.shape[0]
    h = qkv.shape[1] // d - 2 * hkv
    q = qkv[:, : h * d].reshape(t, h, d)
    k = qkv[:, h * d : (h + hkv) * d].reshape(t, hkv, d)
    v = qkv[:, (h + hkv) * d :].reshape(t, hkv, d)
    r = cos_sin_cache.shape[1]
    cs = cos_sin_cache.index_select(0, positions).to(dt)
    cos, sin = cs[:, None, : r // 2], cs[:, None, r // 2 :]

    def norm_rope(y, w):
        yw = y.to(ct)
        yw = yw * torch.rsqrt(yw.pow(2).mean(-1, keepdim=True) + eps)
        y = (yw.to(w.dtype) * w).to(dt)
        return torch.cat((neox_rotate(y[..., :r], cos, sin), y[..., r:]), dim=-1)

    q = norm_rope(q, q_norm_weight)
    k = norm_rope(k, k_norm_weight)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    bs = kv_cache.shape[2]
    kv_cache[0, slots // bs, slots % bs] = k[valid].to(kv_cache.dtype)
    kv_cache[1, slots // bs, slots % bs] = v[valid].to(kv_cache.dtype)
    return q, kv_cache


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, h, hkv, d = TOKENS[size], HEADS[size], KV_HEADS[size], HEAD_DIM[size]
    bs, nb = BLOCK[size], BLOCKS[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g, device=device).to(bf)
    positions = torch.randint(0, MAX_POS[size], (t,), generator=g, device=device, dtype=torch.int64)
    qw = torch.randn(d, generator=g, device=device).to(bf)
    kw = torch.randn(d, generator=g, device=device).to(bf)
    kv_cache = torch.randn(2, nb, bs, hkv, d, generator=g, device=device).to(bf)
    # slots and the padding count come from the seed too (drawn on the CPU: the same on every device)
    slots = padded_slots(torch.Generator().manual_seed(seed), nb * bs, t, MAX_PAD[size])
    table = cos_sin_cache(MAX_POS[size], ROT[size], BASE)
    return qkv, positions, qw, kw, table.to(device), slots.to(device), kv_cache, EPS
