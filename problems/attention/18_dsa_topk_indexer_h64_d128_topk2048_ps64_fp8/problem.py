"""DeepSeek-V3.2 lightning indexer (decode): fp8 index scores over a paged cache and top-2048 selection.

DeepSeek Sparse Attention scores every cached token for each query token with a small fp8
"lightning indexer" (64 index heads of dim 128, one shared index key per token) and keeps the 2048
best tokens for the main attention (problem 17). As in DeepSeek-V3.2's inference code, the query
is quantised per (token, head) and its scale, the head weights, n_heads^-0.5 and the softmax scale
128^-0.5 are folded into `weights`; the index keys are cached in fp8 with one fp32 scale per token.

Inputs:
- q_fp8       float8_e4m3fn [batch, 64, 128]: index queries of each sequence's new token.
- weights     float32 [batch, 64]: per-head weights (signed; scales already folded in).
- k_cache_fp8 float8_e4m3fn [num_pages, 64, 128]: index-key cache, page size 64.
- k_scale     float32 [num_pages, 64]: dequantisation scale of each cached key (> 0).
  (DeepGEMM packs key and scale into one [num_pages, 64, 1, 132] byte page; here they are apart.)
- seq_lens    int32 [batch]: cached tokens per sequence (all > 2048 here).
- block_table int32 [batch, max_pages]: vLLM block table; token t of sequence b is row t % 64 of
  page block_table[b, t // 64]. Entries past a sequence's last page point at an unowned page.

Numerics: q and k are exact fp8 values; products are summed in float32 (float64 for the fp64
anchor), which bf16 tensor cores with fp32 accumulation reproduce (fp8 e4m3 values are exact in
bf16); Hopper fp8 MMA accumulates with fewer bits and may swap near-tied tokens beyond tolerance.
  score[b, t] = k_scale[slot(b,t)] * sum_h weights[b,h] * relu(sum_d q[b,h,d] * k[slot(b,t),d])
  for t < seq_lens[b]; score = -inf for t >= seq_lens[b] (never selected).
Output: topk_indices int32 [batch, 2048] = token positions t (0-based within the sequence) of the
2048 largest scores, in any order (compare="topk": sets must match up to swaps of tokens whose
scores are within tolerance). `scores(*inputs)` returns the float32 [batch, max(seq_lens)] matrix.

Sizes: full = 64 sequences with 4096..32768 cached tokens (log-uniform, fixed); smoke = 2 with
2100 and 3000.
"""

from __future__ import annotations

import torch

from mkb.problems import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, page_table, structure_rng

NUMBER = 18
INDEX_HEADS, INDEX_DIM, PAGE_SIZE, TOPK = 64, 128, 64, 2048


def _structure(size: str):
    rng = structure_rng(NUMBER, size)
    lens = draw_lengths(rng, 64, 4096, 32768) if size == "full" else [2100, 3000]
    return page_table(rng, lens, PAGE_SIZE)


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] along dim 0; float8 tensors are gathered as bytes (indexing fp8 is not implemented everywhere)."""
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x.view(torch.uint8)[idx].view(x.dtype)
    return x[idx]


def scores(q_fp8, weights, k_cache_fp8, k_scale, seq_lens, block_table):
    dt = torch.promote_types(weights.dtype, torch.float32)
    batch = q_fp8.shape[0]
    page_size, dim = k_cache_fp8.shape[1], k_cache_fp8.shape[2]
    max_len = int(seq_lens.max())
    t = torch.arange(max_len, device=q_fp8.device)
    valid = t[None, :] < seq_lens.long()[:, None]  # [batch, max_len]
    page = block_table.long().gather(1, (t // page_size).expand(batch, -1).clamp(max=block_table.shape[1] - 1))
    slot = page * page_size + t % page_size
    k = _gather_rows(k_cache_fp8.reshape(-1, dim), slot).to(dt)  # [batch, max_len, dim]
    ks = k_scale.reshape(-1)[slot].to(dt)  # [batch, max_len]
    logits = torch.einsum("bhd,bld->bhl", q_fp8.to(dt), k).relu_()
    s = torch.einsum("bh,bhl->bl", weights.to(dt), logits) * ks
    return s.masked_fill(~valid, float("-inf"))


def reference(q_fp8, weights, k_cache_fp8, k_scale, seq_lens, block_table):
    s = scores(q_fp8, weights, k_cache_fp8, k_scale, seq_lens, block_table)
    return torch.topk(s, TOPK, dim=-1).indices.to(torch.int32)


def make_inputs(seed: int, *, device, size: str = "full"):
    pt = _structure(size)
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(pt.batch, INDEX_HEADS, INDEX_DIM, generator=g, device=device).to(torch.float8_e4m3fn)
    weights = torch.randn(pt.batch, INDEX_HEADS, generator=g, device=device) * (INDEX_HEADS**-0.5 * INDEX_DIM**-0.5)
    k = torch.randn(pt.num_pages, PAGE_SIZE, INDEX_DIM, generator=g, device=device).to(torch.float8_e4m3fn)
    k_scale = torch.rand(pt.num_pages, PAGE_SIZE, generator=g, device=device) * 0.02 + 0.005
    seq_lens = torch.tensor(pt.kv_lens, dtype=torch.int32, device=device)
    block_table = torch.tensor(pt.block_table, dtype=torch.int32, device=device)
    return q, weights, k, k_scale, seq_lens, block_table


def _cost():
    pt = _structure("full")
    tokens = sum(pt.kv_lens)
    flops = (2.0 * INDEX_DIM + 3.0) * INDEX_HEADS * tokens
    k_bytes = tokens * (INDEX_DIM + 4)
    q_bytes = pt.batch * INDEX_HEADS * (INDEX_DIM + 4)
    idx_bytes = 4 * (pt.batch + pt.batch * pt.max_pages + pt.batch * TOPK)
    return flops, float(k_bytes + q_bytes + idx_bytes), tokens


_FLOPS, _BYTES, _TOKENS = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="dsa_topk_indexer_h64_d128_topk2048_ps64_fp8",
    family="attention",
    dtypes=("float8_e4m3fn", "float32", "int32"),
    source_model="deepseek-ai/DeepSeek-V3.2-Exp lightning indexer (decode)",
    source_config="index_n_heads=64, index_head_dim=128, index_topk=2048; fp8 e4m3 q (per token-head "
    "scale folded into weights) and fp8 k cache with per-token fp32 scale; page_size=64",
    inputs=("q_fp8", "weights", "k_cache_fp8", "k_scale", "seq_lens", "block_table"),
    outputs=(Output("topk_indices", compare="topk", topk_scores="scores", topk_dim=-1),),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("seq_lens", "block_table"),
    peak="fp8_tc",
    notes=f"full: 64 sequences, 4096..32768 tokens each, {_TOKENS} cached tokens, block table padded "
    "with an unowned page. flops = (2*128 + 3)*64*sum(seq_lens) (dot products, relu, weighting); "
    "bytes = referenced fp8 keys + scales + q + weights + block table + indices. Top-k selection "
    "cost is not counted in flops. The peak named is fp8 tensor core, though bytes usually bind.",
)
