"""Append new K/V to a paged fp8 e4m3 cache (stored as bytes) with a dynamic scale per token and KV head.

vLLM's per-token-head fp8 KV cache (tests/quantization/test_per_token_kv_cache.py; the Triton
reshape_and_cache_flash kernel), as upstream MetaKernelBench states it. For every new token t and KV
head h, where s = slot_mapping[t] >= 0 (page = s // B, row = s % B):

    amax  = max_d |key[t, h, d]|                                    (fp32)
    scale = max(amax / 448, 1e-6)                                   (fp32; 448 = e4m3 max)
    key_cache[page, row, h, :] = bytes of e4m3(clamp(key[t, h, :] * (1 / scale), -448, 448))
    k_scale_cache[page, row, h] = scale
    and the same for value into value_cache / v_scale_cache.

The code is computed in fp32 exactly so (the reciprocal, then the product, then round-to-nearest-even
to e4m3), and the caches are compared bytewise, as upstream compares them. Layouts: key, value bf16
[T, Hkv, D]; key_cache, value_cache uint8 [num_blocks, B, Hkv, D] (e4m3 bytes); k/v_scale_cache fp32
[num_blocks, B, Hkv]; slot_mapping int64 [T] (distinct slots, the last 1..128 entries -1: padding
tokens that write nothing). All four caches are updated in place (META.mutates) and returned;
other slots keep their stale contents. Slots and padding are redrawn on every draw. Full size
(upstream's): 2048 tokens, 8 heads of 128, 256 blocks of 16.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.paged import padded_slots

TOKENS = {"full": 2048, "smoke": 24}
MAX_PAD = {"full": 128, "smoke": 4}
KV_HEADS = {"full": 8, "smoke": 2}
HEAD_DIM = {"full": 128, "smoke": 32}
BLOCK = {"full": 16, "smoke": 4}
BLOCKS = {"full": 256, "smoke": 8}
FP8_MAX = 448.0
SCALE_FLOOR = 1e-6
FP8 = torch.float8_e4m3fn

_f = "full"
_T, _Hkv, _D = TOKENS[_f], KV_HEADS[_f], HEAD_DIM[_f]

META = ProblemMeta(
    number=21,
    name="dynamic_quantized_cache_append_per_token_head_fp8",
    family="kv_cache",
    dtypes=("bf16", "uint8", "fp32", "int64"),
    source_model="vLLM per-token-head fp8 e4m3 KV cache (test_per_token_kv_cache.py)",
    source_config="8 kv heads, head_dim=128, block size 16, 256 blocks; scale = max(amax / 448, 1e-6) per "
    "(token, kv head); e4m3 codes stored as uint8",
    inputs=("key", "value", "slot_mapping", "key_cache", "value_cache", "k_scale_cache", "v_scale_cache"),
    outputs=(
        Output("key_cache", compare="exact"), Output("value_cache", compare="exact"),
        Output("k_scale_cache"), Output("v_scale_cache"),
    ),
    flops=float(2 * _T * _Hkv * _D * 3),  # abs-max, multiply, clamp/convert
    bytes=float(2 * _T * _Hkv * _D * (2 + 1) + 2 * _T * _Hkv * 4 + _T * 8),
    peak="memory",
    mutates=("key_cache", "value_cache", "k_scale_cache", "v_scale_cache"),
    structure_inputs=("slot_mapping",),
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/21_dynamic_quantized_cache_append_per_token_head_fp8.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes="Mutated caches are also returned. The codes are fixed by the fp32 recipe above (a kernel that "
    "divides instead of multiplying by the reciprocal can move a code and fails, as upstream).",
)


def reference(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    ct = torch.promote_types(key.dtype, torch.float32)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    bs = key_cache.shape[1]
    page, row = slots // bs, slots % bs
    for x, cache, scales in ((key, key_cache, k_scale_cache), (value, value_cache, v_scale_cache)):
        xw = x.to(ct)
        scale = (xw.abs().amax(dim=-1) / FP8_MAX).clamp(min=SCALE_FLOOR)  # [T, Hkv]
        # the quantisation cast is fixed: fp32 reciprocal, fp32 product, e4m3 round-to-nearest-even
        s32 = scale.to(torch.float32)
        codes = (x.to(torch.float32) * (1.0 / s32[..., None])).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        cache[page, row] = codes[valid].view(torch.uint8)
        scales[page, row] = scale[valid].to(scales.dtype)
    return key_cache, value_cache, k_scale_cache, v_scale_cache


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, hkv, d, bs, nb = TOKENS[size], KV_HEADS[size], HEAD_DIM[size], BLOCK[size], BLOCKS[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    key = torch.randn(t, hkv, d, generator=g, device=device).to(torch.bfloat16)
    value = torch.randn(t, hkv, d, generator=g, device=device).to(torch.bfloat16)
    key_cache = torch.randint(0, 256, (nb, bs, hkv, d), generator=g, device=device, dtype=torch.uint8)
    value_cache = torch.randint(0, 256, (nb, bs, hkv, d), generator=g, device=device, dtype=torch.uint8)
    k_scale = torch.rand(nb, bs, hkv, generator=g, device=device) + 0.5
    v_scale = torch.rand(nb, bs, hkv, generator=g, device=device) + 0.5
    # slots and the padding count come from the seed too (drawn on the CPU: the same on every device)
    slots = padded_slots(torch.Generator().manual_seed(seed), nb * bs, t, MAX_PAD[size])
    return key, value, slots.to(device), key_cache, value_cache, k_scale, v_scale
