"""Causal GQA prefill over ragged (unpaged) Q and KV, Llama-3.1-70B heads at tensor-parallel 4.

A batch of sequences each has qo_len[b] new tokens and kv_len[b] = prefix[b] + qo_len[b] keys
(the prefix came from a cache and was copied in front of the new keys; some prefixes are empty).
Everything is packed ragged, FlashInfer BatchPrefillWithRaggedKVCache / FlashAttention varlen style.

Inputs (bf16 unless stated):
- q     [total_q, 16, 128]:  sequence b owns rows qo_indptr[b]:qo_indptr[b+1].
- k, v  [total_kv, 2, 128]:  sequence b owns rows kv_indptr[b]:kv_indptr[b+1].
- qo_indptr, kv_indptr int32 [batch + 1] (cu_seqlens).

GQA: query head h uses kv head h // 8 (16 query heads, 2 kv heads).

Numerics: computed in float32 (float64 for the fp64 anchor). For query row i (0-based within its
sequence) and key t of the same sequence:
  causal mask, aligned bottom-right: key t is visible iff t <= i + (kv_len[b] - qo_len[b]);
  s = (q . k) * sm_scale, sm_scale = 1/sqrt(128); p = softmax over visible keys;
  out[i,h] = sum_t p v[t, h//8]                               -> bf16 [total_q, 16, 128]
  lse[i,h] = log2(sum_visible exp(s))  (base 2, as FlashInfer) -> float32 [total_q, 16]

Sizes: full = 8 sequences, qo_len 256..4096, prefix 0..4096 (fixed); smoke = 3 short ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from mkb.problems import Output, ProblemMeta
from mkb.problems.paged import cu_seqlens, draw_lengths, structure_rng

NUMBER = 8
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 16, 2, 128
SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)
# batch, qo_len range, prefix range
_SIZES = {"full": (8, (256, 4096), (64, 4096)), "smoke": (3, (3, 12), (2, 20))}


def _structure(size: str):
    batch, (qlo, qhi), (plo, phi) = _SIZES[size]
    rng = structure_rng(NUMBER, size)
    qo_lens = draw_lengths(rng, batch, qlo, qhi)
    prefix = draw_lengths(rng, batch, plo, phi)
    prefix[0] = 0  # one plain prefill (no prefix)
    return qo_lens, [p + q for p, q in zip(prefix, qo_lens)]


def reference(q, k, v, qo_indptr, kv_indptr):
    dt = torch.promote_types(q.dtype, torch.float32)
    _, num_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = num_heads // kv_heads
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty(q.shape, dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].to(dt)
        kb, vb = k[kvp[b] : kvp[b + 1]].to(dt), v[kvp[b] : kvp[b + 1]].to(dt)
        q_len, kv_len = qb.shape[0], kb.shape[0]
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


def eager(q, k, v, qo_indptr, kv_indptr):
    """The eager baseline: per sequence (a batch of a few), bf16 SDPA on its ragged slices.

    The bottom-right causal mask is torch's `causal_lower_right` bias (flash or memory-efficient
    attention on the GPU, GQA native); lse comes from fp32 scores on the side.
    """
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty((*q.shape[:2], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)  # [H, q_len, D]
        kb, vb = k[kvp[b] : kvp[b + 1]].transpose(0, 1), v[kvp[b] : kvp[b + 1]].transpose(0, 1)
        mask = causal_lower_right(qb.shape[1], kb.shape[1])
        ob = F.scaled_dot_product_attention(qb[None], kb[None], vb[None], attn_mask=mask, scale=SM_SCALE,
                                            enable_gqa=kb.shape[0] != qb.shape[0])
        out[qo[b] : qo[b + 1]] = ob[0].transpose(0, 1)
        lse[qo[b] : qo[b + 1]] = _causal_lse(qb, kb, SM_SCALE)
    return out, lse


def make_inputs(seed: int, *, device, size: str = "full"):
    qo_lens, kv_lens = _structure(size)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    q = randn(sum(qo_lens), NUM_QO_HEADS, HEAD_DIM)
    k = randn(sum(kv_lens), NUM_KV_HEADS, HEAD_DIM)
    v = randn(sum(kv_lens), NUM_KV_HEADS, HEAD_DIM)

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    return q, k, v, i32(cu_seqlens(qo_lens)), i32(cu_seqlens(kv_lens))


def _cost():
    qo_lens, kv_lens = _structure("full")
    pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(qo_lens, kv_lens))
    flops = 4.0 * NUM_QO_HEADS * HEAD_DIM * pairs
    kv_bytes = 2 * 2 * sum(kv_lens) * NUM_KV_HEADS * HEAD_DIM
    qo_bytes = sum(qo_lens) * NUM_QO_HEADS * (2 * 2 * HEAD_DIM + 4)
    return flops, float(kv_bytes + qo_bytes + 8 * (len(qo_lens) + 1)), (qo_lens, kv_lens)


_FLOPS, _BYTES, _LENS = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="gqa_ragged_prefill_causal_h16_kv2_d128_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="meta-llama/Llama-3.1-70B-Instruct at tensor-parallel 4 (served by FlashInfer/vLLM)",
    source_config="num_attention_heads=64, num_key_value_heads=8, head_dim=128, TP=4 -> 16 q / 2 kv "
    "heads per GPU; FlashInfer BatchPrefillWithRaggedKVCache layout (NHD, indptr), causal",
    inputs=("q", "k", "v", "qo_indptr", "kv_indptr"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("qo_indptr", "kv_indptr"),
    peak="bf16_tc",
    notes=f"full: (qo_len, kv_len) = {list(zip(*_LENS))}. flops count only unmasked (visible) "
    "query-key pairs: 4*H*D*sum_b(qo*(kv-qo) + qo*(qo+1)/2). Causal mask aligned bottom-right; "
    "lse base 2. "
    "Eager baseline: per sequence, bf16 torch SDPA with the causal_lower_right bias (enable_gqa); lse "
    "from fp32 scores (a bf16 GEMM with fp32 result) on the side.",
)
