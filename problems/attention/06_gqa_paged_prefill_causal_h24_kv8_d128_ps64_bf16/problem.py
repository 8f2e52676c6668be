"""Causal GQA prefill over a paged KV cache (FlashInfer layout), Llama-3.2-3B heads, page size 64.

A batch of sequences each appends qo_len[b] new tokens after a cached prefix (chunked prefill /
prefix caching). The new tokens' K/V are already written into the paged cache, so sequence b's
cache holds kv_len[b] = prefix[b] + qo_len[b] tokens and its queries are the last qo_len[b] of
them. Some sequences have an empty prefix; lengths differ across the batch.

Inputs (bf16 unless stated):
- q                [total_q, 24, 128]: queries of all sequences, ragged; sequence b owns rows
  qo_indptr[b]:qo_indptr[b+1].
- k_cache, v_cache [num_pages, page_size=64, 8, 128]: the page pool (NHD inside a page).
  Pages not listed in kv_indices hold garbage and must not be read.
- qo_indptr        int32 [batch + 1].
- kv_indptr        int32 [batch + 1]: sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]].
- kv_indices       int32 [nnz_pages]: page ids in token order (a shuffled pool, not the identity).
- kv_last_page_len int32 [batch]: rows used in each sequence's last page (1..page_size).
  kv_len[b] = (kv_indptr[b+1] - kv_indptr[b] - 1) * page_size + kv_last_page_len[b];
  token t of sequence b is row t % page_size of page kv_indices[kv_indptr[b] + t // page_size].

GQA: query head h uses kv head h // 3 (24 query heads, 8 kv heads).

Numerics: computed in float32 (float64 for the fp64 anchor). For query row i (0-based within its
sequence) and key t of the same sequence:
  causal mask, aligned bottom-right: key t is visible iff t <= i + (kv_len[b] - qo_len[b]);
  s = (q . k) * sm_scale, sm_scale = 1/sqrt(128); p = softmax over visible keys;
  out[i,h] = sum_t p v[t, h//3]                              -> bf16 [total_q, 24, 128]
  lse[i,h] = log2(sum_visible exp(s))  (base 2, as FlashInfer) -> float32 [total_q, 24]

Sizes: full = 8 sequences, qo_len 128..2048, prefix 0..4096 (fixed); smoke = 3 short ones.
"""

from __future__ import annotations

import math

from mkb.problems import Output, ProblemMeta
from mkb.problems.gqa import (
    paged_prefill_eager,
    paged_prefill_inputs,
    paged_prefill_reference,
    paged_prefill_structure,
    prefill_cost,
)
from mkb.problems.paged import structure_rng

NUMBER = 6
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 24, 8, 128, 64
SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)
# batch, qo_len range, prefix range
_SIZES = {"full": (8, (128, 2048), (64, 4096)), "smoke": (3, (3, 12), (40, 150))}


def _structure(size: str):
    return paged_prefill_structure(structure_rng(NUMBER, size), _SIZES[size], PAGE_SIZE)


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    return paged_prefill_reference(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale=SM_SCALE
    )


def eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """The eager baseline: per sequence, gather its pages and run bf16 SDPA (see `paged_prefill_eager`)."""
    return paged_prefill_eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale=SM_SCALE)


def make_inputs(seed: int, *, device, size: str = "full"):
    qo_lens, pt = _structure(size)
    return paged_prefill_inputs(seed, qo_lens, pt, device=device, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)


_QO_LENS, _PT = _structure("full")
_FLOPS, _BYTES = prefill_cost(
    _QO_LENS, _PT.kv_lens, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
    index_bytes=4 * (2 * len(_PT.indptr) + len(_PT.indices) + _PT.batch),
)
_LENS = (_QO_LENS, _PT.kv_lens)

META = ProblemMeta(
    number=NUMBER,
    name="gqa_paged_prefill_causal_h24_kv8_d128_ps64_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="meta-llama/Llama-3.2-3B-Instruct (served by FlashInfer/vLLM)",
    source_config="num_attention_heads=24, num_key_value_heads=8, head_dim=128; FlashInfer "
    "BatchPrefillWithPagedKVCache layout (NHD pages, CSR page table), page_size=64, causal",
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
