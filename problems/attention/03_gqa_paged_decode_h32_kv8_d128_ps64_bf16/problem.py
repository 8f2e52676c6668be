"""GQA decode attention over a paged KV cache (FlashInfer layout), Llama 3.1 8B heads, page size 64.

One new query token per sequence attends to that sequence's whole KV cache, as upstream MetaKernelBench
states it (FlashInfer-Trace definition gqa_paged_decode_h32_kv8_d128_ps64).

Inputs (bf16 unless stated):
- q                [batch, 32, 128]: the query of each sequence's new token.
- k_cache, v_cache [num_pages, 64, 8, 128]: the page pool (NHD inside a page); unlisted pages hold garbage.
- kv_indptr        int32 [batch + 1]: sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]] (captured, fixed).
- kv_indices       int32 [nnz_pages]: page ids in token order, redrawn on every draw (the first nnz entries of
  a random permutation of the pool).
- kv_last_page_len int32 [batch]: rows used in each sequence's last page (the captured values, all 1).
  kv_len[b] = (kv_indptr[b+1] - kv_indptr[b] - 1) * 64 + kv_last_page_len[b]; token t of sequence b
  is row t % 64 of page kv_indices[kv_indptr[b] + t // 64].
- sm_scale         float: the captured softmax scale.

GQA: query head h uses kv head h // 4.

Numerics: computed in float32 (float64 for the fp64 anchor).
  s[b,h,t] = (q[b,h] . k[b,t,h//4]) * sm_scale
  out[b,h] = sum_t softmax_t(s[b,h,:]) v[b,t,h//4]       -> bf16 [batch, 32, 128]
  lse[b,h] = log2(sum_t exp(s[b,h,t]))  (base 2, as FlashInfer) -> float32 [batch, 32]

Sizes: full = the captured trace (upstream's); smoke = 3 short sequences in a small pool.
"""

from __future__ import annotations

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.gqa import Trace, decode_cost, decode_inputs, decode_reference
from mkb.problems.split_kv import split_kv_decode_eager

NUMBER = 3
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 64
SM_SCALE = 0.08838834764831843
KV_INDPTR = (0, 46, 75, 149, 252, 534, 562, 591, 608, 670, 692, 712, 771, 786, 810, 841, 1193, 1275, 3349, 5940, 6987,
             8811, 10637, 11618, 12695, 13716, 13747, 13956, 13981, 14014, 14041, 14083, 14103, 14131, 14167, 14189,
             14613, 14758, 14951, 14972, 14992, 15018, 15073, 15109, 15150, 17537, 20213, 20539, 20565, 20969, 21115,
             21131, 21158, 21213, 23212, 23247, 24874, 25967, 26278, 26339, 26358, 26710, 27130, 27143, 27222)
TRACES = {
    "full": Trace(kv_indptr=KV_INDPTR, page_size=PAGE_SIZE, num_pages=29441, last_page_len=(1,) * 64),
    "smoke": Trace(kv_indptr=(0, 1, 3, 4), page_size=PAGE_SIZE, num_pages=8, last_page_len=(5, 64, 1)),
}


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    return decode_reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=sm_scale)


def eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    """The eager baseline: split-KV bf16 SDPA over 4096-token chunks of every sequence, merged by their lse (fp32
    scores), see `mkb.problems.split_kv`: the trace's few 100k-token sequences left a per-sequence SDPA at 99 ms
    on the H200, over the 50 ms ceiling of the eager band, with 8 thread blocks per long sequence."""
    return split_kv_decode_eager(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=sm_scale)


def make_inputs(seed: int, *, device, size: str = "full"):
    return decode_inputs(seed, TRACES[size], device=device, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS,
                         head_dim=HEAD_DIM, sm_scale=SM_SCALE)


_FLOPS, _BYTES = decode_cost(TRACES["full"], num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)
_TOKENS = sum(TRACES["full"].kv_lens)

META = ProblemMeta(
    number=NUMBER,
    name="gqa_paged_decode_h32_kv8_d128_ps64_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="meta-llama/Llama-3.1-8B-Instruct (FlashInfer-Trace record 8c88a86f)",
    source_config="num_qo_heads=32, num_kv_heads=8, head_dim=128; FlashInfer BatchDecodeWithPagedKVCache layout "
    "(NHD pages, CSR page table), page_size=64",
    inputs=("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("kv_indices",),
    fixed_inputs=("kv_indptr", "kv_last_page_len"),
    peak="memory",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/03_gqa_paged_decode_h32_kv8_d128_ps64_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: {TRACES['full'].batch} sequences, {_TOKENS} cached tokens in a pool of {TRACES['full'].num_pages} "
    "pages. flops = 4*H*D*sum(kv_len); bytes = referenced KV + q + out + lse + page table (spare pages not "
    "counted). lse is base 2. Eager baseline: split-KV bf16 torch SDPA over 4096-token chunks of every sequence "
    "(one padded batch of chunks), lse from fp32 scores on the side, chunks merged by their lse "
    "(mkb.problems.split_kv); the per-sequence SDPA it replaces measured 99 ms on the H200.",
)
