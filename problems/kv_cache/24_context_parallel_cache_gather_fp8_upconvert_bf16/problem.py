"""Gather DeepSeek-V3.2 656-byte MLA cache entries of a paged cache into bf16 rows (fp8 upconversion).

vLLM's `cp_gather_and_upconvert_fp8_kv_cache` (tests/kernels/test_cp_gather_fp8.py), as upstream
MetaKernelBench states it. Each cache entry (one token) is 656 bytes:

    bytes   0..511  512 fp8 e4m3 latent ("nope") values, in 4 groups of 128
    bytes 512..527  4 float32 scales, one per group
    bytes 528..655  64 bf16 rope values

For request r and position p < seq_lens[r] (start_r = seq_lens[0] + ... + seq_lens[r - 1]), with
e = cache[block_table[r, p // 64], p % 64]:

    out[start_r + p, 128 g + i] = bf16(float32(e4m3 value 128 g + i) * scale_g)     g = 0..3
    out[start_r + p, 512 + i]   = rope value i (a bf16 copy)

Layouts: cache uint8 [16, 64, 656]; block_table int32 [3, 10] (request r's blocks, then 0);
seq_lens int32 [3], cut at random from 641 tokens. Output bf16 [641, 576]. The cuts and the block
assignment are redrawn on every draw.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.paged import random_cuts

NOPE = {"full": 512, "smoke": 64}
GROUPS = 4
ROPE = {"full": 64, "smoke": 8}
BLOCK = {"full": 64, "smoke": 8}
BLOCKS = {"full": 16, "smoke": 8}
REQUESTS = {"full": 3, "smoke": 3}
TOTAL = {"full": 641, "smoke": 30}
FP8 = torch.float8_e4m3fn


def entry_bytes(size: str) -> int:
    return NOPE[size] + 4 * GROUPS + 2 * ROPE[size]


def table_width(size: str) -> int:
    """Blocks of the longest request upstream can draw (all tokens but one per other request)."""
    return -(-(TOTAL[size] - REQUESTS[size] + 1) // BLOCK[size])


_f = "full"
_N = TOTAL[_f]

META = ProblemMeta(
    number=24,
    name="context_parallel_cache_gather_fp8_upconvert_bf16",
    family="kv_cache",
    dtypes=("uint8", "int32", "bf16"),
    source_model="DeepSeek-V3.2 MLA fp8 cache in vLLM (cp_gather_and_upconvert_fp8_kv_cache test)",
    source_config="656-byte entries: 512 e4m3 latent values in 4 groups of 128 with fp32 scales, 64 bf16 rope "
    "values; block size 64, 16 blocks, 3 requests of 641 tokens in all",
    inputs=("cache", "block_table", "seq_lens"),
    outputs=(Output("out"),),
    flops=float(_N * NOPE[_f]),
    bytes=float(_N * entry_bytes(_f) + _N * (NOPE[_f] + ROPE[_f]) * 2 + REQUESTS[_f] * (table_width(_f) + 1) * 4),
    peak="memory",
    structure_inputs=("block_table", "seq_lens"),
    exact_reason="e4m3 codes times fp32 scales read from the cache bytes, rounded once to bf16, and a bf16 copy: no "
    "float input for the fp64 anchor to widen, so the anchor is the reference and the allowance is eps(bf16) x "
    "max|out|, as upstream's",
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/24_context_parallel_cache_gather_fp8_upconvert_bf16.py",
        matches=("computation", "outputs", "in_place", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(("shapes", "block_table is [3, 10] on every draw (10 = blocks of the longest request upstream can "
                  "draw, padded with 0 as upstream pads); upstream's width is the drawn longest request's, so it "
                  "changes per draw, and mkb's contract keeps shapes fixed per size so a kernel is compiled and "
                  "checked against one geometry. The cache and the output match upstream's shapes."),),
    ),
    notes="At full size the problem is small (641 tokens, 420 KB of cache): the eager median may be close to the "
    "50 us floor of the band.",
)


def _rows(block_table, seq_lens, bs):
    lens = seq_lens.long()
    n = int(lens.sum())
    request = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens, output_size=n)
    pos = torch.arange(n, device=lens.device) - (torch.cumsum(lens, 0) - lens)[request]
    return block_table.long()[request, pos // bs], pos % bs


def reference(cache, block_table, seq_lens):
    blocks, offs = _rows(block_table, seq_lens, cache.shape[1])
    e = cache[blocks, offs]  # [n, entry bytes]
    nope = (e.shape[1] - 4 * GROUPS) * 4 // 5  # entry = nope + 16 + 2 rope bytes, with rope = nope / 8 at every size
    vals = e[:, :nope].contiguous().view(FP8).float().reshape(e.shape[0], GROUPS, nope // GROUPS)
    scales = e[:, nope : nope + 4 * GROUPS].contiguous().view(torch.float32)
    latent = (vals * scales[..., None]).to(torch.bfloat16).reshape(e.shape[0], nope)
    rope = e[:, nope + 4 * GROUPS :].contiguous().view(torch.bfloat16)
    return torch.cat((latent, rope), dim=-1)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    nb, bs, r, nope, rope = BLOCKS[size], BLOCK[size], REQUESTS[size], NOPE[size], ROPE[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    rows = nb * bs
    fp8 = torch.randn(rows, nope, generator=g, device=device).to(FP8)
    scales = torch.rand(rows, GROUPS, generator=g, device=device) * 2.0 + 0.1
    rope_vals = torch.randn(rows, rope, generator=g, device=device).to(torch.bfloat16)
    cache = torch.cat([fp8.view(torch.uint8), scales.view(torch.uint8), rope_vals.view(torch.uint8)], dim=1)
    cache = cache.reshape(nb, bs, entry_bytes(size))
    # the cuts and the block assignment come from the seed too (drawn on the CPU: the same on every device)
    gs = torch.Generator().manual_seed(seed)
    lens = random_cuts(gs, TOTAL[size], r)
    perm = torch.randperm(nb, generator=gs).to(torch.int32)
    table = torch.zeros(r, table_width(size), dtype=torch.int32)
    cursor = 0
    for k, n in enumerate(lens.tolist()):
        count = -(-n // bs)
        table[k, :count] = perm[cursor : cursor + count]
        cursor += count
    return cache, table.to(device), lens.to(device)
