"""GQA attention over paged and ragged KV layouts (FlashInfer conventions): reference, eager baseline, inputs, cost.

The GQA decode and causal prefill problems (01-09) share one specification and differ only in constants
(head counts, head dim, page size, the captured FlashInfer-Trace geometry); each problem.py fixes those
and calls these functions.

Conventions (all functions):
- q has H query heads, k/v have KV kv heads, H % KV == 0; query head h uses kv head h // (H // KV).
- Paged caches are FlashInfer NHD pages [num_pages, page_size, KV, D] with a CSR page table:
  sequence b owns pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], kv_len[b] = (pages - 1) * page_size +
  kv_last_page_len[b] (kv_last_page_len is absent, i.e. None, for page size 1), and token t is row
  t % page_size of page kv_indices[kv_indptr[b] + t // page_size]. Pages not listed hold garbage.
- Geometry is upstream MetaKernelBench's: the captured indptrs (and last-page lengths) are fixed per
  problem and size; kv_indices is redrawn from the value seed on every draw, the first nnz entries of a
  random permutation of the whole pool (`Trace`), so a kernel cannot specialise on one page order.
- Ragged tensors pack sequences back to back; sequence b owns rows indptr[b]:indptr[b+1] (cu_seqlens).
- Causal prefill masks bottom-right: query row i (0-based within its sequence) sees key t iff
  t <= i + (kv_len[b] - qo_len[b]), i.e. the queries are the last qo_len[b] tokens of the sequence.
- Inputs end with sm_scale, a Python float (the captured scale, as upstream passes it).
- Outputs: out in q's dtype [.., H, D], and lse = log2(sum over visible keys of exp(s)) in float32
  (base 2, as FlashInfer), where s = (q . k) * sm_scale.
- `*_reference` computes in torch.promote_types(q.dtype, float32) (float64 inputs give the fp64
  anchor), one sequence at a time and, for prefill, 512 query rows at a time (bounded memory);
  `*_eager` is the baseline timed (bf16 SDPA, lse from fp32 scores on the side).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from mkb.problems.paged import cu_seqlens, pool_indices

__all__ = [
    "CHUNK_Q",
    "Trace",
    "decode_cost",
    "decode_eager",
    "decode_inputs",
    "decode_reference",
    "paged_prefill_eager",
    "paged_prefill_inputs",
    "paged_prefill_reference",
    "prefill_cost",
    "ragged_prefill_eager",
    "ragged_prefill_inputs",
    "ragged_prefill_reference",
    "ragged_trace",
]

CHUNK_Q = 512  # query rows per reference block (bounds the score matrix, as upstream's reference does)
PAD_FACTOR = 4.0  # the decode eager pads to one batch unless padding would multiply the gathered KV by more


@dataclass(frozen=True)
class Trace:
    """A captured geometry: page (or token) counts per sequence, the pool, and for prefill the query counts.

    `kv_indptr` counts pages for a paged layout (tokens for a ragged one); `last_page_len` is None where
    the problem has no such input (page size 1: every page is full).
    """

    kv_indptr: tuple[int, ...]
    page_size: int = 1
    num_pages: int = 0  # paged: pool size (the referenced pages plus spare ones)
    last_page_len: tuple[int, ...] | None = None
    qo_indptr: tuple[int, ...] | None = None  # prefill: query rows per sequence (cu_seqlens)

    @property
    def batch(self) -> int:
        return len(self.kv_indptr) - 1

    @property
    def kv_lens(self) -> list[int]:
        counts = [b - a for a, b in zip(self.kv_indptr, self.kv_indptr[1:])]
        if self.num_pages == 0:  # ragged: the indptr counts tokens
            return counts
        last = self.last_page_len or (self.page_size,) * self.batch
        return [(n - 1) * self.page_size + lp for n, lp in zip(counts, last)]

    @property
    def qo_lens(self) -> list[int]:
        assert self.qo_indptr is not None, "a decode trace has no query indptr"
        return [b - a for a, b in zip(self.qo_indptr, self.qo_indptr[1:])]


def _generator(seed: int, device) -> torch.Generator | None:
    """The value generator on `device`; None on the meta device (shapes only, no values)."""
    return None if torch.device(device).type == "meta" else torch.Generator(device=device).manual_seed(seed)


def _randn_bf16(g: torch.Generator | None, device, *shape: int) -> torch.Tensor:
    if g is None:
        return torch.empty(*shape, device=device, dtype=torch.bfloat16)
    return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)


def _i32(x, device) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32, device=device)


def _page_indices(seed: int, trace: Trace, device) -> torch.Tensor:
    return pool_indices(seed, trace.num_pages, trace.kv_indptr[-1]).to(device)


def _scores_f32(a, b):
    """a @ b^T for bf16 batches [n, m, d] x [n, k, d] -> float32 [n, m, k] with fp32 accumulation.

    The lse output is float32 and judged at fp32 precision, so scores rounded to bf16 would not do.
    On CUDA this is one tensor-core GEMM with an fp32 result (bmm's out_dtype); CPU bmm has no
    out_dtype, so the operands are upcast there (the products of bf16 values are exact either way).
    """
    if a.is_cuda:
        return torch.bmm(a, b.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float().transpose(1, 2))


def _kv_lens(kv_indptr: list[int], kv_last_page_len: list[int] | None, page_size: int) -> list[int]:
    pages = [b - a for a, b in zip(kv_indptr, kv_indptr[1:])]
    last = kv_last_page_len if kv_last_page_len is not None else [page_size] * len(pages)
    return [(n - 1) * page_size + lp for n, lp in zip(pages, last)]


def _seq_slots(kv_indices, kv_indptr: list[int], kv_len: int, b: int, page_size: int):
    """Flat slots (page * page_size + row) of sequence b's kv_len tokens, in token order."""
    pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
    rows = torch.arange(page_size, device=kv_indices.device)
    return (pages[:, None] * page_size + rows[None, :]).reshape(-1)[:kv_len]


def _attend(qb, kb, vb, sm_scale: float, delta: int | None):
    """qb [q_len, H, D], kb/vb [kv_len, KV, D] (compute dtype) -> (out [q_len, H, D], natural lse [q_len, H]).

    Causal blocks pass `delta` = kv_len - qo_len + (the block's first query row within its sequence):
    key t is visible to block row i iff t <= i + delta. None = no mask (decode).
    """
    q_len, num_heads, head_dim = qb.shape
    kv_len, kv_heads, _ = kb.shape
    group = num_heads // kv_heads
    s = torch.einsum("qhgd,khd->hgqk", qb.reshape(q_len, kv_heads, group, head_dim), kb) * sm_scale
    if delta is not None:
        i = torch.arange(q_len, device=qb.device)[:, None]
        t = torch.arange(kv_len, device=qb.device)[None, :]
        s = s.masked_fill(t > i + delta, float("-inf"))
    m = torch.logsumexp(s, dim=-1)  # [kv_heads, group, q_len]
    p = torch.exp(s - m[..., None])
    ob = torch.einsum("hgqk,khd->qhgd", p, vb)
    return ob.reshape(q_len, num_heads, -1), m.reshape(num_heads, q_len).T


# ---------------------------------------------------------------------------------------------
# Decode: one new query token per sequence attends to its whole paged KV cache (no mask).
# ---------------------------------------------------------------------------------------------


def decode_inputs(seed: int, trace: Trace, *, device, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                  sm_scale: float) -> tuple:
    """(q [batch, H, D], k_cache, v_cache [num_pages, page_size, KV, D], kv_indptr, kv_indices,
    [kv_last_page_len,] sm_scale): values standard normal (bf16) from `seed`, page order from `seed`."""
    g = _generator(seed, device)
    q = _randn_bf16(g, device, trace.batch, num_qo_heads, head_dim)
    k_cache = _randn_bf16(g, device, trace.num_pages, trace.page_size, num_kv_heads, head_dim)
    v_cache = _randn_bf16(g, device, trace.num_pages, trace.page_size, num_kv_heads, head_dim)
    index = (_i32(trace.kv_indptr, device), _page_indices(seed, trace, device))
    last = (_i32(trace.last_page_len, device),) if trace.last_page_len is not None else ()
    return (q, k_cache, v_cache, *index, *last, sm_scale)


def decode_reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, *, sm_scale: float):
    """Decode attention, one sequence at a time: out[b,h] = sum_t softmax_t(s[b,h,:]) v[b,t,h//group], lse base 2."""
    dt = torch.promote_types(q.dtype, torch.float32)
    _, page_size, kv_heads, head_dim = k_cache.shape
    k_flat = k_cache.reshape(-1, kv_heads, head_dim)
    v_flat = v_cache.reshape(-1, kv_heads, v_cache.shape[-1])
    kvp = kv_indptr.tolist()
    lens = _kv_lens(kvp, None if kv_last_page_len is None else kv_last_page_len.tolist(), page_size)
    out = torch.empty((*q.shape[:2], v_cache.shape[-1]), dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b, n in enumerate(lens):
        slot = _seq_slots(kv_indices, kvp, n, b, page_size)
        ob, mb = _attend(q[b : b + 1].to(dt), k_flat[slot].to(dt), v_flat[slot].to(dt), sm_scale, None)
        out[b], lse[b] = ob[0], mb[0]
    return out.to(q.dtype), lse / math.log(2.0)


def decode_eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, *, sm_scale: float):
    """The eager baseline: bf16 SDPA with each kv head's query group as query rows; lse from fp32 scores.

    Sequences are gathered page by page into one padded batch with a padding mask, unless padding would
    gather more than PAD_FACTOR x the real KV (very unequal lengths): then one SDPA per sequence.
    """
    batch, num_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    kvp = kv_indptr.tolist()
    lens = _kv_lens(kvp, None if kv_last_page_len is None else kv_last_page_len.tolist(), page_size)
    n_pages = [b - a for a, b in zip(kvp, kvp[1:])]
    max_pages = max(n_pages)
    qg = q.view(batch, kv_heads, group, head_dim)
    if batch * max_pages <= PAD_FACTOR * sum(n_pages):
        max_len = max_pages * page_size
        pos = kv_indptr[:-1].long()[:, None] + torch.arange(max_pages, device=q.device)
        pages = kv_indices.long()[pos.clamp(max=kv_indices.numel() - 1)]  # [batch, max_pages]
        # [batch, max_pages, page_size, kv_heads, head_dim] -> [batch, kv_heads, max_len, head_dim]
        k = k_cache[pages].permute(0, 3, 1, 2, 4).reshape(batch, kv_heads, max_len, head_dim)
        v = v_cache[pages].permute(0, 3, 1, 2, 4).reshape(batch, kv_heads, max_len, -1)
        kv_len = torch.tensor(lens, device=q.device)
        valid = (torch.arange(max_len, device=q.device) < kv_len[:, None])[:, None, None, :]
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=valid, scale=sm_scale)
        s = _scores_f32(qg.reshape(batch * kv_heads, group, head_dim), k.reshape(batch * kv_heads, max_len, head_dim))
        s = s.view(batch, kv_heads, group, max_len).mul_(sm_scale).masked_fill_(~valid, float("-inf"))
        lse = torch.logsumexp(s, dim=-1).reshape(batch, num_heads)
        return out.reshape(batch, num_heads, -1), lse / math.log(2.0)
    out = torch.empty((batch, num_heads, v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q.device)
    for b, n in enumerate(lens):
        pages = kv_indices[kvp[b] : kvp[b + 1]].long()
        kb = k_cache[pages].reshape(-1, kv_heads, head_dim)[:n].transpose(0, 1)  # [kv_heads, n, D]
        vb = v_cache[pages].reshape(-1, kv_heads, v_cache.shape[-1])[:n].transpose(0, 1)
        out[b] = F.scaled_dot_product_attention(qg[b], kb, vb, scale=sm_scale).reshape(num_heads, -1)
        lse[b] = torch.logsumexp(_scores_f32(qg[b], kb).mul_(sm_scale), dim=-1).reshape(num_heads)
    return out, lse / math.log(2.0)


def decode_cost(trace: Trace, *, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> tuple[float, float]:
    """(flops, bytes): flops = 4*H*D*sum(kv_len); bytes = referenced KV + q + out + lse + page table.

    Spare pages of the pool are not counted: a kernel never needs to read them.
    """
    tokens = sum(trace.kv_lens)
    flops = 4.0 * num_qo_heads * head_dim * tokens
    kv_bytes = 2 * 2 * tokens * num_kv_heads * head_dim
    qo_bytes = 2 * 2 * trace.batch * num_qo_heads * head_dim + 4 * trace.batch * num_qo_heads
    idx_bytes = 4 * (len(trace.kv_indptr) + trace.kv_indptr[-1] + (trace.batch if trace.last_page_len else 0))
    return flops, float(kv_bytes + qo_bytes + idx_bytes)


# ---------------------------------------------------------------------------------------------
# Causal prefill: qo_len[b] new tokens after a cached prefix, kv_len[b] >= qo_len[b].
# ---------------------------------------------------------------------------------------------


def paged_prefill_inputs(seed: int, trace: Trace, *, device, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                         sm_scale: float) -> tuple:
    """(q [total_q, H, D], k_cache, v_cache [num_pages, page_size, KV, D], qo_indptr, kv_indptr, kv_indices,
    [kv_last_page_len,] sm_scale): values standard normal (bf16) from `seed`, page order from `seed`."""
    g = _generator(seed, device)
    q = _randn_bf16(g, device, trace.qo_indptr[-1], num_qo_heads, head_dim)
    k_cache = _randn_bf16(g, device, trace.num_pages, trace.page_size, num_kv_heads, head_dim)
    v_cache = _randn_bf16(g, device, trace.num_pages, trace.page_size, num_kv_heads, head_dim)
    index = (_i32(trace.qo_indptr, device), _i32(trace.kv_indptr, device), _page_indices(seed, trace, device))
    last = (_i32(trace.last_page_len, device),) if trace.last_page_len is not None else ()
    return (q, k_cache, v_cache, *index, *last, sm_scale)


def ragged_prefill_inputs(seed: int, trace: Trace, *, device, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                          sm_scale: float) -> tuple:
    """(q [total_q, H, D], k, v [total_kv, KV, D], qo_indptr, kv_indptr, sm_scale): values from `seed`."""
    g = _generator(seed, device)
    q = _randn_bf16(g, device, trace.qo_indptr[-1], num_qo_heads, head_dim)
    k = _randn_bf16(g, device, trace.kv_indptr[-1], num_kv_heads, head_dim)
    v = _randn_bf16(g, device, trace.kv_indptr[-1], num_kv_heads, head_dim)
    return q, k, v, _i32(trace.qo_indptr, device), _i32(trace.kv_indptr, device), sm_scale


def _causal_reference_seq(qb, kb, vb, sm_scale: float, out, lse) -> None:
    """One sequence in CHUNK_Q blocks of query rows, written into out [q_len, H, D] and lse [q_len, H] (natural)."""
    q_len, kv_len = qb.shape[0], kb.shape[0]
    for r0 in range(0, q_len, CHUNK_Q):
        r1 = min(r0 + CHUNK_Q, q_len)
        out[r0:r1], lse[r0:r1] = _attend(qb[r0:r1], kb, vb, sm_scale, kv_len - q_len + r0)


def paged_prefill_reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *,
                            sm_scale: float):
    """Causal (bottom-right) prefill over a paged cache, one sequence at a time -> (out, lse base 2)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    _, page_size, kv_heads, head_dim = k_cache.shape
    k_flat = k_cache.reshape(-1, kv_heads, head_dim)
    v_flat = v_cache.reshape(-1, kv_heads, v_cache.shape[-1])
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    lens = _kv_lens(kvp, None if kv_last_page_len is None else kv_last_page_len.tolist(), page_size)
    out = torch.empty((*q.shape[:2], v_cache.shape[-1]), dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b, n in enumerate(lens):
        slot = _seq_slots(kv_indices, kvp, n, b, page_size)
        _causal_reference_seq(q[qo[b] : qo[b + 1]].to(dt), k_flat[slot].to(dt), v_flat[slot].to(dt), sm_scale,
                              out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]])
    return out.to(q.dtype), lse / math.log(2.0)


def ragged_prefill_reference(q, k, v, qo_indptr, kv_indptr, *, sm_scale: float):
    """Causal (bottom-right) prefill over ragged q and k/v, one sequence at a time -> (out, lse base 2)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty((*q.shape[:2], v.shape[-1]), dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b in range(len(qo) - 1):
        _causal_reference_seq(q[qo[b] : qo[b + 1]].to(dt), k[kvp[b] : kvp[b + 1]].to(dt), v[kvp[b] : kvp[b + 1]].to(dt),
                              sm_scale, out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]])
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
    """The eager baseline: per sequence, gather its pages and run bf16 SDPA."""
    _, page_size, kv_heads, head_dim = k_cache.shape
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    lens = _kv_lens(kvp, None if kv_last_page_len is None else kv_last_page_len.tolist(), page_size)
    out = torch.empty((*q.shape[:2], v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b, n in enumerate(lens):
        pages = kv_indices[kvp[b] : kvp[b + 1]].long()
        kb = k_cache[pages].reshape(-1, kv_heads, head_dim)[:n].transpose(0, 1)  # [kv_heads, kv_len, D]
        vb = v_cache[pages].reshape(-1, kv_heads, v_cache.shape[-1])[:n].transpose(0, 1)
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)  # [H, q_len, D]
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = _causal_eager_seq(qb, kb, vb, sm_scale)
    return out, lse


def ragged_prefill_eager(q, k, v, qo_indptr, kv_indptr, *, sm_scale: float):
    """The eager baseline: per sequence, bf16 SDPA on its ragged slices."""
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty((*q.shape[:2], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)  # [H, q_len, D]
        kb, vb = k[kvp[b] : kvp[b + 1]].transpose(0, 1), v[kvp[b] : kvp[b + 1]].transpose(0, 1)
        out[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]] = _causal_eager_seq(qb, kb, vb, sm_scale)
    return out, lse


def prefill_cost(trace: Trace, *, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> tuple[float, float]:
    """(flops, bytes) counting only visible query-key pairs: 4*H*D*sum_b(qo*(kv-qo) + qo*(qo+1)/2).

    bytes = KV (each token once) + q + out + lse + the index tensors.
    """
    qo_lens, kv_lens = trace.qo_lens, trace.kv_lens
    pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(qo_lens, kv_lens))
    flops = 4.0 * num_qo_heads * head_dim * pairs
    kv_bytes = 2 * 2 * sum(kv_lens) * num_kv_heads * head_dim
    qo_bytes = sum(qo_lens) * num_qo_heads * (2 * 2 * head_dim + 4)
    index_bytes = 4 * (2 * (trace.batch + 1) + (trace.kv_indptr[-1] if trace.num_pages else 0)
                       + (trace.batch if trace.last_page_len else 0))
    return flops, float(kv_bytes + qo_bytes + index_bytes)


def ragged_trace(qo_lens, prefix_lens) -> Trace:
    """The ragged geometry of sequences with `qo_lens` new tokens after `prefix_lens` cached ones."""
    return Trace(kv_indptr=tuple(cu_seqlens([q + p for q, p in zip(qo_lens, prefix_lens)])),
                 qo_indptr=tuple(cu_seqlens(list(qo_lens))))
