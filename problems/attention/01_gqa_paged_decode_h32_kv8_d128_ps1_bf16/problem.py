"""GQA decode attention over a paged KV cache (FlashInfer layout), Llama-3.1-8B heads, page size 1.

One new query token per sequence attends to that sequence's whole KV cache (no mask inside a
sequence: the cache holds exactly the tokens the query may see, the query's own token included).

Inputs (bf16 unless stated):
- q                [batch, 32, 128]: the query of each sequence's new token.
- k_cache, v_cache [num_pages, page_size=1, 8, 128]: the page pool (NHD layout inside a page).
  Pages not listed in kv_indices hold garbage and must not be read.
- kv_indptr        int32 [batch + 1]: sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]].
- kv_indices       int32 [nnz_pages]: page ids, in token order (not the identity permutation).
- kv_last_page_len int32 [batch]: rows used in the last page of each sequence (1..page_size).
  kv_len[b] = (kv_indptr[b+1] - kv_indptr[b] - 1) * page_size + kv_last_page_len[b];
  token t of sequence b is row t % page_size of page kv_indices[kv_indptr[b] + t // page_size].

GQA: query head h uses kv head h // 4 (32 query heads share 8 kv heads in groups of 4).

Numerics: computed in float32 (float64 for the fp64 anchor).
  s[b,h,t] = (q[b,h] . k[b,t,h//4]) * sm_scale, sm_scale = 1/sqrt(128);
  out[b,h] = sum_t softmax_t(s[b,h,:]) v[b,t,h//4]            -> bf16 [batch, 32, 128]
  lse[b,h] = log2(sum_t exp(s[b,h,t]))  (base 2, as FlashInfer)  -> float32 [batch, 32]

Sizes: full = 64 sequences with KV lengths 128..8192 (log-uniform, fixed); smoke = 3 short ones.
"""

from __future__ import annotations

import math

from mkb.problems import Output, ProblemMeta
from mkb.problems.gqa import (
    decode_cost,
    decode_eager,
    decode_inputs,
    decode_reference,
    decode_structure,
)
from mkb.problems.paged import PageTable, structure_rng

NUMBER = 1
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 1
SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)
_SIZES = {"full": (64, 128, 8192), "smoke": (3, 5, 40)}  # batch, min kv_len, max kv_len


def _structure(size: str) -> PageTable:
    return decode_structure(structure_rng(NUMBER, size), _SIZES[size], PAGE_SIZE)


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len):
    return decode_reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=SM_SCALE)


def eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len):
    """The eager baseline: bf16 SDPA over a padded batch gathered page by page (see `decode_eager`)."""
    return decode_eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=SM_SCALE)


def make_inputs(seed: int, *, device, size: str = "full"):
    return decode_inputs(seed, _structure(size), device=device, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)


_PT = _structure("full")
_FLOPS, _BYTES = decode_cost(_PT, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)
_TOKENS = sum(_PT.kv_lens)

META = ProblemMeta(
    number=1,
    name="gqa_paged_decode_h32_kv8_d128_ps1_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="meta-llama/Llama-3.1-8B-Instruct (served by FlashInfer/vLLM)",
    source_config="num_attention_heads=32, num_key_value_heads=8, head_dim=128; FlashInfer "
    "BatchDecodeWithPagedKVCache layout (NHD pages, CSR page table), page_size=1",
    inputs=("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("kv_indptr", "kv_indices", "kv_last_page_len"),
    peak="memory",
    notes=f"full: 64 sequences, kv_len 128..8192 log-uniform, {_TOKENS} cached tokens, 25% spare "
    "pages in a shuffled pool. flops = 4*H*D*sum(kv_len); bytes = referenced KV pages + q + out + "
    "lse + page table (spare pages not counted). lse is base 2 (FlashInfer convention). "
    "Eager baseline: bf16 torch SDPA over a padded batch gathered page by page (each kv head's query "
    "group as query rows, a boolean padding mask); lse from fp32 scores (a bf16 GEMM with fp32 "
    "result) on the side.",
)
