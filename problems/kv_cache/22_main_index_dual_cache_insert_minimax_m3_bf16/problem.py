"""Insert new tokens into two paged caches at once: the main K/V cache and the sparse-index key cache.

A model with indexer-driven sparse attention keeps, beside the main paged K/V cache that the
attention reads, a second paged cache of small index keys that a lightning indexer scores to pick
the top-k positions. Both caches have their own page size and page table, so each new token has two
slots. For every new token t:

    k_cache[s // 16, s % 16] = k[t] ;  v_cache[s // 16, s % 16] = v[t]     s = slot_mapping[t]
    index_cache[u // 64, u % 64] = index_k[t]                               u = index_slot_mapping[t]

Layouts: k, v bf16 [T, 8, 128]; index_k bf16 [T, 128]; slot_mapping, index_slot_mapping int64 [T];
k_cache, v_cache bf16 [num_blocks, 16, 8, 128]; index_cache bf16 [num_index_blocks, 64, 128].
All three caches are updated in place (META.mutates) and returned; other slots keep stale contents.
A pure copy (exact). The batch: 64 requests (decode steps and prefill chunks of unequal lengths),
pages of both caches scattered through their own shuffled pools.
"""

from __future__ import annotations

import numpy as np
import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, page_table, structure_rng, token_slots

KV_HEADS = {"full": 8, "smoke": 2}
HEAD_DIM = {"full": 128, "smoke": 32}
INDEX_DIM = {"full": 128, "smoke": 32}
SEQS = {"full": 64, "smoke": 4}
NEW = {"full": (1, 4096), "smoke": (1, 9)}
CTX = {"full": (1, 16384), "smoke": (1, 150)}
BLOCK = 16
INDEX_BLOCK = 64


def _structure(size: str):
    rng = structure_rng(22, size)
    n = SEQS[size]
    new = draw_lengths(rng, n, *NEW[size])
    ctx = draw_lengths(rng, n, *CTX[size])
    lens = [c + m for c, m in zip(ctx, new)]
    pt = page_table(rng, lens, BLOCK)
    ipt = page_table(rng, lens, INDEX_BLOCK)
    slots = np.concatenate([s[c:] for s, c in zip(token_slots(pt), ctx)])
    islots = np.concatenate([s[c:] for s, c in zip(token_slots(ipt), ctx)])
    return slots.astype(np.int64), islots.astype(np.int64), pt.num_pages, ipt.num_pages


_S, _, _P, _IP = _structure("full")
_T = len(_S)
_ROW = 2 * KV_HEADS["full"] * HEAD_DIM["full"] + INDEX_DIM["full"]

META = ProblemMeta(
    number=22,
    name="main_index_dual_cache_insert_minimax_m3_bf16",
    family="kv_cache",
    dtypes=("bf16", "int64"),
    source_model="MiniMax M3-class attention (MiniMax-M2 public config for the main cache) with a "
    "DeepSeek-V3.2-style lightning-indexer key cache",
    source_config="num_key_value_heads=8, head_dim=128 (MiniMax-M2); index_head_dim=128, index page size 64, "
    "main page size 16",
    inputs=("k", "v", "index_k", "slot_mapping", "index_slot_mapping", "k_cache", "v_cache", "index_cache"),
    outputs=(
        Output("k_cache", compare="exact"), Output("v_cache", compare="exact"), Output("index_cache", compare="exact"),
    ),
    flops=0.0,
    bytes=float(2 * _T * _ROW * 2 + 2 * _T * 8),
    peak="memory",
    mutates=("k_cache", "v_cache", "index_cache"),
    structure_inputs=("slot_mapping", "index_slot_mapping"),
    exact_reason="a scatter copy of bf16 rows into two caches: no arithmetic, the fp64 anchor equals the result",
    notes=f"Full: {_T} new tokens of 64 requests (contexts up to 16k); main pool {_P} pages of 16, "
    f"index pool {_IP} pages of 64. No public MiniMax M3 config was available: head counts follow "
    "MiniMax-M2 and the index cache DeepSeek-V3.2's indexer. Mutated caches are also returned.",
)


def reference(k, v, index_k, slot_mapping, index_slot_mapping, k_cache, v_cache, index_cache):
    k_cache.flatten(0, 1)[slot_mapping] = k.to(k_cache.dtype)
    v_cache.flatten(0, 1)[slot_mapping] = v.to(v_cache.dtype)
    index_cache.flatten(0, 1)[index_slot_mapping] = index_k.to(index_cache.dtype)
    return k_cache, v_cache, index_cache


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    slots, islots, pages, ipages = _structure(size)
    hkv, d, di = KV_HEADS[size], HEAD_DIM[size], INDEX_DIM[size]
    t = len(slots)
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16

    def rn(*s):
        return torch.randn(*s, generator=g, device=device).to(bf)

    return (
        rn(t, hkv, d), rn(t, hkv, d), rn(t, di),
        torch.from_numpy(slots).to(device), torch.from_numpy(islots).to(device),
        rn(pages, BLOCK, hkv, d), rn(pages, BLOCK, hkv, d), rn(ipages, INDEX_BLOCK, di),
    )
