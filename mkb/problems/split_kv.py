"""Split-KV (flash-decoding) eager attention over a paged KV cache: long sequences cut into chunks that fill the GPU.

Why: a per-sequence decode SDPA has one query row per head, so its parallelism is the number of kv heads
(8 thread blocks for a 165k-token sequence) and a trace with a few very long sequences runs at a few percent
of the HBM bandwidth (problem 03's eager measured 99 ms against a 1.5 ms speed of light on the H200,
events/h200-characterisation-2). Cutting every sequence into chunks of at most `chunk_tokens` tokens gives one
padded batch of (sequence, chunk) pairs; each chunk's attention and its lse are computed, and the chunks of a
sequence are merged by their lse (out = sum_c exp(lse_c - lse) out_c, lse = logsumexp_c lse_c), which is exact.
Only the problems whose eager uses it import this module (a helper's bytes are part of a problem's hash).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkb.problems.gqa import _kv_lens, _scores_f32

CHUNK_TOKENS = 4096  # tokens per chunk (a multiple of the page size is used)


def split_kv_decode_eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, *, sm_scale: float,
                          chunk_tokens: int = CHUNK_TOKENS):
    """The decode eager baseline (bf16 SDPA per chunk, lse from fp32 scores) over chunks of every sequence.

    q [batch, H, D], caches [num_pages, page_size, KV, D] -> (out bf16 [batch, H, D], lse base 2 float32 [batch, H]).
    """
    batch, num_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    dev = q.device
    kvp = kv_indptr.tolist()
    lens = _kv_lens(kvp, None if kv_last_page_len is None else kv_last_page_len.tolist(), page_size)
    n_pages = [b - a for a, b in zip(kvp, kvp[1:])]
    cp = max(1, min(max(n_pages), chunk_tokens // page_size))  # pages per chunk
    seq, first, tokens = [], [], []
    for b, (np_, n) in enumerate(zip(n_pages, lens)):
        for c in range(0, np_, cp):
            seq.append(b)
            first.append(kvp[b] + c)
            tokens.append(min(n - c * page_size, cp * page_size))
    n_chunks, max_len = len(seq), cp * page_size
    seq_t = torch.tensor(seq, device=dev)
    pos = torch.tensor(first, device=dev)[:, None] + torch.arange(cp, device=dev)
    pages = kv_indices.long()[pos.clamp(max=kv_indices.numel() - 1)]  # [chunks, cp]; padding pages are masked
    # [chunks, cp, page_size, kv_heads, D] -> [chunks, kv_heads, max_len, D]
    k = k_cache[pages].permute(0, 3, 1, 2, 4).reshape(n_chunks, kv_heads, max_len, head_dim)
    v = v_cache[pages].permute(0, 3, 1, 2, 4).reshape(n_chunks, kv_heads, max_len, -1)
    valid = (torch.arange(max_len, device=dev) < torch.tensor(tokens, device=dev)[:, None])[:, None, None, :]
    qg = q.view(batch, kv_heads, group, head_dim)[seq_t]  # [chunks, kv_heads, group, D]
    out_c = F.scaled_dot_product_attention(qg, k, v, attn_mask=valid, scale=sm_scale)
    s = _scores_f32(qg.reshape(n_chunks * kv_heads, group, head_dim), k.reshape(n_chunks * kv_heads, max_len, head_dim))
    s = s.view(n_chunks, kv_heads, group, max_len).mul_(sm_scale).masked_fill_(~valid, float("-inf"))
    lse_c = torch.logsumexp(s, dim=-1)  # [chunks, kv_heads, group], natural log; every chunk has >= 1 token
    del s, k, v
    m = torch.full((batch, kv_heads, group), float("-inf"), device=dev).scatter_reduce_(
        0, seq_t[:, None, None].expand_as(lse_c), lse_c, reduce="amax")
    w = torch.exp(lse_c - m[seq_t])
    denom = torch.zeros_like(m).index_add_(0, seq_t, w)
    out = torch.zeros((batch, kv_heads, group, out_c.shape[-1]), device=dev).index_add_(
        0, seq_t, out_c.float() * w[..., None])
    out = (out / denom[..., None]).to(q.dtype).reshape(batch, num_heads, -1)
    lse = (m + torch.log(denom)).reshape(batch, num_heads)
    return out, lse / math.log(2.0)
