"""Per-step block-table append and slot-mapping computation for a hybrid model's KV cache groups.

vLLM v1 keeps one block table per KV cache group (`MultiGroupBlockTable`): a hybrid model's
full-attention layers and its sliding-window layers form separate groups with their own block ids
and block sizes. Each scheduler step, for every group g and request row r, the newly allocated
blocks are appended to the row (`append_row`), then every scheduled token gets its slot
(`compute_slot_mapping`):

    n = num_blocks_per_row[g, r] ; c = num_new_blocks[g, r]
    block_tables[g, r, n : n + c] = new_block_ids[g, r, :c] ;  num_blocks_per_row[g, r] = n + c
    slot_mapping[g, t] = block_tables[g, req_indices[t], positions[t] // bs_g] * bs_g + positions[t] % bs_g
        with bs_g = block_sizes[g]  (computed with the appended rows)

Layouts: block_tables int32 [G, R, M]; num_blocks_per_row int32 [G, R]; new_block_ids int32
[G, R, K] (entries past num_new_blocks are garbage and must not be copied); num_new_blocks int32
[G, R]; req_indices int32 [T]; positions int64 [T]; block_sizes int32 [G]. Outputs: block_tables
and num_blocks_per_row (updated in place, META.mutates, also returned) and slot_mapping int64 [G, T].
Rows of requests not scheduled this step are unchanged. Integer arithmetic only: compared exactly.
Full size: 2 groups (gpt-oss style full + sliding-window attention, block sizes 16 and 64),
512 request rows of up to 2048 blocks, 160 scheduled requests (decodes and prefill chunks).
"""

from __future__ import annotations

import numpy as np
import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, structure_rng

ROWS = {"full": 512, "smoke": 12}
MAX_BLOCKS = {"full": 2048, "smoke": 32}
ACTIVE = {"full": 160, "smoke": 5}
NEW = {"full": (1, 2048), "smoke": (1, 20)}
CTX = {"full": (1, 24576), "smoke": (1, 90)}
BLOCK_SIZES = {"full": (16, 64), "smoke": (4, 8)}
POOL = {"full": 400000, "smoke": 400}  # physical blocks per group


def _structure(size: str):
    rng = structure_rng(26, size)
    R, A = ROWS[size], ACTIVE[size]
    rows = np.sort(rng.choice(R, size=A, replace=False))
    new = np.array(draw_lengths(rng, A, *NEW[size]))
    ctx = np.array(draw_lengths(rng, A, *CTX[size]))
    bss = BLOCK_SIZES[size]
    before = np.zeros((len(bss), R), dtype=np.int64)  # blocks held by each row before the step
    after = np.zeros((len(bss), R), dtype=np.int64)
    # idle rows hold blocks of requests that are not scheduled this step
    for g, bs in enumerate(bss):
        idle = rng.integers(0, MAX_BLOCKS[size] // 4, size=R)
        before[g] = idle
        after[g] = idle
        before[g, rows] = -(-ctx // bs)
        after[g, rows] = -(-(ctx + new) // bs)
    req = np.concatenate([np.full(m, r) for r, m in zip(rows, new)])
    pos = np.concatenate([np.arange(c, c + m) for c, m in zip(ctx, new)])
    return before, after, req.astype(np.int32), pos.astype(np.int64)


_BEFORE, _AFTER, _REQ, _ = _structure("full")
_G, _T = len(BLOCK_SIZES["full"]), len(_REQ)
_APPENDED = int((_AFTER - _BEFORE).sum())

META = ProblemMeta(
    number=26,
    name="hybrid_kv_group_block_table_update_slot_mapping_int32_int64",
    family="kv_cache",
    dtypes=("int32", "int64"),
    source_model="openai/gpt-oss-120b served by vLLM v1 (hybrid KV cache manager: full + sliding-window groups)",
    source_config="2 KV cache groups, block sizes 16 and 64 (the hybrid allocator may give groups different "
    "block sizes), max_num_reqs=512, max blocks per request 2048",
    inputs=(
        "block_tables", "num_blocks_per_row", "new_block_ids", "num_new_blocks", "req_indices", "positions",
        "block_sizes",
    ),
    outputs=(
        Output("block_tables", compare="exact"),
        Output("num_blocks_per_row", compare="exact"),
        Output("slot_mapping", compare="exact"),
    ),
    flops=0.0,
    bytes=float(_APPENDED * 4 * 2 + _T * (4 + 8) + _G * _T * (4 + 8) + _G * ROWS["full"] * 4 * 4),
    peak="memory",
    mutates=("block_tables", "num_blocks_per_row"),
    structure_inputs=("num_blocks_per_row", "num_new_blocks", "req_indices", "positions", "block_sizes"),
    exact_reason="integer index arithmetic and copies only",
    notes=f"Full: {_T} scheduled tokens of {ACTIVE['full']} requests, {_APPENDED} blocks appended over "
    "both groups. Mutated tables are also returned.",
)


def reference(block_tables, num_blocks_per_row, new_block_ids, num_new_blocks, req_indices, positions, block_sizes):
    G, R, M = block_tables.shape
    K = new_block_ids.shape[2]
    dev = block_tables.device
    slot_mapping = torch.empty(G, positions.shape[0], dtype=torch.int64, device=dev)
    k = torch.arange(K, device=dev)
    for g in range(G):
        n = num_blocks_per_row[g].long()
        c = num_new_blocks[g].long()
        mask = k[None, :] < c[:, None]
        rows = torch.arange(R, device=dev)[:, None].expand(R, K)[mask]
        cols = (n[:, None] + k[None, :])[mask]
        block_tables[g][rows, cols] = new_block_ids[g][mask]
        num_blocks_per_row[g] += num_new_blocks[g]
        bs = int(block_sizes[g])
        blocks = block_tables[g][req_indices.long(), positions // bs].long()
        slot_mapping[g] = blocks * bs + positions % bs
    return block_tables, num_blocks_per_row, slot_mapping


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    before, after, req, pos = _structure(size)
    G, R, M = before.shape[0], ROWS[size], MAX_BLOCKS[size]
    cnt = after - before
    K = int(cnt.max())
    g = torch.Generator(device="cpu").manual_seed(seed)
    # block ids are values: drawn from the seed, distinct within a group (a permutation of the pool)
    tables = torch.randint(0, POOL[size], (G, R, M), generator=g, dtype=torch.int32)  # stale beyond the count
    new_ids = torch.randint(0, POOL[size], (G, R, K), generator=g, dtype=torch.int32)  # garbage past the count
    for gi in range(G):
        perm = torch.randperm(POOL[size], generator=g).to(torch.int32)
        used = 0
        for r in range(R):
            b, c = int(before[gi, r]), int(cnt[gi, r])
            tables[gi, r, :b] = perm[used : used + b]
            new_ids[gi, r, :c] = perm[used + b : used + b + c]
            used += b + c
    i32 = torch.int32
    return (
        tables.to(device),
        torch.from_numpy(before).to(i32).to(device),
        new_ids.to(device),
        torch.from_numpy(cnt).to(i32).to(device),
        torch.from_numpy(req).to(device),
        torch.from_numpy(pos).to(device),
        torch.tensor(BLOCK_SIZES[size], dtype=i32, device=device),
    )
