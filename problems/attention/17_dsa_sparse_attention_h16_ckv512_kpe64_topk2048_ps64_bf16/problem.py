"""DeepSeek Sparse Attention (DSA) decode: MLA over at most 2048 selected cache tokens, DeepSeek-V3.2 at TP 8.

DeepSeek-V3.2's lightning indexer picks, for each query token, at most 2048 cached tokens (problem 18);
the main attention then runs MLA in its weight-absorbed MQA form over only those tokens, as upstream
MetaKernelBench states it (FlashInfer-Trace definition dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64).
Each cached token holds a latent c_kv (512) and a RoPE key k_pe (64), shared by all heads, in a paged
cache of 64-token pages. The output is the latent-space context (W_UV is applied later).

Inputs (bf16 unless stated):
- q_nope         [num_tokens, 16, 512]: absorbed no-RoPE query (q_nope_head @ W_UK).
- q_pe           [num_tokens, 16, 64]:  RoPE part of the query (RoPE already applied).
- ckv_cache      [num_pages, 64, 512]:  latent cache, page size 64.
- kpe_cache      [num_pages, 64, 64]:   RoPE key cache.
- sparse_indices int32 [num_tokens, 2048]: flat cache slots (page_id * 64 + row) of the selected tokens,
  ascending, then -1. Token n's context lives on its own pages, placed at random in the pool on every
  draw; it selects its first SELECT_LENS[n] tokens, except row 2, which selects the captured pattern
  of 2048 of its 2161 tokens (the trace's selection counts and long-row pattern, upstream's).
- sm_scale       float: the captured softmax scale.

Numerics: computed in float32 (float64 for the fp64 anchor). Over the valid entries j:
  s[n,h,j] = (q_nope[n,h] . ckv[slot_j] + q_pe[n,h] . kpe[slot_j]) * sm_scale
  out[n,h] = sum_j softmax_j(s[n,h,:]) ckv[slot_j]             -> bf16 [num_tokens, 16, 512]
  lse[n,h] = log2(sum_j exp(s[n,h,j]))  (base 2, as FlashInfer) -> float32 [num_tokens, 16]

Sizes: full = the captured record (62 tokens, a pool of 6465 pages); smoke = 3 tokens selecting up to 256
(no long row) in a pool of 48 pages.
"""

from __future__ import annotations

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.paged import pool_indices

NUMBER = 17
NUM_HEADS, CKV_DIM, KPE_DIM, PAGE_SIZE = 16, 512, 64, 64
TOPK = {"full": 2048, "smoke": 256}
SM_SCALE = 0.1352337788608801
SELECT_LENS = {
    "full": (18, 11, 2048, 20, 25, 45, 135, 7, 8, 10, 22, 17, 11, 30, 130, 9, 600, 255, 1033, 1010, 58, 2, 21, 954,
             7, 14, 1015, 28, 64, 5, 18, 33, 26, 86, 5, 14, 10, 90, 53, 22, 2, 17, 154, 51, 121, 25, 16, 5, 19, 12,
             44, 124, 33, 1157, 9, 5, 1319, 300, 23, 35, 389, 8),
    "smoke": (5, 40, 200),
}
LONG_ROW = {"full": 2, "smoke": None}  # the smoke size has no captured long row
NUM_PAGES = {"full": 6465, "smoke": 48}
LONG_ROW_CONTEXT = 2161
LONG_ROW_RUNS = ((0, 53), (54, 10), (65, 25), (91, 11), (103, 42), (146, 12), (159, 65), (225, 7), (233, 3),
                 (237, 40), (278, 1), (280, 12), (293, 13), (307, 8), (316, 1), (318, 5), (324, 4), (329, 3),
                 (333, 3), (337, 21), (359, 14), (374, 1), (377, 1), (379, 24), (404, 110), (515, 13), (529, 20),
                 (550, 6), (557, 41), (599, 16), (616, 14), (631, 15), (647, 10), (658, 6), (665, 24), (691, 11),
                 (703, 15), (719, 10), (730, 21), (752, 21), (774, 26), (801, 28), (830, 7), (838, 11), (850, 1),
                 (852, 12), (865, 18), (884, 5), (890, 1), (892, 1), (894, 9), (904, 11), (916, 10), (927, 12),
                 (940, 4), (946, 23), (970, 7), (978, 6), (985, 29), (1015, 5), (1021, 22), (1045, 13), (1059, 37),
                 (1097, 10), (1108, 42), (1151, 1), (1153, 30), (1184, 2), (1187, 31), (1219, 33), (1253, 8),
                 (1262, 102), (1366, 54), (1421, 98), (1520, 19), (1540, 23), (1564, 7), (1572, 31), (1604, 35),
                 (1640, 21), (1662, 4), (1668, 10), (1681, 4), (1688, 15), (1706, 4), (1711, 13), (1725, 3),
                 (1729, 1), (1731, 3), (1736, 12), (1749, 47), (1798, 70), (1869, 108), (1978, 2), (1981, 9),
                 (1992, 6), (1999, 31), (2031, 24), (2056, 105))


def _sparse_indices(seed: int, size: str) -> torch.Tensor:
    """int32 [num_tokens, TOPK]: each token's selected slots, ascending, then -1 (pages placed from `seed`)."""
    lens, long_row = SELECT_LENS[size], LONG_ROW[size]
    contexts = [LONG_ROW_CONTEXT if b == long_row else n for b, n in enumerate(lens)]
    pages_per_row = [-(-n // PAGE_SIZE) for n in contexts]
    perm = pool_indices(seed, NUM_PAGES[size], sum(pages_per_row)).long()
    out = torch.full((len(lens), TOPK[size]), -1, dtype=torch.int32)
    cursor = 0
    for b, n in enumerate(lens):
        pages = perm[cursor : cursor + pages_per_row[b]]
        cursor += pages_per_row[b]
        if b == long_row:
            logical = torch.cat([torch.arange(a, a + k) for a, k in LONG_ROW_RUNS])
        else:
            logical = torch.arange(n)
        slots = pages[logical // PAGE_SIZE] * PAGE_SIZE + logical % PAGE_SIZE
        out[b, : slots.numel()] = slots.sort().values.to(torch.int32)
    return out


def reference(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    dt = torch.promote_types(q_nope.dtype, torch.float32)
    valid = sparse_indices >= 0  # [num_tokens, topk]
    slot = sparse_indices.long().clamp(min=0)
    ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])[slot].to(dt)  # [num_tokens, topk, 512]
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])[slot].to(dt)  # [num_tokens, topk, 64]
    s = torch.einsum("nhd,nkd->nhk", q_nope.to(dt), ckv) + torch.einsum("nhd,nkd->nhk", q_pe.to(dt), kpe)
    s = (s * sm_scale).masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    out = torch.einsum("nhk,nkd->nhd", p, ckv)
    return out.to(q_nope.dtype), lse / math.log(2.0)


def _scores_f32(a, b):
    """a @ b^T for bf16 batches [n, m, d] x [n, k, d] -> float32 [n, m, k] with fp32 accumulation.

    The lse output is float32 and judged at fp32 precision, so scores rounded to bf16 would not do.
    On CUDA this is one tensor-core GEMM with an fp32 result (bmm's out_dtype); CPU bmm has no
    out_dtype, so the operands are upcast there (the products of bf16 values are exact either way).
    """
    if a.is_cuda:
        return torch.bmm(a, b.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float().transpose(1, 2))


def eager(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    """The eager baseline, in the form of DeepSeek's own eager MLA: bf16 GEMMs, fp32 scores and softmax.

    The selected rows are gathered into a dense [num_tokens, topk] batch (-1 entries masked); scores
    from two GEMMs with fp32 results, an fp32 softmax whose normaliser is the lse output, and bf16
    probabilities times the gathered latents.
    """
    valid = sparse_indices >= 0  # [num_tokens, topk]
    slot = sparse_indices.long().clamp(min=0)
    ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])[slot]  # [num_tokens, topk, 512] bf16
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])[slot]
    s = _scores_f32(q_nope, ckv).add_(_scores_f32(q_pe, kpe)).mul_(sm_scale)
    s.masked_fill_(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s.sub_(lse[..., None])).to(q_nope.dtype)
    return torch.bmm(p, ckv), lse / math.log(2.0)


def make_inputs(seed: int, *, device, size: str = "full"):
    n, pages = len(SELECT_LENS[size]), NUM_PAGES[size]
    meta = torch.device(device).type == "meta"
    g = None if meta else torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        if meta:
            return torch.empty(*shape, device=device, dtype=torch.bfloat16)
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    q_nope = randn(n, NUM_HEADS, CKV_DIM)
    q_pe = randn(n, NUM_HEADS, KPE_DIM)
    ckv_cache = randn(pages, PAGE_SIZE, CKV_DIM)
    kpe_cache = randn(pages, PAGE_SIZE, KPE_DIM)
    return q_nope, q_pe, ckv_cache, kpe_cache, _sparse_indices(seed, size).to(device), SM_SCALE


def _cost():
    n = len(SELECT_LENS["full"])
    selected = sum(SELECT_LENS["full"])
    flops = 2.0 * NUM_HEADS * (CKV_DIM + KPE_DIM + CKV_DIM) * selected
    kv_bytes = 2 * selected * (CKV_DIM + KPE_DIM)
    qo_bytes = n * NUM_HEADS * (2 * (2 * CKV_DIM + KPE_DIM) + 4)
    return flops, float(kv_bytes + qo_bytes + 4 * n * TOPK["full"]), selected


_FLOPS, _BYTES, _SELECTED = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="deepseek-ai/DeepSeek-V3.2-Exp at tensor-parallel 8 (FlashInfer-Trace record 0f8137e0)",
    source_config="num_attention_heads=128 (TP=8 -> 16), kv_lora_rank=512, qk_rope_head_dim=64, "
    "index_topk=2048; page_size=64",
    inputs=("q_nope", "q_pe", "ckv_cache", "kpe_cache", "sparse_indices", "sm_scale"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("sparse_indices",),
    peak="memory",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/17_dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: 62 tokens, {_SELECTED} valid selections (rows shorter than 2048 padded with -1). flops = "
    "2*H*(512+64+512)*valid selections; bytes = selected cache rows + q + out + lse + indices. lse base 2. "
    "Eager baseline: DeepSeek-style eager MLA over the gathered selections (-1 masked): bf16 GEMMs with fp32 "
    "scores, masked fp32 softmax (its normaliser is lse), bf16 probabilities times the latents.",
)
