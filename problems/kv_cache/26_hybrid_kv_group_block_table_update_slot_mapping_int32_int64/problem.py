"""Staged block-table writes for three hybrid KV-cache groups, then per-token slot mapping.

vLLM v1's `BlockTables.apply_staged_writes` fused over KV groups (tests/v1/worker/test_gpu_block_table.py::
test_block_tables_apply_staged_writes_fuses_kv_groups), as upstream MetaKernelBench states it.

Groups g = 0, 1, 2 have allocation block sizes (16, 32, 8) and kernel block sizes (16, 16, 8): a group
whose allocation block is e = 2 kernel blocks expands each staged block id b into e ids b e, b e + 1.
1. Staged writes, in order w = 0 .. 127, per group: r = write_requests[w], c = staged_counts[g, w],
   ids = expand(staged_ids[g, w, :c]), start = 0 if overwrite[w] else num_blocks[g, r]:
       block_table_g[r, start : start + len(ids)] = ids ;  num_blocks[g, r] = start + len(ids)
   (later writes see earlier ones: each request is written twice, once in each half).
2. Slot mapping: for batch entry i, request r = idx_mapping[i], tokens query_start_loc[i] ..
   query_start_loc[i + 1] - 1 at positions p: slot_mapping[g, t] = block_table_g[r, p // k_g] k_g + p % k_g,
   with k_g the kernel block size; tokens past query_start_loc[-1] keep -1.

Layouts: block_table_g int32 [64, (512, 1024, 512)]; num_blocks int32 [3, 64] (zeros); write_requests int32
[128] (two permutations of the requests); overwrite bool [128]; staged_ids int32 [3, 128, 4] (-1 past the
count); staged_counts int32 [3, 128] in 0..4; idx_mapping int32 [64]; query_start_loc int32 [65] (lengths
0..64 per request); positions int64 [4096] in 0..63. Returns the three tables and num_blocks (updated in
place, META.mutates) and slot_mapping int64 [3, 4096]. All of it is redrawn on every draw. Integer
arithmetic only: compared exactly.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
REQS = {"full": 64, "smoke": 8}
TOKENS = {"full": 4096, "smoke": 64}  # max batched tokens = REQS x max tokens per request
WIDTHS = {"full": (512, 1024, 512), "smoke": (16, 32, 16)}
BLOCK_IDS = {"full": 2048, "smoke": 64}
CAPACITY = 4  # staged block ids per write
PAD_SLOT = -1


def max_position(size: str) -> int:
    """Positions stay within the blocks two rounds of staged writes can fill (upstream's bound)."""
    return 2 * CAPACITY * min(BLOCK_SIZES)


_f = "full"
_R, _T, _W = REQS[_f], TOKENS[_f], 2 * REQS[_f]

META = ProblemMeta(
    number=26,
    name="hybrid_kv_group_block_table_update_slot_mapping_int32_int64",
    family="kv_cache",
    dtypes=("int32", "int64", "bool"),
    source_model="vLLM v1 GPU block tables (hybrid KV groups), test_block_tables_apply_staged_writes_fuses_kv_groups",
    source_config="3 KV groups, block sizes (16, 32, 8), kernel block sizes (16, 16, 8), max_num_reqs=64, "
    "max_num_batched_tokens=4096, max blocks per request (512, 1024, 512), 128 staged writes of up to 4 ids",
    inputs=("block_table_0", "block_table_1", "block_table_2", "num_blocks", "write_requests", "overwrite",
            "staged_ids", "staged_counts", "idx_mapping", "query_start_loc", "positions"),
    outputs=(
        Output("block_table_0", compare="exact"), Output("block_table_1", compare="exact"),
        Output("block_table_2", compare="exact"), Output("num_blocks", compare="exact"),
        Output("slot_mapping", compare="exact"),
    ),
    flops=0.0,
    # staged ids and their bookkeeping in, the written table entries out (at most 8 ids a write), then per
    # token: position in, one table entry read per group, slot out per group
    bytes=float(3 * _W * (CAPACITY * 4 + 4 + 4 + 1) + 3 * _W * 2 * CAPACITY * 4 + 3 * _R * 4 * 2
                + _T * 8 + 3 * _T * (4 + 8) + (_R + 1) * 4 + _R * 4),
    peak="memory",
    mutates=("block_table_0", "block_table_1", "block_table_2", "num_blocks"),
    structure_inputs=("write_requests", "staged_counts", "idx_mapping", "query_start_loc"),
    fixed_inputs=("num_blocks",),
    exact_reason="integer index arithmetic and copies only",
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/26_hybrid_kv_group_block_table_update_slot_mapping_int32_int64.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes="The mutated tables and counts are also returned. num_blocks starts at zero on every draw, as upstream's. "
    "The reference applies the writes in order (they depend on each other), reading the small bookkeeping "
    "tensors on the host once; the slot mapping is one gather per group.",
)


def reference(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
              staged_counts, idx_mapping, query_start_loc, positions):
    tables = (block_table_0, block_table_1, block_table_2)
    dev = block_table_0.device
    requests = write_requests.tolist()
    over = overwrite.tolist()
    counts_host = staged_counts.tolist()
    held = num_blocks.tolist()
    for g, table in enumerate(tables):
        e = BLOCK_SIZES[g] // KERNEL_BLOCK_SIZES[g]
        for w, r in enumerate(requests):
            c = counts_host[g][w]
            ids = staged_ids[g, w, :c]
            if e > 1:
                ids = (ids[:, None] * e + torch.arange(e, device=dev, dtype=ids.dtype)[None, :]).reshape(-1)
            start = 0 if over[w] else held[g][r]
            table[r, start : start + ids.numel()] = ids.to(table.dtype)
            held[g][r] = start + ids.numel()
    num_blocks.copy_(torch.tensor(held, dtype=num_blocks.dtype))
    n = positions.shape[0]
    t = torch.arange(n, device=dev)
    batch = torch.searchsorted(query_start_loc[1:].long(), t, right=True).clamp(max=idx_mapping.numel() - 1)
    valid = t < query_start_loc[-1].long()
    req = idx_mapping.long()[batch]
    slot_mapping = torch.full((len(tables), n), PAD_SLOT, dtype=torch.int64, device=dev)
    for g, table in enumerate(tables):
        k = KERNEL_BLOCK_SIZES[g]
        slots = table.long()[req, positions // k] * k + positions % k
        slot_mapping[g] = torch.where(valid, slots, slot_mapping[g])
    return block_table_0, block_table_1, block_table_2, num_blocks, slot_mapping


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    R, T, ids = REQS[size], TOKENS[size], BLOCK_IDS[size]
    writes = 2 * R
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU (small tensors): the same on every device
    tables = [torch.randint(0, ids, (R, w), generator=g, dtype=torch.int32) for w in WIDTHS[size]]
    num_blocks = torch.zeros(3, R, dtype=torch.int32)
    write_requests = torch.cat([torch.randperm(R, generator=g), torch.randperm(R, generator=g)]).to(torch.int32)
    overwrite = torch.randint(0, 2, (writes,), generator=g).to(torch.bool)
    staged_counts = torch.randint(0, CAPACITY + 1, (3, writes), generator=g, dtype=torch.int32)
    candidates = torch.randint(0, ids, (3, writes, CAPACITY), generator=g, dtype=torch.int32)
    filled = torch.arange(CAPACITY)[None, None, :] < staged_counts[:, :, None]
    staged_ids = torch.where(filled, candidates, torch.full_like(candidates, -1))
    idx_mapping = torch.randperm(R, generator=g).to(torch.int32)
    lengths = torch.randint(0, T // R + 1, (R,), generator=g)
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0).clamp(max=T)]).to(torch.int32)
    positions = torch.randint(0, max_position(size), (T,), generator=g, dtype=torch.int64)
    out = (*tables, num_blocks, write_requests, overwrite, staged_ids, staged_counts, idx_mapping, query_start_loc,
           positions)
    return tuple(x.to(device) for x in out)
