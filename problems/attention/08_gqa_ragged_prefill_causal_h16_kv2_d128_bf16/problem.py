"""Causal GQA prefill over ragged (unpaged) Q and KV, Qwen3 32B at TP=4 heads.

Each sequence has qo_len[b] new tokens after a cached prefix: kv_len[b] = prefix[b] + qo_len[b], packed
ragged (FlashInfer BatchPrefillWithRaggedKVCache), as upstream MetaKernelBench states it (FlashInfer-Trace
definition gqa_ragged_prefill_causal_h16_kv2_d128: captured query lengths, upstream's authored prefixes).

Inputs (bf16 unless stated):
- q     [total_q, 16, 128]:  sequence b owns rows qo_indptr[b]:qo_indptr[b+1].
- k, v  [total_kv, 2, 128]: sequence b owns rows kv_indptr[b]:kv_indptr[b+1].
- qo_indptr, kv_indptr int32 [batch + 1] (cu_seqlens; fixed, as upstream's: only values are redrawn).
- sm_scale float.

GQA: query head h uses kv head h // 8.

Numerics: computed in float32 (float64 for the fp64 anchor). Causal mask aligned bottom-right: query row i
sees key t iff t <= i + (kv_len[b] - qo_len[b]); sm_scale = 0.08838834764831843 (the captured scale).
  out = softmax(s) v over visible keys -> bf16 [total_q, 16, 128]
  lse = log2(sum over visible keys of exp(s)) (base 2) -> float32 [total_q, 16]

Sizes: full = upstream's lengths; smoke = 3 short sequences.
"""

from __future__ import annotations

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.gqa import prefill_cost, ragged_prefill_eager, ragged_prefill_inputs, ragged_prefill_reference, ragged_trace

NUMBER = 8
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 16, 2, 128
SM_SCALE = 0.08838834764831843
Q_LENS = (133, 181, 9, 8, 14, 43, 24, 29, 2383, 2678, 314, 14, 420, 134, 4, 15, 43, 2024, 23, 1618, 1086, 300, 49, 7,
          340, 422, 1, 68, 18, 7, 74, 3, 20, 21, 12, 31, 3, 7, 21, 40, 14, 107, 11, 6, 30, 9, 26, 24, 301, 266, 247, 75,
          49, 23, 9, 4, 441, 15, 349, 27, 14, 17, 54, 6, 13, 8, 147, 8, 7, 9, 730)
PREFIX_LENS = (0, 64, 17, 39, 5, 58, 26, 44, 11, 0, 33, 61, 8, 22, 49, 0, 14, 55, 30, 3, 41, 64, 19, 7, 36, 0, 52, 24,
               60, 13, 28, 46, 1, 0, 57, 20, 35, 9, 63, 42, 16, 0, 50, 27, 4, 38, 59, 23, 12, 45, 0, 31, 54, 18, 6, 40,
               62, 29, 15, 48, 0, 34, 21, 51, 10, 56, 2, 43, 25, 37, 0)
TRACES = {"full": ragged_trace(Q_LENS, PREFIX_LENS), "smoke": ragged_trace((5, 9, 3), (0, 7, 2))}


def reference(q, k, v, qo_indptr, kv_indptr, sm_scale):
    return ragged_prefill_reference(q, k, v, qo_indptr, kv_indptr, sm_scale=sm_scale)


def eager(q, k, v, qo_indptr, kv_indptr, sm_scale):
    """The eager baseline: per sequence, bf16 SDPA on its ragged slices (see `ragged_prefill_eager`)."""
    return ragged_prefill_eager(q, k, v, qo_indptr, kv_indptr, sm_scale=sm_scale)


def make_inputs(seed: int, *, device, size: str = "full"):
    return ragged_prefill_inputs(seed, TRACES[size], device=device, num_qo_heads=NUM_QO_HEADS,
                                 num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, sm_scale=SM_SCALE)


_FLOPS, _BYTES = prefill_cost(TRACES["full"], num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)

META = ProblemMeta(
    number=NUMBER,
    name="gqa_ragged_prefill_causal_h16_kv2_d128_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="Qwen/Qwen3-32B at TP=4 (FlashInfer-Trace record 560c22ab)",
    source_config="num_qo_heads=16, num_kv_heads=2, head_dim=128; FlashInfer BatchPrefillWithRaggedKVCache, "
    "causal, sm_scale=0.08838834764831843",
    inputs=("q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    fixed_inputs=("qo_indptr", "kv_indptr"),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/08_gqa_ragged_prefill_causal_h16_kv2_d128_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: {TRACES['full'].batch} sequences, {sum(TRACES['full'].qo_lens)} query rows, "
    f"{sum(TRACES['full'].kv_lens)} keys. flops count visible query-key pairs only. lse is base 2. Eager baseline: "
    "per sequence, bf16 torch SDPA with a bottom-right causal mask; lse from fp32 scores on the side.",
)
