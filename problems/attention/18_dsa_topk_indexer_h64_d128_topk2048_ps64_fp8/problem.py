"""DeepSeek-V3.2 lightning indexer (decode): fp8 index scores over a paged, packed fp8 cache and top-2048 selection.

DeepSeek Sparse Attention scores every cached token of a sequence with a small fp8 "lightning indexer"
(64 index heads of dim 128, one shared index key per token) and keeps the 2048 best tokens for the
main attention (problem 17). As upstream MetaKernelBench states it (FlashInfer-Trace definition
dsa_topk_indexer_fp8_h64_d128_topk2048_ps64):

Inputs:
- q_index_fp8       float8_e4m3fn [batch, 64, 128]: index queries of each sequence's new token.
- k_index_cache_fp8 int8 [num_pages, 64, 1, 132]: DeepGEMM's packed page: the page's 64 x 128 fp8
  e4m3 key bytes (token-major), then its 64 float32 per-token scales (little-endian bytes).
- weights           float32 [batch, 64]: per-head weights (signed).
- seq_lens          int32 [batch]: cached tokens per sequence (the captured trace's, fixed).
- block_table       int32 [batch, 43]: token t of sequence b is row t % 64 of page
  block_table[b, t // 64]; entries past a sequence's last page are 0, a page no sequence owns.

  score[b, t] = sum_h weights[b, h] * relu(sum_d q[b, h, d] * k[t, d] * scale[t])   for t < seq_lens[b]

Output: topk_indices int32 [batch, 2048]: the min(2048, seq_lens[b]) best tokens of sequence b, as
global cache slots (page * 64 + row), in ascending token order, then -1. Compared exactly: make_inputs
redraws the values (up to 16 times) until every selection has a margin of at least 1e-3 between the
2048th and 2049th score, so fp32 and fp64 arithmetic select the same set. The page assignment is
redrawn on every draw over the pool.

Sizes: full = upstream's captured record (31 sequences, 6 to 2693 tokens, 11923 pages); smoke = 4
sequences with top-64.
"""

from __future__ import annotations

import torch

from mkb.problems import Output, ProblemMeta, Upstream

NUMBER = 18
INDEX_HEADS, INDEX_DIM, PAGE_SIZE = 64, 128, 64
TOPK = {"full": 2048, "smoke": 64}
SEQ_LENS = {
    "full": (63, 9, 2693, 212, 11, 25, 6, 50, 77, 22, 25, 10, 52, 76, 11, 30, 1822, 25, 1034, 1811, 7, 13, 23, 1896,
             13, 285, 18, 166, 16, 1421, 12),
    "smoke": (150, 9, 40, 100),
}
NUM_PAGES = {"full": 11923, "smoke": 16}
MAX_PAGES = {"full": 43, "smoke": 3}
MARGIN = 1e-3
REDRAWS = 16


def gather_keys(k_index_cache_fp8: torch.Tensor, slot: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The keys of cache slots `slot` (page * 64 + row), as `dtype` already multiplied by their scale: [*slot.shape, 128].

    Only the gathered rows are dequantised (the pool is much larger than what a batch reads).
    """
    pages, ps, _, row = k_index_cache_fp8.shape
    d = row - 4
    flat = k_index_cache_fp8.view(torch.uint8).reshape(pages, ps * row)
    values = flat[:, : ps * d].reshape(pages * ps, d)  # a view: token-major fp8 bytes
    scales = flat[:, ps * d :].contiguous().view(torch.float32).reshape(pages * ps)
    k = values[slot].view(torch.float8_e4m3fn).to(dtype)
    return k * scales[slot].to(dtype)[..., None]


def _slots(seq_lens: torch.Tensor, block_table: torch.Tensor, max_len: int):
    t = torch.arange(max_len, device=block_table.device)
    page = block_table.long()[:, (t // PAGE_SIZE).clamp(max=block_table.shape[1] - 1)]
    valid = t[None, :] < seq_lens.long()[:, None]
    return page * PAGE_SIZE + t % PAGE_SIZE, valid  # [batch, max_len] global slots, and which are real tokens


def scores(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    """float [batch, max(seq_lens)] index scores, -inf past each sequence's end."""
    dt = torch.promote_types(weights.dtype, torch.float32)
    max_len = int(seq_lens.max())
    slot, valid = _slots(seq_lens, block_table, max_len)
    k = gather_keys(k_index_cache_fp8, slot, dt)  # [b, L, d]
    logits = torch.einsum("bhd,bld->bhl", q_index_fp8.to(dt), k).relu_()
    s = torch.einsum("bh,bhl->bl", weights.to(dt), logits)
    return s.masked_fill(~valid, float("-inf"))


def reference(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    s = scores(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)
    batch, max_len = s.shape
    topk = next(TOPK[z] for z in TOPK if len(SEQ_LENS[z]) == batch)  # the batch fixes the size
    k = min(topk, max_len)
    idx = torch.topk(s, k, dim=-1).indices  # token positions within each sequence
    real = idx < seq_lens.long()[:, None]
    # ascending token order, the padding last
    idx = torch.where(real, idx, torch.full_like(idx, max_len)).sort(dim=-1).values
    slot, _ = _slots(seq_lens, block_table, max_len)
    out = torch.where(idx < max_len, slot.gather(1, idx.clamp(max=max_len - 1)), torch.full_like(idx, -1))
    if k < topk:
        out = torch.cat([out, out.new_full((batch, topk - k), -1)], dim=1)
    return out.to(torch.int32)


def _block_table(size: str, gen: torch.Generator) -> torch.Tensor:
    perm = torch.randperm(NUM_PAGES[size] - 1, generator=gen) + 1  # page 0 is never owned: it is the padding
    table = torch.zeros(len(SEQ_LENS[size]), MAX_PAGES[size], dtype=torch.int32)
    cursor = 0
    for b, n in enumerate(SEQ_LENS[size]):
        pages = -(-n // PAGE_SIZE)
        table[b, :pages] = perm[cursor : cursor + pages].to(torch.int32)
        cursor += pages
    return table


def _packed_cache(size: str, g: torch.Generator, device) -> torch.Tensor:
    pages = NUM_PAGES[size]
    values = torch.randn(pages, PAGE_SIZE, INDEX_DIM, generator=g, device=device).to(torch.float8_e4m3fn)
    scales = torch.rand(pages, PAGE_SIZE, generator=g, device=device) * 0.5 + 0.5
    packed = torch.cat([values.reshape(pages, -1).view(torch.uint8), scales.view(torch.uint8).reshape(pages, -1)], dim=1)
    return packed.view(torch.int8).reshape(pages, PAGE_SIZE, 1, INDEX_DIM + 4)


def _unstable(inputs, topk: int) -> bool:
    s = scores(*inputs).float()
    long_rows = inputs[3].long() > topk
    if not bool(long_rows.any()):
        return False
    top = torch.topk(s[long_rows], topk + 1, dim=-1).values
    return bool((top[:, topk - 1] - top[:, topk] < MARGIN).any())


def make_inputs(seed: int, *, device, size: str = "full"):
    gcpu = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor(SEQ_LENS[size], dtype=torch.int32, device=device)
    block_table = _block_table(size, gcpu).to(device)
    g = torch.Generator(device=device).manual_seed(seed)
    batch = len(SEQ_LENS[size])
    for _ in range(REDRAWS):
        q = torch.randn(batch, INDEX_HEADS, INDEX_DIM, generator=g, device=device).to(torch.float8_e4m3fn)
        cache = _packed_cache(size, g, device)
        weights = torch.randn(batch, INDEX_HEADS, generator=g, device=device)
        inputs = (q, cache, weights, seq_lens, block_table)
        if not _unstable(inputs, TOPK[size]):
            return inputs
    raise ValueError(f"problem 18: selection margins under {MARGIN} persist after {REDRAWS} redraws of seed {seed}")


def _cost():
    tokens = sum(SEQ_LENS["full"])
    batch = len(SEQ_LENS["full"])
    flops = (2.0 * INDEX_DIM + 3.0) * INDEX_HEADS * tokens
    k_bytes = tokens * (INDEX_DIM + 4)
    q_bytes = batch * INDEX_HEADS * (INDEX_DIM + 4)
    idx_bytes = 4 * (batch + batch * MAX_PAGES["full"] + batch * TOPK["full"])
    return flops, float(k_bytes + q_bytes + idx_bytes), tokens


_FLOPS, _BYTES, _TOKENS = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="dsa_topk_indexer_h64_d128_topk2048_ps64_fp8",
    family="attention",
    dtypes=("float8_e4m3fn", "int8", "float32", "int32"),
    source_model="deepseek-ai/DeepSeek-V3.2-Exp lightning indexer (decode), FlashInfer-Trace record",
    source_config="index_n_heads=64, index_head_dim=128, index_topk=2048; fp8 e4m3 q and packed fp8 k cache "
    "with per-token fp32 scale ([pages, 64, 1, 132] bytes); page_size=64",
    inputs=("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table"),
    outputs=(Output("topk_indices", compare="exact"),),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("block_table",),
    fixed_inputs=("seq_lens",),
    peak="fp8_tc",
    exact_reason="integer cache slots of a selection whose boundary margin is >= 1e-3 (make_inputs redraws "
    "otherwise), far above fp32 rounding: fp32 and fp64 select the same set",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/18_dsa_topk_indexer_h64_d128_topk2048_ps64_fp8.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: upstream's captured record, 31 sequences, {_TOKENS} cached tokens; only sequences longer "
    "than 2048 make a selection, the others return all their tokens. flops = (2*128 + 3)*64*sum(seq_lens); "
    "bytes = referenced fp8 keys + scales + q + weights + block table + indices.",
)
