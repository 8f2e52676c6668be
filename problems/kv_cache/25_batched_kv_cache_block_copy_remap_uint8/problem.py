"""Batched copy of KV-cache blocks from one uint8 (fp8-stored) paged cache into another, under a remap.

vLLM's `swap_blocks` (cache_kernels.cu; test_cache.py::test_swap_blocks), as upstream
MetaKernelBench states it: for every pair (src, dst) of `block_mapping`,

    dst_k[dst] = src_k[src]
    dst_v[dst] = src_v[src]

Caches are one layer of vLLM's flash layout, fp8 codes stored as raw bytes (torch.uint8):

    src_k, src_v, dst_k, dst_v  uint8 [num_blocks, block_size, kv_heads, head_dim]
    block_mapping               int64 [num_pairs, 2]   (src, dst) block ids

The mapping is redrawn on every draw: a random permutation of the block ids gives distinct
sources and distinct destinations, the two sets disjoint. The destination caches are updated in
place (META.mutates) and returned; the sources are unchanged. Full size (upstream's): 1024 blocks
of 32 tokens x 8 heads x 256 bytes, 256 pairs. A pure byte copy: the result is exact.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

BLOCKS = {"full": 1024, "smoke": 48}
BLOCK_SIZE = {"full": 32, "smoke": 16}
KV_HEADS = {"full": 8, "smoke": 2}
HEAD = {"full": 256, "smoke": 32}
PAIRS = {"full": 256, "smoke": 10}

_f = "full"
_BLOCK_BYTES = BLOCK_SIZE[_f] * KV_HEADS[_f] * HEAD[_f]  # one block of K (or V)
_COPIED = 2 * PAIRS[_f] * _BLOCK_BYTES

META = ProblemMeta(
    number=25,
    name="batched_kv_cache_block_copy_remap_uint8",
    family="kv_cache",
    dtypes=("uint8", "int64"),
    source_model="vLLM swap_blocks (tests/kernels/attention/test_cache.py::test_swap_blocks), kv_cache_dtype=fp8",
    source_config="num_blocks=1024, block_size=32, num_kv_heads=8, head_size=256, 256 (src, dst) pairs; "
    "vLLM flash layout [blocks, block_size, heads, head_size]",
    inputs=("src_k", "src_v", "dst_k", "dst_v", "block_mapping"),
    outputs=(Output("dst_k", compare="exact"), Output("dst_v", compare="exact")),
    flops=0.0,
    bytes=2.0 * _COPIED + PAIRS[_f] * 2 * 8,  # read each copied source block and write its destination once
    peak="memory",
    mutates=("dst_k", "dst_v"),
    structure_inputs=("block_mapping",),
    exact_reason="a byte copy between cache blocks: no arithmetic, the fp64 anchor equals the result",
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/25_batched_kv_cache_block_copy_remap_uint8.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes="Mutated destinations are also returned (same names as the inputs). bytes counts only the copied "
    "blocks (the untouched rest of the caches need not move). The mapping is redrawn per seed.",
)


def reference(src_k: torch.Tensor, src_v: torch.Tensor, dst_k: torch.Tensor, dst_v: torch.Tensor,
              block_mapping: torch.Tensor):
    src = block_mapping[:, 0]
    dst = block_mapping[:, 1]
    dst_k[dst] = src_k[src]
    dst_v[dst] = src_v[src]
    return dst_k, dst_v


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    nb, bs, h, d, npairs = BLOCKS[size], BLOCK_SIZE[size], KV_HEADS[size], HEAD[size], PAIRS[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    shape = (nb, bs, h, d)
    caches = [torch.randint(0, 256, shape, generator=g, device=device, dtype=torch.uint8) for _ in range(4)]
    # the mapping is drawn from the seed too (on the CPU, so that it is the same on every device)
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(seed))
    mapping = torch.stack([perm[:npairs], perm[npairs : 2 * npairs]], dim=1).to(torch.int64)
    return (*caches, mapping.to(device))
