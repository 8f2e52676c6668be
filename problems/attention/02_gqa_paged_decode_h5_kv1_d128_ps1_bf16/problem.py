"""GQA decode attention over a paged KV cache (FlashInfer layout), Qwen3-14B heads at TP 8, page size 1.

One new query token per sequence attends to that sequence's whole KV cache (no mask inside a
sequence: the cache holds exactly the tokens the query may see, the query's own token included).

Inputs (bf16 unless stated):
- q                [batch, 5, 128]: the query of each sequence's new token.
- k_cache, v_cache [num_pages, page_size=1, 1, 128]: the page pool (NHD layout inside a page).
  Pages not listed in kv_indices hold garbage and must not be read.
- kv_indptr        int32 [batch + 1]: sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]].
- kv_indices       int32 [nnz_pages]: page ids, in token order (not the identity permutation).
- kv_last_page_len int32 [batch]: rows used in the last page of each sequence (1..page_size).
  kv_len[b] = (kv_indptr[b+1] - kv_indptr[b] - 1) * page_size + kv_last_page_len[b];
  token t of sequence b is row t % page_size of page kv_indices[kv_indptr[b] + t // page_size].

GQA: all 5 query heads share the single kv head (Qwen3-14B: 40 query / 8 kv heads, split over 8 GPUs).

Numerics: computed in float32 (float64 for the fp64 anchor).
  s[b,h,t] = (q[b,h] . k[b,t,0]) * sm_scale, sm_scale = 1/sqrt(128);
  out[b,h] = sum_t softmax_t(s[b,h,:]) v[b,t,0]            -> bf16 [batch, 5, 128]
  lse[b,h] = log2(sum_t exp(s[b,h,t]))  (base 2, as FlashInfer)  -> float32 [batch, 5]

Sizes: full = 128 sequences with KV lengths 256..16384 (log-uniform, fixed); smoke = 3 short ones.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from mkb.problems import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, page_table, structure_rng

NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 5, 1, 128, 1
SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)
_SIZES = {"full": (128, 256, 16384), "smoke": (3, 5, 40)}  # batch, min kv_len, max kv_len


def _structure(size: str):
    batch, lo, hi = _SIZES[size]
    rng = structure_rng(2, size)
    return page_table(rng, draw_lengths(rng, batch, lo, hi), PAGE_SIZE)


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len):
    dt = torch.promote_types(q.dtype, torch.float32)
    batch, num_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    n_pages = (kv_indptr[1:] - kv_indptr[:-1]).long()
    kv_len = (n_pages - 1) * page_size + kv_last_page_len.long()
    max_len = int(kv_len.max())
    t = torch.arange(max_len, device=q.device)
    valid = t[None, :] < kv_len[:, None]  # [batch, max_len]
    page_pos = (kv_indptr[:-1].long()[:, None] + t[None, :] // page_size).clamp(max=kv_indices.numel() - 1)
    slot = torch.where(valid, kv_indices.long()[page_pos] * page_size + t % page_size, 0)
    k = k_cache.reshape(-1, kv_heads, head_dim)[slot].to(dt)  # [batch, max_len, kv_heads, head_dim]
    v = v_cache.reshape(-1, kv_heads, head_dim)[slot].to(dt)
    qg = q.to(dt).view(batch, kv_heads, group, head_dim)
    s = torch.einsum("bhgd,blhd->bhgl", qg, k) * SM_SCALE
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    out = torch.einsum("bhgl,blhd->bhgd", p, v).reshape(batch, num_heads, head_dim)
    return out.to(q.dtype), (lse / math.log(2.0)).reshape(batch, num_heads)


def _scores_f32(a, b):
    """a @ b^T for bf16 batches [n, m, d] x [n, k, d] -> float32 [n, m, k] with fp32 accumulation.

    The lse output is float32 and judged at fp32 precision, so scores rounded to bf16 would not do.
    On CUDA this is one tensor-core GEMM with an fp32 result (bmm's out_dtype); CPU bmm has no
    out_dtype, so the operands are upcast there (the products of bf16 values are exact either way).
    """
    if a.is_cuda:
        return torch.bmm(a, b.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float().transpose(1, 2))


def eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len):
    """The eager baseline: bf16 SDPA over a padded batch gathered page by page; lse from fp32 scores.

    Each group of query heads sharing a kv head is one SDPA "sequence" of `group` query rows (no mask
    between a decode query and its cache), so no GQA expansion is needed; a boolean mask hides the
    padding past each sequence's kv_len.
    """
    batch, num_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    n_pages = (kv_indptr[1:] - kv_indptr[:-1]).long()
    kv_len = (n_pages - 1) * page_size + kv_last_page_len.long()
    max_pages = int(n_pages.max())
    max_len = max_pages * page_size
    pos = kv_indptr[:-1].long()[:, None] + torch.arange(max_pages, device=q.device)
    pages = kv_indices.long()[pos.clamp(max=kv_indices.numel() - 1)]  # [batch, max_pages]
    # [batch, max_pages, page_size, kv_heads, head_dim] -> [batch, kv_heads, max_len, head_dim]
    k = k_cache[pages].permute(0, 3, 1, 2, 4).reshape(batch, kv_heads, max_len, head_dim)
    v = v_cache[pages].permute(0, 3, 1, 2, 4).reshape(batch, kv_heads, max_len, head_dim)
    valid = (torch.arange(max_len, device=q.device) < kv_len[:, None])[:, None, None, :]
    qg = q.view(batch, kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=valid, scale=SM_SCALE)
    s = _scores_f32(qg.reshape(batch * kv_heads, group, head_dim), k.reshape(batch * kv_heads, max_len, head_dim))
    s = s.view(batch, kv_heads, group, max_len).mul_(SM_SCALE).masked_fill_(~valid, float("-inf"))
    lse = torch.logsumexp(s, dim=-1).reshape(batch, num_heads)
    return out.reshape(batch, num_heads, head_dim), lse / math.log(2.0)


def make_inputs(seed: int, *, device, size: str = "full"):
    pt = _structure(size)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    q = randn(pt.batch, NUM_QO_HEADS, HEAD_DIM)
    k_cache = randn(pt.num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    v_cache = randn(pt.num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    return q, k_cache, v_cache, i32(pt.indptr), i32(pt.indices), i32(pt.last_page_len)


def _cost():
    pt = _structure("full")
    tokens = sum(pt.kv_lens)
    flops = 4.0 * NUM_QO_HEADS * HEAD_DIM * tokens
    kv_bytes = 2 * 2 * tokens * NUM_KV_HEADS * HEAD_DIM
    qo_bytes = 2 * 2 * pt.batch * NUM_QO_HEADS * HEAD_DIM + 4 * pt.batch * NUM_QO_HEADS
    idx_bytes = 4 * (len(pt.indptr) + len(pt.indices) + pt.batch)
    return flops, float(kv_bytes + qo_bytes + idx_bytes), tokens


_FLOPS, _BYTES, _TOKENS = _cost()

META = ProblemMeta(
    number=2,
    name="gqa_paged_decode_h5_kv1_d128_ps1_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="Qwen/Qwen3-14B at tensor-parallel 8 (served by FlashInfer/vLLM)",
    source_config="num_attention_heads=40, num_key_value_heads=8, head_dim=128, TP=8 -> 5 q / 1 kv "
    "heads per GPU; FlashInfer "
    "BatchDecodeWithPagedKVCache layout (NHD pages, CSR page table), page_size=1",
    inputs=("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("kv_indptr", "kv_indices", "kv_last_page_len"),
    peak="memory",
    notes=f"full: 128 sequences, kv_len 256..16384 log-uniform, {_TOKENS} cached tokens, 25% spare "
    "pages in a shuffled pool. flops = 4*H*D*sum(kv_len); bytes = referenced KV pages + q + out + "
    "lse + page table (spare pages not counted). lse is base 2 (FlashInfer convention). "
    "Eager baseline: bf16 torch SDPA over a padded batch gathered page by page (each kv head's query "
    "group as query rows, a boolean padding mask); lse from fp32 scores (a bf16 GEMM with fp32 "
    "result) on the side.",
)
