"""Append new K/V to a paged fp8 e4m3 cache with a dynamic scale per token and KV head.

For every new token t and KV head h (slot = slot_mapping[t], page = slot // B, row = slot % B):

    amax  = max_d |k[t, h, d]|                              (fp32)
    s     = max(amax, 1e-6) / 448                           (fp32; 448 = e4m3 max)
    k_cache[page, row, h, :] = e4m3(clamp(k[t, h, :] / s, -448, 448))   (round to nearest even)
    k_scale[page, row, h]    = s
    and the same for v into v_cache / v_scale.

Layouts: k, v bf16 [T, Hkv, D]; k_cache, v_cache float8_e4m3fn [num_blocks, B, Hkv, D];
k_scale, v_scale fp32 [num_blocks, B, Hkv]; slot_mapping int64 [T]. All four caches are updated in
place (META.mutates) and returned; slots not named by slot_mapping keep their stale contents.
Caches compare as `quantized`: dequantised code x scale, one e4m3 quantum x scale of tolerance.
Full size: Llama 3.1 70B (8 KV heads of 128), page size 16, a mixed batch of 64 requests
(decode steps and prefill chunks of unequal lengths) appending to a shuffled page pool.
"""

from __future__ import annotations

import numpy as np
import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, page_table, structure_rng, token_slots

KV_HEADS = {"full": 8, "smoke": 2}
HEAD_DIM = {"full": 128, "smoke": 32}
SEQS = {"full": 64, "smoke": 4}
NEW = {"full": (1, 2048), "smoke": (1, 9)}
CTX = {"full": (1, 8192), "smoke": (1, 40)}
BLOCK = 16
FP8_MAX = 448.0
AMAX_FLOOR = 1e-6
FP8 = torch.float8_e4m3fn


def _structure(size: str):
    rng = structure_rng(21, size)
    n = SEQS[size]
    new = draw_lengths(rng, n, *NEW[size])
    ctx = draw_lengths(rng, n, *CTX[size])
    pt = page_table(rng, [c + m for c, m in zip(ctx, new)], BLOCK)
    slots = np.concatenate([s[c:] for s, c in zip(token_slots(pt), ctx)])
    return slots.astype(np.int64), pt.num_pages


_SLOTS, _PAGES = _structure("full")
_T, _Hkv, _D = len(_SLOTS), KV_HEADS["full"], HEAD_DIM["full"]

META = ProblemMeta(
    number=21,
    name="dynamic_quantized_cache_append_per_token_head_fp8",
    family="kv_cache",
    dtypes=("bf16", "fp8_e4m3", "fp32", "int64"),
    source_model="meta-llama/Llama-3.1-70B with an fp8 e4m3 KV cache, per-token-head dynamic scales",
    source_config="num_key_value_heads=8, head_dim=128; page size 16; scale = amax/448 per (token, kv head)",
    inputs=("k", "v", "slot_mapping", "k_cache", "v_cache", "k_scale", "v_scale"),
    outputs=(
        Output("k_cache", compare="quantized", dequantize="dequantize_k_cache"),
        Output("v_cache", compare="quantized", dequantize="dequantize_v_cache"),
        Output("k_scale"),
        Output("v_scale"),
    ),
    flops=float(2 * _T * _Hkv * _D * 3),  # abs-max, divide, clamp/convert
    bytes=float(2 * _T * _Hkv * _D * (2 + 1) + 2 * _T * _Hkv * 4 + _T * 8),
    peak="memory",
    mutates=("k_cache", "v_cache", "k_scale", "v_scale"),
    structure_inputs=("slot_mapping",),
    notes=f"Full: {_T} new tokens of 64 requests, pool {_PAGES} pages. Mutated caches are also returned.",
)


def reference(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale):
    ct = torch.promote_types(k.dtype, torch.float32)
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        xf = x.to(ct)
        s = xf.abs().amax(dim=-1).clamp_min(AMAX_FLOOR) / FP8_MAX  # [T, Hkv]
        codes = (xf / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        if cache.dtype == FP8:  # scatter raw bytes: fp8 index_put is not implemented everywhere
            cache.view(torch.uint8).flatten(0, 1)[slot_mapping] = codes.view(torch.uint8)
        else:  # the fp64 anchor run
            cache.flatten(0, 1)[slot_mapping] = codes.to(cache.dtype)
        scale.flatten(0, 1)[slot_mapping] = s.to(scale.dtype)
    return k_cache, v_cache, k_scale, v_scale


def _e4m3_quantum(codes: torch.Tensor) -> torch.Tensor:
    """Spacing of e4m3 values at each code's magnitude (subnormal spacing 2**-9 below 2**-6)."""
    a = codes.abs().to(torch.float64)
    e = torch.floor(torch.log2(a.clamp_min(2.0**-6)))
    return torch.exp2(e - 3)


def _dequantize(cache: torch.Tensor, scale: torch.Tensor):
    c = cache.to(torch.float64)
    s = scale.to(torch.float64)[..., None]
    return c * s, _e4m3_quantum(c) * s


def dequantize_k_cache(outputs):
    return _dequantize(outputs[0], outputs[2])


def dequantize_v_cache(outputs):
    return _dequantize(outputs[1], outputs[3])


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    slots, pages = _structure(size)
    hkv, d = KV_HEADS[size], HEAD_DIM[size]
    t = len(slots)
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=g, device=device)

    # per-head magnitudes differ (and a few outlier channels), as in real K/V activations
    k = rn(t, hkv, d) * (0.5 + 2.0 * torch.rand(1, hkv, 1, generator=g, device=device))
    k[..., :: max(1, d // 8)] *= 4.0
    v = rn(t, hkv, d) * (0.5 + torch.rand(1, hkv, 1, generator=g, device=device))
    k_cache = (rn(pages, BLOCK, hkv, d) * 64).clamp(-FP8_MAX, FP8_MAX).to(FP8)  # stale contents
    v_cache = (rn(pages, BLOCK, hkv, d) * 64).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    k_scale = 0.01 + 0.02 * torch.rand(pages, BLOCK, hkv, generator=g, device=device)
    v_scale = 0.01 + 0.02 * torch.rand(pages, BLOCK, hkv, generator=g, device=device)
    return (
        k.to(torch.bfloat16), v.to(torch.bfloat16), torch.from_numpy(slots).to(device),
        k_cache, v_cache, k_scale, v_scale,
    )
