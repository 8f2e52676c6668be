"""Causal GQA prefill over a paged KV cache (FlashInfer layout), Llama 3.2 3B heads, page size 64.

Each sequence's qo_len[b] new query tokens are the last qo_len[b] of its kv_len[b] cached tokens, as upstream
MetaKernelBench states it (FlashInfer-Trace definition gqa_paged_prefill_causal_h24_kv8_d128_ps64).

Inputs (bf16 unless stated):
- q                [total_q, 24, 128]: sequence b owns rows qo_indptr[b]:qo_indptr[b+1].
- k_cache, v_cache [num_pages, 64, 8, 128]: the page pool (NHD inside a page); unlisted pages hold garbage.
- qo_indptr, kv_indptr int32 [batch + 1]: query rows and pages per sequence (captured, fixed) (the captured kv_indptr equals qo_indptr).
- kv_indices       int32 [nnz_pages]: page ids in token order, redrawn on every draw (the first nnz entries of
  a random permutation of the pool).
- kv_last_page_len int32 [batch]: rows used in each sequence's last page (captured, all 1):
  kv_len[b] = (pages - 1) * 64 + kv_last_page_len[b]; token t is row t % 64 of page
  kv_indices[kv_indptr[b] + t // 64].
- sm_scale         float: the captured softmax scale.

GQA: query head h uses kv head h // 3.

Numerics: computed in float32 (float64 for the fp64 anchor). Causal mask aligned bottom-right: query row i
(0-based in its sequence) sees key t iff t <= i + (kv_len[b] - qo_len[b]).
  s = (q . k) * sm_scale; out = softmax(s) v over visible keys -> bf16 [total_q, 24, 128]
  lse = log2(sum over visible keys of exp(s)) (base 2)        -> float32 [total_q, 24]

Sizes: full = the captured trace (upstream's); smoke = 3 short sequences in a small pool.
"""

from __future__ import annotations

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.gqa import Trace, paged_prefill_inputs, paged_prefill_reference, prefill_cost
from mkb.problems.split_kv import split_prefix_prefill_eager

NUMBER = 6
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 24, 8, 128, 64
SM_SCALE = 0.08838834764831843
QO_INDPTR = (0, 206, 373, 612, 836, 1112, 1442, 1938, 2411, 2963, 3408, 3939, 4463, 4999, 5601, 6069)
TRACES = {
    "full": Trace(kv_indptr=QO_INDPTR, qo_indptr=QO_INDPTR, page_size=PAGE_SIZE, num_pages=32757, last_page_len=(1,) * 15),
    "smoke": Trace(kv_indptr=(0, 3, 7, 9), qo_indptr=(0, 3, 7, 9), page_size=PAGE_SIZE, num_pages=12, last_page_len=(1, 40, 64)),
}


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    return paged_prefill_reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale=sm_scale)


def eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    """The eager baseline: per sequence, bf16 SDPA over its cached prefix and over its new rows' causal square, merged
    by their lse from fp32 scores (`mkb.problems.split_kv.split_prefix_prefill_eager`; one lower-right-masked SDPA
    per sequence with an lse over all its masked scores measured 76 ms on the H200, the split with torch.logsumexp
    over the prefix's ~17 GB of fp32 scores 61 ms; the prefix lse is now summed without the max pass)."""
    return split_prefix_prefill_eager(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                      sm_scale=sm_scale)


def make_inputs(seed: int, *, device, size: str = "full"):
    return paged_prefill_inputs(seed, TRACES[size], device=device, num_qo_heads=NUM_QO_HEADS,
                                num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, sm_scale=SM_SCALE)


_FLOPS, _BYTES = prefill_cost(TRACES["full"], num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)

META = ProblemMeta(
    number=NUMBER,
    name="gqa_paged_prefill_causal_h24_kv8_d128_ps64_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="meta-llama/Llama-3.2-3B-Instruct (FlashInfer-Trace record 022ad0c2)",
    source_config="num_qo_heads=24, num_kv_heads=8, head_dim=128; FlashInfer BatchPrefillWithPagedKVCache "
    "layout (NHD pages, CSR page table), page_size=64, causal",
    inputs=("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("kv_indices",),
    fixed_inputs=("qo_indptr", "kv_indptr", "kv_last_page_len"),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/06_gqa_paged_prefill_causal_h24_kv8_d128_ps64_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: {TRACES['full'].batch} sequences, {sum(TRACES['full'].qo_lens)} query rows, "
    f"{sum(TRACES['full'].kv_lens)} cached tokens in a pool of {TRACES['full'].num_pages} pages. flops count "
    "visible query-key pairs only (4*H*D per pair). lse is base 2. Eager baseline: per sequence, bf16 torch SDPA "
    "over the cached prefix (no mask) and over the new rows' causal square, merged by their lse from fp32 scores "
    "(the prefix's summed as log(sum(exp(s))) without torch.logsumexp's max pass, a call outside exp's exact range "
    "redone with it; mkb.problems.split_kv).",
)
