"""GQA decode attention over a paged KV cache (FlashInfer layout), Llama 3.1 8B heads, page size 1.

One new query token per sequence attends to that sequence's whole KV cache, as upstream MetaKernelBench
states it (FlashInfer-Trace definition gqa_paged_decode_h32_kv8_d128_ps1).

Inputs (bf16 unless stated):
- q                [batch, 32, 128]: the query of each sequence's new token.
- k_cache, v_cache [num_pages, 1, 8, 128]: the page pool (NHD inside a page); unlisted pages hold garbage.
- kv_indptr        int32 [batch + 1]: sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]] (captured, fixed).
- kv_indices       int32 [nnz_pages]: page ids in token order, redrawn on every draw (the first nnz entries of
  a random permutation of the pool).
  Page size 1: kv_len[b] = kv_indptr[b+1] - kv_indptr[b]; token t of sequence b is page
  kv_indices[kv_indptr[b] + t].
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
from mkb.problems.gqa import Trace, decode_cost, decode_eager, decode_inputs, decode_reference

NUMBER = 1
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 1
SM_SCALE = 0.0883883461356163
KV_INDPTR = (0, 542, 1067, 1637, 2236, 3014, 3538, 4063, 4576, 5134, 5652, 6168, 6723, 7234, 7754, 8281, 9129, 9707,
             12277, 15364, 16907, 19227, 21549, 23026, 24599, 26116, 26643, 27348, 27869, 28398, 28921, 29459, 29975,
             30499, 31031, 31549, 32469, 33110, 33799, 34316, 34832, 35354, 35905, 36437, 36974, 39857, 43029, 43851,
             44373, 45273, 45915, 46427, 46950, 47501, 49996, 50527, 52650, 54239, 55046, 55603, 56118, 56966, 57882,
             58391, 58966)
TRACES = {
    "full": Trace(kv_indptr=KV_INDPTR, page_size=PAGE_SIZE, num_pages=68237),
    "smoke": Trace(kv_indptr=(0, 5, 12, 40), page_size=PAGE_SIZE, num_pages=64),
}


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    return decode_reference(q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale=sm_scale)


def eager(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    """The eager baseline: bf16 SDPA per kv head's query group, lse from fp32 scores (see `decode_eager`)."""
    return decode_eager(q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale=sm_scale)


def make_inputs(seed: int, *, device, size: str = "full"):
    return decode_inputs(seed, TRACES[size], device=device, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS,
                         head_dim=HEAD_DIM, sm_scale=SM_SCALE)


_FLOPS, _BYTES = decode_cost(TRACES["full"], num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)
_TOKENS = sum(TRACES["full"].kv_lens)

META = ProblemMeta(
    number=NUMBER,
    name="gqa_paged_decode_h32_kv8_d128_ps1_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="meta-llama/Llama-3.1-8B-Instruct (FlashInfer-Trace record 5444fc56)",
    source_config="num_qo_heads=32, num_kv_heads=8, head_dim=128; FlashInfer BatchDecodeWithPagedKVCache layout "
    "(NHD pages, CSR page table), page_size=1",
    inputs=("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("kv_indices",),
    fixed_inputs=("kv_indptr",),
    peak="memory",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/01_gqa_paged_decode_h32_kv8_d128_ps1_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: {TRACES['full'].batch} sequences, {_TOKENS} cached tokens in a pool of {TRACES['full'].num_pages} "
    "pages. flops = 4*H*D*sum(kv_len); bytes = referenced KV + q + out + lse + page table (spare pages not "
    "counted). lse is base 2. Eager baseline: bf16 torch SDPA (padded batch, or per sequence where padding would "
    "gather more than 4x the real KV), lse from fp32 scores on the side.",
)
