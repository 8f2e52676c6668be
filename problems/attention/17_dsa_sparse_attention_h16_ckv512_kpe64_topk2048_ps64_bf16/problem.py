"""DeepSeek Sparse Attention (DSA) decode: MLA over 2048 selected cache tokens, DeepSeek-V3.2 at TP 8.

DeepSeek-V3.2's lightning indexer picks, for each query token, at most 2048 cached tokens
(problem 18); the main attention then runs MLA in its weight-absorbed MQA form over only those
tokens. Each cached token holds a latent c_kv (512) and a RoPE key k_pe (64), shared by all heads,
in a paged cache of 64-token pages. The output is the latent-space context (W_UV is applied later).

Inputs (bf16 unless stated):
- q_nope         [num_tokens, 16, 512]: absorbed no-RoPE query (q_nope_head @ W_UK).
- q_pe           [num_tokens, 16, 64]:  RoPE part of the query (RoPE already applied).
- ckv_cache      [num_pages, 64, 512]:  latent cache, page size 64.
- kpe_cache      [num_pages, 64, 64]:   RoPE key cache.
- sparse_indices int32 [num_tokens, 2048]: flat cache slots (page_id * 64 + row) of the selected
  tokens, in no particular order; -1 marks an unused entry (contexts shorter than 2048 select
  every token and pad with -1). Slots of other sequences and spare pages hold garbage.

Numerics: computed in float32 (float64 for the fp64 anchor). Over the valid entries j:
  s[n,h,j] = (q_nope[n,h] . ckv[slot_j] + q_pe[n,h] . kpe[slot_j]) * sm_scale,
  sm_scale = (128 + 64)^-0.5 * (0.1 * ln(40) + 1)^2 = 0.1352337... (YaRN mscale, as DeepSeek-V3);
  out[n,h] = sum_j softmax_j(s[n,h,:]) ckv[slot_j]             -> bf16 [num_tokens, 16, 512]
  lse[n,h] = log2(sum_j exp(s[n,h,j]))  (base 2, as FlashInfer) -> float32 [num_tokens, 16]

Sizes: full = 128 decode tokens (one per sequence), contexts 512..16384 (fixed, log-uniform);
smoke = 2 tokens with contexts 700 and 2900.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mkb.problems import Output, ProblemMeta
from mkb.problems.paged import draw_lengths, page_table, structure_rng, token_slots

NUMBER = 17
NUM_HEADS, CKV_DIM, KPE_DIM, PAGE_SIZE, TOPK = 16, 512, 64, 64, 2048
SM_SCALE = (128 + 64) ** -0.5 * (0.1 * 1.0 * math.log(40.0) + 1.0) ** 2


def _structure(size: str):
    rng = structure_rng(NUMBER, size)
    ctx = draw_lengths(rng, 128, 512, 16384) if size == "full" else [700, 2900]
    pt = page_table(rng, ctx, PAGE_SIZE)
    rows = []
    for slots in token_slots(pt):
        pick = rng.permutation(len(slots))[:TOPK]  # the indexer's selection, unordered
        row = np.full(TOPK, -1, dtype=np.int64)
        row[: len(pick)] = slots[pick]
        rows.append(row)
    return pt, np.stack(rows)


def reference(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices):
    dt = torch.promote_types(q_nope.dtype, torch.float32)
    valid = sparse_indices >= 0  # [num_tokens, topk]
    slot = sparse_indices.long().clamp(min=0)
    ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])[slot].to(dt)  # [num_tokens, topk, 512]
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])[slot].to(dt)  # [num_tokens, topk, 64]
    s = torch.einsum("nhd,nkd->nhk", q_nope.to(dt), ckv) + torch.einsum("nhd,nkd->nhk", q_pe.to(dt), kpe)
    s = (s * SM_SCALE).masked_fill(~valid[:, None, :], float("-inf"))
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


def eager(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices):
    """The eager baseline, in the form of DeepSeek's own eager MLA: bf16 GEMMs, fp32 scores and softmax.

    The selected rows are gathered into a dense [num_tokens, topk] batch (-1 entries masked); scores
    from two GEMMs with fp32 results, an fp32 softmax whose normaliser is the lse output, and bf16
    probabilities times the gathered latents.
    """
    valid = sparse_indices >= 0  # [num_tokens, topk]
    slot = sparse_indices.long().clamp(min=0)
    ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])[slot]  # [num_tokens, topk, 512] bf16
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])[slot]
    s = _scores_f32(q_nope, ckv).add_(_scores_f32(q_pe, kpe)).mul_(SM_SCALE)
    s.masked_fill_(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s.sub_(lse[..., None])).to(q_nope.dtype)
    return torch.bmm(p, ckv), lse / math.log(2.0)


def make_inputs(seed: int, *, device, size: str = "full"):
    pt, idx = _structure(size)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    q_nope = randn(pt.batch, NUM_HEADS, CKV_DIM)
    q_pe = randn(pt.batch, NUM_HEADS, KPE_DIM)
    ckv_cache = randn(pt.num_pages, PAGE_SIZE, CKV_DIM)
    kpe_cache = randn(pt.num_pages, PAGE_SIZE, KPE_DIM)
    return q_nope, q_pe, ckv_cache, kpe_cache, torch.tensor(idx, dtype=torch.int32, device=device)


def _cost():
    pt, idx = _structure("full")
    selected = int((idx >= 0).sum())
    flops = 2.0 * NUM_HEADS * (CKV_DIM + KPE_DIM + CKV_DIM) * selected
    kv_bytes = 2 * selected * (CKV_DIM + KPE_DIM)
    qo_bytes = pt.batch * NUM_HEADS * (2 * (2 * CKV_DIM + KPE_DIM) + 4)
    return flops, float(kv_bytes + qo_bytes + 4 * idx.size), (selected, sum(pt.kv_lens))


_FLOPS, _BYTES, _COUNTS = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="deepseek-ai/DeepSeek-V3.2-Exp at tensor-parallel 8 (sparse MLA, FlashMLA/FlashInfer layout)",
    source_config="num_attention_heads=128 (TP=8 -> 16), kv_lora_rank=512, qk_rope_head_dim=64, "
    "qk_nope_head_dim=128, index_topk=2048, rope_scaling yarn factor=40 mscale_all_dim=1; page_size=64",
    inputs=("q_nope", "q_pe", "ckv_cache", "kpe_cache", "sparse_indices"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    structure_inputs=("sparse_indices",),
    peak="memory",
    notes=f"full: 128 tokens, {_COUNTS[0]} valid selections out of {_COUNTS[1]} cached tokens "
    "(contexts < 2048 are padded with -1). flops = 2*H*(512+64+512)*valid selections; bytes = "
    "selected cache rows + q + out + lse + indices. lse base 2. "
    "Eager baseline: DeepSeek-style eager MLA over the gathered selections (-1 masked): bf16 GEMMs "
    "with fp32 scores, masked fp32 softmax (its normaliser is lse), bf16 probabilities times the "
    "latents.",
)
