"""GQA attention over paged and ragged KV layouts (FlashInfer conventions): reference, eager baseline, inputs, cost.

The GQA decode and causal prefill problems share one specification and differ only in constants
(head counts, head dim, page size, sizes); each problem.py fixes those and calls these functions.

Conventions (all functions):
- q has H query heads, k/v have KV kv heads, H % KV == 0; query head h uses kv head h // (H // KV).
- Paged caches are FlashInfer NHD pages [num_pages, page_size, KV, D] with a CSR page table
  (kv_indptr, kv_indices, kv_last_page_len; see `mkb.problems.paged.PageTable`): sequence b owns
  pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], kv_len[b] = (pages - 1) * page_size +
  kv_last_page_len[b], and token t is row t % page_size of page kv_indices[kv_indptr[b] + t // page_size].
  Pages not listed hold garbage and are never read.
- Ragged tensors pack sequences back to back; sequence b owns rows indptr[b]:indptr[b+1] (cu_seqlens).
- Causal prefill masks bottom-right: query row i (0-based within its sequence) sees key t iff
  t <= i + (kv_len[b] - qo_len[b]), i.e. the queries are the last qo_len[b] tokens of the sequence.
- Outputs: out in q's dtype [.., H, D], and lse = log2(sum over visible keys of exp(s)) in float32
  (base 2, as FlashInfer), where s = (q . k) * sm_scale.
- `*_reference` computes in torch.promote_types(q.dtype, float32) (float64 inputs give the fp64
  anchor); `*_eager` is the baseline timed (bf16 SDPA, lse from fp32 scores on the side).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from mkb.problems.paged import PageTable, cu_seqlens, draw_lengths, page_table

__all__ = [
    "decode_cost",
    "decode_eager",
    "decode_inputs",
    "decode_reference",
    "decode_structure",
    "paged_prefill_eager",
    "paged_prefill_inputs",
    "paged_prefill_reference",
    "paged_prefill_structure",
    "prefill_cost",
    "prefill_lengths",
    "ragged_prefill_eager",
    "ragged_prefill_inputs",
    "ragged_prefill_reference",
]


def _randn_bf16(g: torch.Generator, device, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)


def _i32(x, device) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32, device=device)


def _seq(x, indptr: list[int], b: int):
    """Rows indptr[b]:indptr[b+1] of a ragged tensor: sequence b's part."""
    return x[indptr[b] : indptr[b + 1]]


def _scores_f32(a, b):
    """a @ b^T for bf16 batches [n, m, d] x [n, k, d] -> float32 [n, m, k] with fp32 accumulation.

    The lse output is float32 and judged at fp32 precision, so scores rounded to bf16 would not do.
    On CUDA this is one tensor-core GEMM with an fp32 result (bmm's out_dtype); CPU bmm has no
    out_dtype, so the operands are upcast there (the products of bf16 values are exact either way).
    """
    if a.is_cuda:
        return torch.bmm(a, b.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float().transpose(1, 2))


# ---------------------------------------------------------------------------------------------
# Decode: one new query token per sequence attends to its whole paged KV cache (no mask).
# ---------------------------------------------------------------------------------------------


def decode_structure(rng: np.random.Generator, spec: tuple[int, int, int], page_size: int) -> PageTable:
    """The page table for spec = (batch, min kv_len, max kv_len): lengths log-uniform, then pages.

    `rng` is `structure_rng(problem number, size)`, so the structure never depends on the value seed.
    """
    batch, lo, hi = spec
    return page_table(rng, draw_lengths(rng, batch, lo, hi), page_size)


def decode_inputs(seed: int, pt: PageTable, *, device, num_qo_heads: int, num_kv_heads: int, head_dim: int):
    """(q [batch, H, D], k_cache, v_cache [num_pages, page_size, KV, D], kv_indptr, kv_indices, kv_last_page_len).

    Values are standard normal (bf16) from `seed`, drawn in that order; the index tensors are int32.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    q = _randn_bf16(g, device, pt.batch, num_qo_heads, head_dim)
    k_cache = _randn_bf16(g, device, pt.num_pages, pt.page_size, num_kv_heads, head_dim)
    v_cache = _randn_bf16(g, device, pt.num_pages, pt.page_size, num_kv_heads, head_dim)
    return q, k_cache, v_cache, _i32(pt.indptr, device), _i32(pt.indices, device), _i32(pt.last_page_len, device)


def decode_reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, *, sm_scale: float):
    """Decode attention: out[b,h] = sum_t softmax_t(s[b,h,:]) v[b,t,h//group], lse base 2.

    Gathers every sequence's tokens into a padded [batch, max_len] batch and masks the padding.
    """
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
    s = torch.einsum("bhgd,blhd->bhgl", qg, k) * sm_scale
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    out = torch.einsum("bhgl,blhd->bhgd", p, v).reshape(batch, num_heads, head_dim)
    return out.to(q.dtype), (lse / math.log(2.0)).reshape(batch, num_heads)


def decode_eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, *, sm_scale: float):
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
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=valid, scale=sm_scale)
    s = _scores_f32(qg.reshape(batch * kv_heads, group, head_dim), k.reshape(batch * kv_heads, max_len, head_dim))
    s = s.view(batch, kv_heads, group, max_len).mul_(sm_scale).masked_fill_(~valid, float("-inf"))
    lse = torch.logsumexp(s, dim=-1).reshape(batch, num_heads)
    return out.reshape(batch, num_heads, head_dim), lse / math.log(2.0)


def decode_cost(pt: PageTable, *, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> tuple[float, float]:
    """(flops, bytes): flops = 4*H*D*sum(kv_len); bytes = referenced KV + q + out + lse + page table.

    Spare pages of the pool are not counted: a kernel never needs to read them.
    """
    tokens = sum(pt.kv_lens)
    flops = 4.0 * num_qo_heads * head_dim * tokens
    kv_bytes = 2 * 2 * tokens * num_kv_heads * head_dim
    qo_bytes = 2 * 2 * pt.batch * num_qo_heads * head_dim + 4 * pt.batch * num_qo_heads
    idx_bytes = 4 * (len(pt.indptr) + len(pt.indices) + pt.batch)
    return flops, float(kv_bytes + qo_bytes + idx_bytes)


# ---------------------------------------------------------------------------------------------
# Causal prefill: qo_len[b] new tokens after a cached prefix, kv_len[b] = prefix[b] + qo_len[b].
# ---------------------------------------------------------------------------------------------


def prefill_lengths(rng: np.random.Generator, spec) -> tuple[list[int], list[int]]:
    """(qo_lens, kv_lens) for spec = (batch, (qo_len lo, hi), (prefix lo, hi)), log-uniform.

    `rng` is `structure_rng(problem number, size)`. Sequence 0 gets an empty prefix (one plain
    prefill); kv_len = prefix + qo_len.
    """
    batch, (qlo, qhi), (plo, phi) = spec
    qo_lens = draw_lengths(rng, batch, qlo, qhi)
    prefix = draw_lengths(rng, batch, plo, phi)
    prefix[0] = 0  # one plain prefill (no cached prefix)
    return qo_lens, [p + q for p, q in zip(prefix, qo_lens)]


def paged_prefill_structure(rng: np.random.Generator, spec, page_size: int) -> tuple[list[int], PageTable]:
    """(qo_lens, page table of the kv_lens): `prefill_lengths`, then the pages from the same `rng`."""
    qo_lens, kv_lens = prefill_lengths(rng, spec)
    return qo_lens, page_table(rng, kv_lens, page_size)


def paged_prefill_inputs(
    seed: int, qo_lens: list[int], pt: PageTable, *, device, num_qo_heads: int, num_kv_heads: int, head_dim: int
):
    """(q [total_q, H, D], k_cache, v_cache [num_pages, page_size, KV, D], qo_indptr, kv_indptr, kv_indices, kv_last_page_len).

    Values are standard normal (bf16) from `seed`, drawn in that order; the index tensors are int32.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    q = _randn_bf16(g, device, sum(qo_lens), num_qo_heads, head_dim)
    k_cache = _randn_bf16(g, device, pt.num_pages, pt.page_size, num_kv_heads, head_dim)
    v_cache = _randn_bf16(g, device, pt.num_pages, pt.page_size, num_kv_heads, head_dim)
    qo_indptr = _i32(cu_seqlens(qo_lens), device)
    return (q, k_cache, v_cache, qo_indptr, _i32(pt.indptr, device), _i32(pt.indices, device),
            _i32(pt.last_page_len, device))


def ragged_prefill_inputs(
    seed: int, qo_lens: list[int], kv_lens: list[int], *, device, num_qo_heads: int, num_kv_heads: int, head_dim: int
):
    """(q [total_q, H, D], k, v [total_kv, KV, D], qo_indptr, kv_indptr).

    Values are standard normal (bf16) from `seed`, drawn in that order; the indptrs are int32 cu_seqlens.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    q = _randn_bf16(g, device, sum(qo_lens), num_qo_heads, head_dim)
    k = _randn_bf16(g, device, sum(kv_lens), num_kv_heads, head_dim)
    v = _randn_bf16(g, device, sum(kv_lens), num_kv_heads, head_dim)
    return q, k, v, _i32(cu_seqlens(qo_lens), device), _i32(cu_seqlens(kv_lens), device)


def _paged_rows(kv_indices, kv_indptr: list[int], kv_last_page_len: list[int], b: int, page_size: int):
    """Flat slots (page * page_size + row) of sequence b's kv_len tokens, in token order."""
    pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
    kv_len = (pages.numel() - 1) * page_size + kv_last_page_len[b]
    rows = torch.arange(page_size, device=kv_indices.device)
    return (pages[:, None] * page_size + rows[None, :]).reshape(-1)[:kv_len]


def _causal_reference_seq(qb, kb, vb, sm_scale: float):
    """One sequence: qb [q_len, H, D], kb/vb [kv_len, KV, D] (compute dtype) -> (out [q_len, H, D], natural lse [q_len, H])."""
    q_len, num_heads, head_dim = qb.shape
    kv_len, kv_heads, _ = kb.shape
    group = num_heads // kv_heads
    s = torch.einsum("qhgd,khd->hgqk", qb.view(q_len, kv_heads, group, head_dim), kb) * sm_scale
    i = torch.arange(q_len, device=qb.device)[:, None]
    t = torch.arange(kv_len, device=qb.device)[None, :]
    s = s.masked_fill(t > i + (kv_len - q_len), float("-inf"))
    m = torch.logsumexp(s, dim=-1)  # [kv_heads, group, q_len]
    p = torch.exp(s - m[..., None])
    ob = torch.einsum("hgqk,khd->qhgd", p, vb)
    return ob.reshape(q_len, num_heads, head_dim), m.reshape(num_heads, q_len).T


def paged_prefill_reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *, sm_scale: float):
    """Causal (bottom-right) prefill over a paged cache, one sequence at a time -> (out, lse base 2)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    _, page_size, kv_heads, head_dim = k_cache.shape
    k_flat = k_cache.reshape(-1, kv_heads, head_dim)
    v_flat = v_cache.reshape(-1, kv_heads, head_dim)
    qo, kvp, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    out = torch.empty(q.shape, dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b in range(len(qo) - 1):
        slot = _paged_rows(kv_indices, kvp, last, b, page_size)
        kb, vb = k_flat[slot].to(dt), v_flat[slot].to(dt)  # [kv_len, kv_heads, head_dim]
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = _causal_reference_seq(_seq(q, qo, b).to(dt), kb, vb, sm_scale)
    return out.to(q.dtype), lse / math.log(2.0)


def ragged_prefill_reference(q, k, v, qo_indptr, kv_indptr, *, sm_scale: float):
    """Causal (bottom-right) prefill over ragged q and k/v, one sequence at a time -> (out, lse base 2)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty(q.shape, dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b in range(len(qo) - 1):
        kb, vb = k[kvp[b] : kvp[b + 1]].to(dt), v[kvp[b] : kvp[b + 1]].to(dt)
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = _causal_reference_seq(_seq(q, qo, b).to(dt), kb, vb, sm_scale)
    return out.to(q.dtype), lse / math.log(2.0)


def _causal_lse(qb, kb, scale):
    """Base-2 lse of one sequence's bottom-right causal scores: qb [H, q_len, D], kb [kv_heads, kv_len, D] -> [q_len, H]."""
    num_heads, q_len, head_dim = qb.shape
    kv_heads, kv_len, _ = kb.shape
    s = _scores_f32(qb.reshape(kv_heads, num_heads // kv_heads * q_len, head_dim), kb)
    s = s.view(num_heads, q_len, kv_len).mul_(scale)
    i = torch.arange(q_len, device=qb.device)[:, None]
    t = torch.arange(kv_len, device=qb.device)[None, :]
    s.masked_fill_(t > i + (kv_len - q_len), float("-inf"))
    return torch.logsumexp(s, dim=-1).T / math.log(2.0)


def _causal_eager_seq(qb, kb, vb, sm_scale: float):
    """One sequence, heads first: qb [H, q_len, D], kb/vb [KV, kv_len, D] -> (out [q_len, H, D], lse base 2 [q_len, H]).

    The bottom-right causal mask is torch's `causal_lower_right` bias (flash or memory-efficient
    attention on the GPU, GQA native); lse comes from fp32 scores on the side.
    """
    mask = causal_lower_right(qb.shape[1], kb.shape[1])
    ob = F.scaled_dot_product_attention(qb[None], kb[None], vb[None], attn_mask=mask, scale=sm_scale,
                                        enable_gqa=kb.shape[0] != qb.shape[0])
    return ob[0].transpose(0, 1), _causal_lse(qb, kb, sm_scale)


def paged_prefill_eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *, sm_scale: float):
    """The eager baseline: per sequence (a batch of a few), gather its pages and run bf16 SDPA."""
    _, page_size, kv_heads, head_dim = k_cache.shape
    qo, kvp, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    out = torch.empty((*q.shape[:2], v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        pages = kv_indices[kvp[b] : kvp[b + 1]].long()
        kv_len = (pages.numel() - 1) * page_size + last[b]
        kb = k_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].transpose(0, 1)  # [kv_heads, kv_len, D]
        vb = v_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].transpose(0, 1)
        qb = _seq(q, qo, b).transpose(0, 1)  # [H, q_len, D]
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = _causal_eager_seq(qb, kb, vb, sm_scale)
    return out, lse


def ragged_prefill_eager(q, k, v, qo_indptr, kv_indptr, *, sm_scale: float):
    """The eager baseline: per sequence (a batch of a few), bf16 SDPA on its ragged slices."""
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty((*q.shape[:2], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        qb = _seq(q, qo, b).transpose(0, 1)  # [H, q_len, D]
        kb, vb = k[kvp[b] : kvp[b + 1]].transpose(0, 1), v[kvp[b] : kvp[b + 1]].transpose(0, 1)
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = _causal_eager_seq(qb, kb, vb, sm_scale)
    return out, lse


def prefill_cost(
    qo_lens: list[int], kv_lens: list[int], *, num_qo_heads: int, num_kv_heads: int, head_dim: int, index_bytes: int
) -> tuple[float, float]:
    """(flops, bytes) counting only visible query-key pairs: 4*H*D*sum_b(qo*(kv-qo) + qo*(qo+1)/2).

    bytes = KV (each token once) + q + out + lse + `index_bytes` (the layout's index tensors).
    """
    pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(qo_lens, kv_lens))
    flops = 4.0 * num_qo_heads * head_dim * pairs
    kv_bytes = 2 * 2 * sum(kv_lens) * num_kv_heads * head_dim
    qo_bytes = sum(qo_lens) * num_qo_heads * (2 * 2 * head_dim + 4)
    return flops, float(kv_bytes + qo_bytes + index_bytes)
