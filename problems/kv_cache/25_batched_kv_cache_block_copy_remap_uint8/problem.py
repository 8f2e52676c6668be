"""Batched block copy with remapping across all layers of uint8 (fp8-stored) paged KV caches.

vLLM's `copy_blocks` (cache_kernels.cu), used for copy-on-write when sequences fork (beam search,
parallel sampling, prefix-cache forks): for every layer l and every pair (src, dst) of
`block_mapping`,

    key_caches[l, dst]   = key_caches[l, src]
    value_caches[l, dst] = value_caches[l, src]

Caches hold fp8 e4m3 codes stored as raw bytes (vLLM `kv_cache_dtype="fp8"`, torch.uint8), in
vLLM's paged layouts, all layers stacked in one tensor:

    key_caches   uint8 [layers, num_blocks, kv_heads, head_size // 16, block_size, 16]
    value_caches uint8 [layers, num_blocks, kv_heads, head_size, block_size]
    block_mapping int64 [num_pairs, 2]   (src, dst) block ids

Destinations are distinct; no destination is also a source; a source may be copied to several
destinations (a fork into several children). Both caches are updated in place (META.mutates) and
returned. Full size: Llama 3.1 8B (32 layers, 8 KV heads of 128, block size 16), 1024 blocks per
layer, 384 pairs. A pure byte copy: the result is exact.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

LAYERS = {"full": 32, "smoke": 2}
BLOCKS = {"full": 1024, "smoke": 48}
KV_HEADS = {"full": 8, "smoke": 2}
HEAD = {"full": 128, "smoke": 32}
BLOCK_SIZE = {"full": 16, "smoke": 16}
PAIRS = {"full": 384, "smoke": 10}
X = 16  # bytes per 16-byte vector in vLLM's key layout (16 // element size)
_STRUCT_SEED = 25_000

_f = "full"
_BLOCK_BYTES = KV_HEADS[_f] * HEAD[_f] * BLOCK_SIZE[_f]  # one block of K (or V) of one layer
_COPIED = 2 * LAYERS[_f] * PAIRS[_f] * _BLOCK_BYTES

META = ProblemMeta(
    number=25,
    name="batched_kv_cache_block_copy_remap_uint8",
    family="kv_cache",
    dtypes=("uint8", "int64"),
    source_model="meta-llama/Llama-3.1-8B served by vLLM with kv_cache_dtype=fp8",
    source_config="num_hidden_layers=32, num_key_value_heads=8, head_dim=128; vLLM block_size=16, "
    "key layout [blocks, heads, head/16, block, 16], value layout [blocks, heads, head, block]",
    inputs=("key_caches", "value_caches", "block_mapping"),
    outputs=(Output("key_caches", compare="exact"), Output("value_caches", compare="exact")),
    flops=0.0,
    bytes=2.0 * _COPIED + PAIRS[_f] * 2 * 8,  # read and write each copied block once
    peak="memory",
    mutates=("key_caches", "value_caches"),
    structure_inputs=("block_mapping",),
    exact_reason="a byte copy between cache blocks: no arithmetic, the fp64 anchor equals the result",
    notes="Mutated caches are also returned (same names as the inputs). bytes counts only the "
    "copied blocks (the untouched rest of the caches need not move). Mapping (sources with "
    "repeats, distinct destinations, disjoint from sources) is fixed per size.",
)


def reference(key_caches: torch.Tensor, value_caches: torch.Tensor, block_mapping: torch.Tensor):
    src = block_mapping[:, 0]
    dst = block_mapping[:, 1]
    # sources are never destinations, so gathering first then scattering is the sequential result
    key_caches[:, dst] = key_caches[:, src]
    value_caches[:, dst] = value_caches[:, src]
    return key_caches, value_caches


def _mapping(size: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(_STRUCT_SEED)
    nb, npairs = BLOCKS[size], PAIRS[size]
    perm = torch.randperm(nb, generator=g)
    n_src = max(2, (2 * npairs) // 3)
    src_pool = perm[:n_src]
    dst = perm[n_src : n_src + npairs]
    # some parents fork into several children: draw sources with replacement
    src = src_pool[torch.randint(0, n_src, (npairs,), generator=g)]
    return torch.stack([src, dst], dim=1).to(torch.int64)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    L, nb, h, d, bs = LAYERS[size], BLOCKS[size], KV_HEADS[size], HEAD[size], BLOCK_SIZE[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    key = torch.randint(0, 256, (L, nb, h, d // X, bs, X), generator=g, device=device, dtype=torch.uint8)
    value = torch.randint(0, 256, (L, nb, h, d, bs), generator=g, device=device, dtype=torch.uint8)
    return key, value, _mapping(size).to(device)
