"""Causal MLA prefill over a paged compressed-KV cache (absorbed form), DeepSeek-V3 at TP 8, page size 1.

Chunked prefill / prefix caching for DeepSeek-V3 multi-head latent attention in the
weight-absorbed form: each cached token holds one latent c_kv (512) and one RoPE key k_pe (64)
shared by all heads; q_nope is already absorbed (q_nope_head @ W_UK, 512 wide) and the output is
the latent-space context (W_UV is applied later). Sequence b appends qo_len[b] new tokens whose
latents are already in the cache, so its cache holds kv_len[b] = prefix[b] + qo_len[b] tokens.

Inputs (bf16 unless stated):
- q_nope     [total_q, 16, 512], q_pe [total_q, 16, 64]: sequence b owns rows
  qo_indptr[b]:qo_indptr[b+1] (RoPE already applied to q_pe).
- ckv_cache  [num_pages, page_size=1, 512], kpe_cache [num_pages, page_size=1, 64]: page pool;
  pages not listed in kv_indices hold garbage and must not be read.
- qo_indptr  int32 [batch + 1] (captured, fixed).
- kv_indptr  int32 [batch + 1] (captured, fixed): sequence b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]];
  with page size 1, kv_len[b] = kv_indptr[b+1] - kv_indptr[b].
- kv_indices int32 [nnz]: page ids in token order, redrawn on every draw (the first nnz entries of a
  random permutation of the pool).
- sm_scale   float: the captured softmax scale.

Numerics: computed in float32 (float64 for the fp64 anchor). For query row i (0-based within its
sequence) and cached token t of the same sequence:
  causal mask, aligned bottom-right: t is visible iff t <= i + (kv_len[b] - qo_len[b]);
  s = (q_nope . ckv[t] + q_pe . kpe[t]) * sm_scale,
  sm_scale = 0.1352337747812271, the captured (128 + 64)^-0.5 * (0.1 * ln(40) + 1)^2 (DeepSeek-V3 YaRN mscale);
  out[i,h] = sum_t softmax(s) ckv[t]                          -> bf16 [total_q, 16, 512]
  lse[i,h] = log2(sum_visible exp(s))  (base 2, as FlashInfer) -> float32 [total_q, 16]

Sizes: full = upstream's captured FlashInfer-Trace record (28 sequences, 1954 query rows, 2044 cached tokens in
a pool of 989669 pages); smoke = 3 short sequences in a pool of 48.
"""

from __future__ import annotations

import math

import torch

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.paged import pool_indices

NUMBER = 15
NUM_HEADS, CKV_DIM, KPE_DIM, PAGE_SIZE = 16, 512, 64, 1
SM_SCALE = 0.1352337747812271
QO_INDPTR = {
    "full": (0, 20, 31, 114, 128, 164, 173, 190, 327, 423, 456, 460, 499, 520, 602, 603, 613, 1033, 1061, 1081, 1142,
             1532, 1581, 1757, 1823, 1832, 1864, 1943, 1954),
    "smoke": (0, 3, 10, 12),
}
KV_INDPTR = {
    "full": (0, 23, 38, 123, 141, 180, 191, 212, 353, 452, 488, 494, 538, 561, 651, 655, 669, 1092, 1122, 1145, 1209,
             1602, 1655, 1835, 1905, 1917, 1951, 2032, 2044),
    "smoke": (0, 5, 14, 30),
}
NUM_PAGES = {"full": 989669, "smoke": 48}


def reference(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    dt = torch.promote_types(q_nope.dtype, torch.float32)
    ckv_flat = ckv_cache.reshape(-1, ckv_cache.shape[-1])
    kpe_flat = kpe_cache.reshape(-1, kpe_cache.shape[-1])
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty(q_nope.shape, dtype=dt, device=q_nope.device)
    lse = torch.empty(q_nope.shape[:2], dtype=dt, device=q_nope.device)
    for b in range(len(qo) - 1):
        qn, qp = q_nope[qo[b] : qo[b + 1]].to(dt), q_pe[qo[b] : qo[b + 1]].to(dt)
        slot = kv_indices[kvp[b] : kvp[b + 1]].long()  # page size 1: one token per page
        ckv, kpe = ckv_flat[slot].to(dt), kpe_flat[slot].to(dt)
        q_len, kv_len = qn.shape[0], ckv.shape[0]
        s = (torch.einsum("qhd,kd->hqk", qn, ckv) + torch.einsum("qhd,kd->hqk", qp, kpe)) * sm_scale
        i = torch.arange(q_len, device=qn.device)[:, None]
        t = torch.arange(kv_len, device=qn.device)[None, :]
        s = s.masked_fill(t > i + (kv_len - q_len), float("-inf"))
        m = torch.logsumexp(s, dim=-1)  # [heads, q_len]
        p = torch.exp(s - m[..., None])
        out[qo[b] : qo[b + 1]] = torch.einsum("hqk,kd->qhd", p, ckv)
        lse[qo[b] : qo[b + 1]] = m.T
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


def eager(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    """The eager baseline, in the form of DeepSeek's own eager MLA: bf16 GEMMs, fp32 scores and softmax.

    Per sequence (a batch of a few): every head reads the same latent cache, so the heads fold into
    the query rows of two GEMMs with fp32 results; a bottom-right causal fp32 softmax whose
    normaliser is the lse output; bf16 probabilities times the latent cache.
    """
    num_heads = q_nope.shape[1]
    ckv_flat = ckv_cache.reshape(-1, ckv_cache.shape[-1])
    kpe_flat = kpe_cache.reshape(-1, kpe_cache.shape[-1])
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty_like(q_nope)
    lse = torch.empty(q_nope.shape[:2], dtype=torch.float32, device=q_nope.device)
    for b in range(len(qo) - 1):
        qn, qp = q_nope[qo[b] : qo[b + 1]], q_pe[qo[b] : qo[b + 1]]
        slot = kv_indices[kvp[b] : kvp[b + 1]].long()  # page size 1: one token per page
        ckv, kpe = ckv_flat[slot][None], kpe_flat[slot][None]  # [1, kv_len, d] bf16
        q_len, kv_len = qn.shape[0], ckv.shape[1]
        s = _scores_f32(qn.reshape(1, q_len * num_heads, -1), ckv)
        s = s.add_(_scores_f32(qp.reshape(1, q_len * num_heads, -1), kpe)).mul_(sm_scale).view(q_len, num_heads, kv_len)
        i = torch.arange(q_len, device=qn.device)[:, None, None]
        t = torch.arange(kv_len, device=qn.device)[None, None, :]
        s.masked_fill_(t > i + (kv_len - q_len), float("-inf"))
        m = torch.logsumexp(s, dim=-1)  # [q_len, heads]
        p = torch.exp(s.sub_(m[..., None])).to(q_nope.dtype).view(1, q_len * num_heads, kv_len)
        out[qo[b] : qo[b + 1]] = torch.bmm(p, ckv).view(q_len, num_heads, -1)
        lse[qo[b] : qo[b + 1]] = m
    return out, lse / math.log(2.0)


def make_inputs(seed: int, *, device, size: str = "full"):
    qo, kvp, pages = QO_INDPTR[size], KV_INDPTR[size], NUM_PAGES[size]
    meta = torch.device(device).type == "meta"
    g = None if meta else torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        if meta:
            return torch.empty(*shape, device=device, dtype=torch.bfloat16)
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    q_nope = randn(qo[-1], NUM_HEADS, CKV_DIM)
    q_pe = randn(qo[-1], NUM_HEADS, KPE_DIM)
    ckv_cache = randn(pages, PAGE_SIZE, CKV_DIM)
    kpe_cache = randn(pages, PAGE_SIZE, KPE_DIM)

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    kv_indices = pool_indices(seed, pages, kvp[-1]).to(device)
    return q_nope, q_pe, ckv_cache, kpe_cache, i32(qo), i32(kvp), kv_indices, SM_SCALE


def _cost():
    qo, kvp = QO_INDPTR["full"], KV_INDPTR["full"]
    qo_lens = [b - a for a, b in zip(qo, qo[1:])]
    kv_lens = [b - a for a, b in zip(kvp, kvp[1:])]
    pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(qo_lens, kv_lens))
    flops = 2.0 * NUM_HEADS * (CKV_DIM + KPE_DIM + CKV_DIM) * pairs
    kv_bytes = 2 * sum(kv_lens) * (CKV_DIM + KPE_DIM)
    qo_bytes = sum(qo_lens) * NUM_HEADS * (2 * (2 * CKV_DIM + KPE_DIM) + 4)
    idx_bytes = 4 * (2 * len(qo) + kvp[-1])
    return flops, float(kv_bytes + qo_bytes + idx_bytes), (qo_lens, kv_lens)


_FLOPS, _BYTES, _LENS = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="mla_paged_prefill_causal_h16_ckv512_kpe64_ps1_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="deepseek-ai/DeepSeek-V3 at tensor-parallel 8 (FlashInfer BatchMLAPagedAttention)",
    source_config="num_attention_heads=128 (TP=8 -> 16), kv_lora_rank=512, qk_rope_head_dim=64, "
    "qk_nope_head_dim=128, rope_scaling yarn factor=40 mscale_all_dim=1; page_size=1, causal",
    inputs=("q_nope", "q_pe", "ckv_cache", "kpe_cache", "qo_indptr", "kv_indptr", "kv_indices", "sm_scale"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("kv_indices",),
    fixed_inputs=("qo_indptr", "kv_indptr"),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/15_mla_paged_prefill_causal_h16_ckv512_kpe64_ps1_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: (qo_len, kv_len) = {list(zip(*_LENS))}. flops count only unmasked (visible) pairs: "
    "2*H*(512+64+512)*sum_b(qo*(kv-qo) + qo*(qo+1)/2). Causal mask aligned bottom-right; lse base 2. "
    "Eager baseline: DeepSeek-style eager MLA per sequence, heads folded into query rows, "
    "bottom-right causal mask: bf16 GEMMs with fp32 scores, masked fp32 softmax (its normaliser is "
    "lse), bf16 probabilities times the latents.",
)
