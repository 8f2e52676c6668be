"""Causal GQA prefill over a paged KV cache (FlashInfer layout), Qwen3-14B heads at TP 8, page size 1.

A batch of sequences each appends qo_len[b] new tokens after a cached prefix (chunked prefill /
prefix caching). The new tokens' K/V are already written into the paged cache, so sequence b's
cache holds kv_len[b] = prefix[b] + qo_len[b] tokens and its queries are the last qo_len[b] of
them. Some sequences have an empty prefix; lengths differ across the batch.

Inputs (bf16 unless stated):
- q                [total_q, 5, 128]: queries of all sequences, ragged; sequence b owns rows
  qo_indptr[b]:qo_indptr[b+1].
- k_cache, v_cache [num_pages, page_size=1, 1, 128]: the page pool (NHD inside a page).
  Pages not listed in kv_indices hold garbage and must not be read.
- qo_indptr        int32 [batch + 1].
- kv_indptr        int32 [batch + 1]: sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]].
- kv_indices       int32 [nnz_pages]: page ids in token order (a shuffled pool, not the identity).
- kv_last_page_len int32 [batch]: rows used in each sequence's last page (1..page_size).
  kv_len[b] = (kv_indptr[b+1] - kv_indptr[b] - 1) * page_size + kv_last_page_len[b];
  token t of sequence b is row t % page_size of page kv_indices[kv_indptr[b] + t // page_size].

GQA: all 5 query heads share the single kv head (Qwen3-14B: 40 q / 8 kv heads over 8 GPUs).

Numerics: computed in float32 (float64 for the fp64 anchor). For query row i (0-based within its
sequence) and key t of the same sequence:
  causal mask, aligned bottom-right: key t is visible iff t <= i + (kv_len[b] - qo_len[b]);
  s = (q . k) * sm_scale, sm_scale = 1/sqrt(128); p = softmax over visible keys;
  out[i,h] = sum_t p v[t, 0]                              -> bf16 [total_q, 5, 128]
  lse[i,h] = log2(sum_visible exp(s))  (base 2, as FlashInfer) -> float32 [total_q, 5]

Sizes: full = 16 sequences, qo_len 128..4096, prefix 0..8192 (fixed); smoke = 3 short ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from mkb.problems import Output, ProblemMeta
from mkb.problems.paged import cu_seqlens, draw_lengths, page_table, structure_rng

NUMBER = 5
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 5, 1, 128, 1
SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)
# batch, qo_len range, prefix range
_SIZES = {"full": (16, (128, 4096), (64, 8192)), "smoke": (3, (3, 12), (2, 20))}


def _structure(size: str):
    batch, (qlo, qhi), (plo, phi) = _SIZES[size]
    rng = structure_rng(NUMBER, size)
    qo_lens = draw_lengths(rng, batch, qlo, qhi)
    prefix = draw_lengths(rng, batch, plo, phi)
    prefix[0] = 0  # one plain prefill (no cached prefix)
    kv_lens = [p + q for p, q in zip(prefix, qo_lens)]
    return qo_lens, page_table(rng, kv_lens, PAGE_SIZE)


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    dt = torch.promote_types(q.dtype, torch.float32)
    _, num_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    k_flat = k_cache.reshape(-1, kv_heads, head_dim)
    v_flat = v_cache.reshape(-1, kv_heads, head_dim)
    qo, kvp, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    out = torch.empty(q.shape, dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].to(dt)
        q_len = qb.shape[0]
        pages = kv_indices[kvp[b] : kvp[b + 1]].long()
        kv_len = (pages.numel() - 1) * page_size + last[b]
        rows = torch.arange(page_size, device=q.device)
        slot = (pages[:, None] * page_size + rows[None, :]).reshape(-1)[:kv_len]
        kb, vb = k_flat[slot].to(dt), v_flat[slot].to(dt)  # [kv_len, kv_heads, head_dim]
        s = torch.einsum("qhgd,khd->hgqk", qb.view(q_len, kv_heads, group, head_dim), kb) * SM_SCALE
        i = torch.arange(q_len, device=q.device)[:, None]
        t = torch.arange(kv_len, device=q.device)[None, :]
        s = s.masked_fill(t > i + (kv_len - q_len), float("-inf"))
        m = torch.logsumexp(s, dim=-1)  # [kv_heads, group, q_len]
        p = torch.exp(s - m[..., None])
        ob = torch.einsum("hgqk,khd->qhgd", p, vb)
        out[qo[b] : qo[b + 1]] = ob.reshape(q_len, num_heads, head_dim)
        lse[qo[b] : qo[b + 1]] = m.reshape(num_heads, q_len).T
    return out.to(q.dtype), lse / math.log(2.0)


def _scores_f32(a, b):
    """a @ b^T for bf16 batches [n, m, d] x [n, k, d] -> float32 [n, m, k] with fp32 accumulation.

    The lse output is float32 and judged at fp32 precision, so scores rounded to bf16 would not do.
    On CUDA this is one tensor-core GEMM with an fp32 result (bmm's out_dtype); CPU bmm has no
    out_dtype, so the operands are upcast there (the products of bf16 values are exact either way).
    """
    if a.is_cuda:
        return torch.bmm(a, b.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float().transpose(1, 2))


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


def eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """The eager baseline: per sequence (a batch of a few), gather its pages and run bf16 SDPA.

    The bottom-right causal mask is torch's `causal_lower_right` bias (flash or memory-efficient
    attention on the GPU, GQA native); lse comes from fp32 scores on the side.
    """
    _, num_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    qo, kvp, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        pages = kv_indices[kvp[b] : kvp[b + 1]].long()
        kv_len = (pages.numel() - 1) * page_size + last[b]
        kb = k_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].transpose(0, 1)  # [kv_heads, kv_len, D]
        vb = v_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].transpose(0, 1)
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)  # [H, q_len, D]
        mask = causal_lower_right(qb.shape[1], kv_len)
        ob = F.scaled_dot_product_attention(qb[None], kb[None], vb[None], attn_mask=mask, scale=SM_SCALE, enable_gqa=True)
        out[qo[b] : qo[b + 1]] = ob[0].transpose(0, 1)
        lse[qo[b] : qo[b + 1]] = _causal_lse(qb, kb, SM_SCALE)
    return out, lse


def make_inputs(seed: int, *, device, size: str = "full"):
    qo_lens, pt = _structure(size)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    q = randn(sum(qo_lens), NUM_QO_HEADS, HEAD_DIM)
    k_cache = randn(pt.num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
    v_cache = randn(pt.num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    qo_indptr = i32(cu_seqlens(qo_lens))
    return q, k_cache, v_cache, qo_indptr, i32(pt.indptr), i32(pt.indices), i32(pt.last_page_len)


def _cost():
    qo_lens, pt = _structure("full")
    pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(qo_lens, pt.kv_lens))
    flops = 4.0 * NUM_QO_HEADS * HEAD_DIM * pairs
    kv_bytes = 2 * 2 * sum(pt.kv_lens) * NUM_KV_HEADS * HEAD_DIM
    qo_bytes = sum(qo_lens) * NUM_QO_HEADS * (2 * 2 * HEAD_DIM + 4)
    idx_bytes = 4 * (2 * len(pt.indptr) + len(pt.indices) + pt.batch)
    return flops, float(kv_bytes + qo_bytes + idx_bytes), (qo_lens, pt.kv_lens)


_FLOPS, _BYTES, _LENS = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="gqa_paged_prefill_causal_h5_kv1_d128_ps1_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="Qwen/Qwen3-14B at tensor-parallel 8 (served by FlashInfer/vLLM)",
    source_config="num_attention_heads=40, num_key_value_heads=8, head_dim=128, TP=8 -> 5 q / 1 kv "
    "heads per GPU; FlashInfer "
    "BatchPrefillWithPagedKVCache layout (NHD pages, CSR page table), page_size=1, causal",
    inputs=("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"),
    peak="bf16_tc",
    notes=f"full: (qo_len, kv_len) = {list(zip(*_LENS))}. flops count only unmasked (visible) "
    "query-key pairs: 4*H*D*sum_b(qo*(kv-qo) + qo*(qo+1)/2). bytes = referenced KV + q + out + lse "
    "+ index tensors. Causal mask aligned bottom-right; lse base 2. "
    "Eager baseline: per sequence, bf16 torch SDPA with the causal_lower_right bias (enable_gqa), "
    "pages gathered per sequence; lse from fp32 scores (a bf16 GEMM with fp32 result) on the side.",
)
