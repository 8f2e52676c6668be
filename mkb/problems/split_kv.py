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


def _scaled_scores_f32(a, b, scale: float):
    """scale * (a @ b^T) for bf16 batches [n, m, d] x [n, k, d] -> float32 [n, m, k], fp32 accumulation, scaled in
    the GEMM's epilogue (one pass over the scores instead of two). CPU baddbmm has no out_dtype: operands upcast
    there (exact). A CUDA torch without baddbmm's out_dtype gets the bf16 GEMM with an fp32 result, then a scale."""
    zero = torch.zeros(1, 1, 1, dtype=torch.float32, device=a.device)
    if not a.is_cuda:
        return torch.baddbmm(zero, a.float(), b.float().transpose(1, 2), beta=0, alpha=scale)
    try:
        return torch.baddbmm(zero, a, b.transpose(1, 2), beta=0, alpha=scale, out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        return _scores_f32(a, b).mul_(scale)


# A row's lse from exp(s) without the max shift is exact to fp32 rounding while exp stays normal: below this (natural
# log) the largest terms near exp's subnormal range (e^-87) lose bits, and an overflow makes the sum infinite.
_UNSHIFTED_MIN_LSE = -60.0


def _unshifted_lse(s):
    """Natural lse of each row of fp32 scores s [..., n], consuming s: log(sum(exp(s))) in three passes over s.

    Why no max shift: torch.logsumexp reads and writes the scores six times (amax, s - max, exp, sum), and at
    problem 06's full size they are ~17 GB of fp32 a call, most of the eager's time (61 ms on the H200,
    events/h200-characterisation-3). exp(s) is as exact as exp(s - max) (more: s - max is itself rounded) as long
    as it neither overflows nor nears the subnormal range; rows outside that range are found by the caller
    (`_lse_in_range`) and recomputed with torch.logsumexp, so the result never depends on the scores' scale.
    """
    return s.exp_().sum(-1).log_()


def _lse_in_range(lse) -> torch.Tensor:
    """A 0-dim bool: every unshifted lse is finite and above _UNSHIFTED_MIN_LSE (no sync; the caller reads it once)."""
    return (torch.isfinite(lse) & (lse > _UNSHIFTED_MIN_LSE)).all()


def split_prefix_prefill_eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *,
                               sm_scale: float, shifted: bool = False):
    """The causal paged-prefill eager baseline with each sequence cut at its prefix: bf16 SDPA over the cached prefix
    (no mask: every new row sees all of it) and over the square block of the new rows (top-left causal, which is
    the bottom-right mask there), merged by their lse, which comes from fp32 scores.

    Why: one SDPA per sequence with torch's lower-right causal bias and GQA, plus an lse over the whole masked
    fp32 score matrix (~16 GB a pass at problem 06's full size: scale, mask and reduce passes), measured 76 ms on
    the H200 (events/h200-characterisation-2), over the 50 ms ceiling of the eager band. Here the masks are plain
    (no bias tensor: flash attention, GQA native) and the prefix's scores are written once, scaled in the GEMM,
    and reduced without torch.logsumexp's max pass (`_unshifted_lse`; 61 ms with it, events/h200-characterisation-3).
    A call whose prefix scores leave exp's exact range (`_lse_in_range`, read once at the end) is computed again
    with the max shift (`shifted=True`). q [total_q, H, D] -> (out bf16 [total_q, H, D], lse base 2 float32 [total_q, H]).
    """
    from mkb.problems.gqa import _causal_lse

    _, page_size, kv_heads, head_dim = k_cache.shape
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    lens = _kv_lens(kvp, None if kv_last_page_len is None else kv_last_page_len.tolist(), page_size)
    out = torch.empty((*q.shape[:2], v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    num_heads = q.shape[1]
    group = num_heads // kv_heads
    in_range = []
    for b, n in enumerate(lens):
        pages = kv_indices[kvp[b] : kvp[b + 1]].long()
        kb = k_cache[pages].reshape(-1, kv_heads, head_dim)[:n].transpose(0, 1)  # [kv_heads, kv_len, D]
        vb = v_cache[pages].reshape(-1, kv_heads, v_cache.shape[-1])[:n].transpose(0, 1)
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)  # [H, q_len, D]
        q_len = qb.shape[1]
        prefix = n - q_len
        gqa = kv_heads != num_heads
        o_d = F.scaled_dot_product_attention(qb[None], kb[None, :, prefix:], vb[None, :, prefix:], is_causal=True,
                                             scale=sm_scale, enable_gqa=gqa)[0]  # [H, q_len, D]
        l_d = _causal_lse(qb, kb[:, prefix:], sm_scale).T * math.log(2.0)  # natural, [H, q_len]
        if prefix == 0:
            o, l_nat = o_d, l_d
        else:
            o_p = F.scaled_dot_product_attention(qb[None], kb[None, :, :prefix], vb[None, :, :prefix], scale=sm_scale,
                                                 enable_gqa=gqa)[0]
            s = _scaled_scores_f32(qb.reshape(kv_heads, group * q_len, head_dim), kb[:, :prefix], sm_scale)
            if shifted:
                l_p = torch.logsumexp(s, dim=-1).view(num_heads, q_len)
            else:
                l_p = _unshifted_lse(s).view(num_heads, q_len)
                in_range.append(_lse_in_range(l_p))
            del s
            l_nat = torch.logaddexp(l_p, l_d)
            o = o_p.float() * torch.exp(l_p - l_nat)[..., None] + o_d.float() * torch.exp(l_d - l_nat)[..., None]
        out[qo[b] : qo[b + 1]] = o.transpose(0, 1).to(q.dtype)
        lse[qo[b] : qo[b + 1]] = (l_nat / math.log(2.0)).T
    if in_range and not bool(torch.stack(in_range).all()):  # the call's one sync: a rare, scale-dependent redo
        return split_prefix_prefill_eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                          sm_scale=sm_scale, shifted=True)
    return out, lse
