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

from mkb.problems import Output, ProblemMeta
from mkb.problems.gqa import (
    prefill_cost,
    prefill_lengths,
    ragged_prefill_eager,
    ragged_prefill_inputs,
    ragged_prefill_reference,
)
from mkb.problems.paged import structure_rng

NUMBER = 8
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 16, 2, 128
SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)
# batch, qo_len range, prefix range
_SIZES = {"full": (8, (256, 4096), (64, 4096)), "smoke": (3, (3, 12), (2, 20))}


def _structure(size: str):
    return prefill_lengths(structure_rng(NUMBER, size), _SIZES[size])


def reference(q, k, v, qo_indptr, kv_indptr):
    return ragged_prefill_reference(q, k, v, qo_indptr, kv_indptr, sm_scale=SM_SCALE)


def eager(q, k, v, qo_indptr, kv_indptr):
    """The eager baseline: per sequence, bf16 SDPA on its ragged slices (see `ragged_prefill_eager`)."""
    return ragged_prefill_eager(q, k, v, qo_indptr, kv_indptr, sm_scale=SM_SCALE)


def make_inputs(seed: int, *, device, size: str = "full"):
    qo_lens, kv_lens = _structure(size)
    return ragged_prefill_inputs(seed, qo_lens, kv_lens, device=device, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)


_LENS = _structure("full")
_FLOPS, _BYTES = prefill_cost(*_LENS, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, index_bytes=8 * (len(_LENS[0]) + 1))

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
