"""Gather a paged fp8 MLA latent cache into one contiguous fp32 buffer, dequantised, sequences back to back.

vLLM's `gather_and_maybe_dequant_cache` (test_cache.py::test_gather_and_maybe_dequant_cache_mla), used
by MLA chunked prefill to up-project the cached context, as upstream MetaKernelBench states it: for
request r and token position p < seq_lens[r], with start_r = seq_lens[0] + ... + seq_lens[r - 1],

    out[start_r + p, :] = float32(e4m3(src_cache[block_table[r, p // 16], p % 16, :])) * scale

Layouts: src_cache uint8 [1024, 16, 576] (e4m3 bytes of DeepSeek-V3 MLA entries: 512 latent + 64
rope dims); block_table int32 [8, 1024], each row its own permutation of the blocks (requests may
share blocks); seq_lens int32 [8], cut at random from 4096 tokens; scale the Python float 0.1.
Output: out float32 [4096, 576]. The block table and the cuts are redrawn on every draw; the total
(and so the output shape) stays 4096.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream
from mkb.problems.paged import random_cuts

LORA = {"full": 512, "smoke": 16}
ROPE = {"full": 64, "smoke": 8}
BLOCK = {"full": 16, "smoke": 4}
BLOCKS = {"full": 1024, "smoke": 16}
REQUESTS = {"full": 8, "smoke": 3}
TOTAL = {"full": 4096, "smoke": 40}
SCALE = 0.1
FP8 = torch.float8_e4m3fn

_f = "full"
_N, _E = TOTAL[_f], LORA[_f] + ROPE[_f]

META = ProblemMeta(
    number=23,
    name="mla_cache_gather_dequantize_fp8",
    family="kv_cache",
    dtypes=("uint8", "int32", "fp32"),
    source_model="DeepSeek-V3-style MLA cache in vLLM (gather_and_maybe_dequant_cache test)",
    source_config="kv_lora_rank=512, qk_rope_head_dim=64 (576 cached dims per token), block size 16, 1024 blocks, "
    "8 requests of 4096 tokens in all, per-tensor scale 0.1",
    inputs=("src_cache", "block_table", "seq_lens", "scale"),
    outputs=(Output("out"),),
    flops=float(_N * _E),
    bytes=float(_N * _E * (1 + 4) + REQUESTS[_f] * 4 + _N * 4),  # codes in, fp32 out, lengths, one table entry a token
    peak="memory",
    structure_inputs=("block_table", "seq_lens"),
    exact_reason="e4m3 codes times a Python-float scale: no float input for the fp64 anchor to widen, so the "
    "anchor is the reference and the allowance is eps(fp32) x max|out| (3 ulps of the largest value), as upstream's",
    upstream=Upstream(
        source="shipped",
        path="problems/kv_cache/23_mla_cache_gather_dequantize_fp8.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes="The reference gathers all requests at once (token -> request from the cumulative lengths); upstream's "
    "loops over requests. The two agree exactly.",
)


def reference(src_cache, block_table, seq_lens, scale):
    bs = src_cache.shape[1]
    lens = seq_lens.long()
    n = int(lens.sum())
    request = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens, output_size=n)
    start = torch.cumsum(lens, 0) - lens
    pos = torch.arange(n, device=lens.device) - start[request]
    blocks = block_table.long()[request, pos // bs]
    codes = src_cache[blocks, pos % bs].view(FP8)
    return codes.float() * scale


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    nb, bs, e, r = BLOCKS[size], BLOCK[size], LORA[size] + ROPE[size], REQUESTS[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    source = torch.randn(nb, bs, e, generator=g, device=device).to(torch.float16)
    src_cache = (source / SCALE).clamp(-448.0, 448.0).to(FP8).view(torch.uint8)
    # the block table and the cuts come from the seed too (drawn on the CPU: the same on every device)
    gs = torch.Generator().manual_seed(seed)
    block_table = torch.stack([torch.randperm(nb, generator=gs) for _ in range(r)]).to(torch.int32)
    seq_lens = random_cuts(gs, TOTAL[size], r)
    return src_cache, block_table.to(device), seq_lens.to(device), SCALE
