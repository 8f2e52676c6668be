"""Causal MLA prefill in the expanded (non-absorbed) form over ragged Q/K/V, DeepSeek-V3 at TP 8.

For long prefills DeepSeek-V3 serving expands the latent cache back to per-head keys and values
(k = [k_nope (128) | k_pe (64), shared across heads], v = 128 per head) and runs ordinary
attention with qk head dim 192 and v head dim 128. Sequence b has qo_len[b] new tokens and
kv_len[b] = prefix[b] + qo_len[b] keys (some prefixes empty), packed ragged.

Inputs (bf16 unless stated):
- q  [total_q, 16, 192]:  [q_nope | q_pe] per head (RoPE already applied to the last 64);
  sequence b owns rows qo_indptr[b]:qo_indptr[b+1].
- k  [total_kv, 16, 192]: [k_nope | k_pe] per head; sequence b owns rows kv_indptr[b]:kv_indptr[b+1].
- v  [total_kv, 16, 128].
- qo_indptr, kv_indptr int32 [batch + 1] (cu_seqlens; fixed, as upstream's: only values are redrawn).
- sm_scale float: the captured softmax scale.

Numerics: computed in float32 (float64 for the fp64 anchor). For query row i (0-based within its
sequence) and key t of the same sequence:
  causal mask, aligned bottom-right: t is visible iff t <= i + (kv_len[b] - qo_len[b]);
  s = (q . k) * sm_scale, sm_scale = 0.08838834764831843 = 1/sqrt(128), the value the captured trace
  records (not 192^-0.5 times DeepSeek-V3's YaRN mscale^2: upstream keeps the trace's scale);
  out[i,h] = sum_t softmax(s) v[t,h]                          -> bf16 [total_q, 16, 128]
  lse[i,h] = log2(sum_visible exp(s))  (base 2, as FlashInfer) -> float32 [total_q, 16]

Sizes: full = upstream's captured FlashInfer-Trace record (63 sequences of 38..54 new tokens after 256 cached
ones); smoke = 3 short ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from mkb.problems import Output, ProblemMeta, Upstream
from mkb.problems.paged import cu_seqlens

NUMBER = 16
NUM_HEADS, QK_DIM, V_DIM = 16, 192, 128
SM_SCALE = 0.08838834764831843
Q_LENS = {
    "full": (39, 38, 39, 39, 39, 40, 40, 40, 41, 40, 40, 42, 42, 41, 42, 42, 43, 42, 43, 42, 43, 43, 44, 44, 44, 46, 45,
             44, 45, 45, 46, 46, 46, 46, 46, 47, 47, 47, 47, 48, 49, 48, 47, 48, 49, 50, 49, 49, 50, 50, 51, 51, 50, 51,
             51, 52, 50, 52, 53, 53, 54, 53, 52),
    "smoke": (5, 9, 3),
}
PREFIX_LENS = {"full": (256,) * 63, "smoke": (0, 7, 2)}


def _structure(size: str):
    qo_lens = list(Q_LENS[size])
    return qo_lens, [p + q for p, q in zip(PREFIX_LENS[size], qo_lens)]


def reference(q, k, v, qo_indptr, kv_indptr, sm_scale):
    dt = torch.promote_types(q.dtype, torch.float32)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty((*q.shape[:2], v.shape[-1]), dtype=dt, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=dt, device=q.device)
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].to(dt)
        kb, vb = k[kvp[b] : kvp[b + 1]].to(dt), v[kvp[b] : kvp[b + 1]].to(dt)
        q_len, kv_len = qb.shape[0], kb.shape[0]
        s = torch.einsum("qhd,khd->hqk", qb, kb) * sm_scale
        i = torch.arange(q_len, device=q.device)[:, None]
        t = torch.arange(kv_len, device=q.device)[None, :]
        s = s.masked_fill(t > i + (kv_len - q_len), float("-inf"))
        m = torch.logsumexp(s, dim=-1)  # [heads, q_len]
        p = torch.exp(s - m[..., None])
        out[qo[b] : qo[b + 1]] = torch.einsum("hqk,khd->qhd", p, vb)
        lse[qo[b] : qo[b + 1]] = m.T
    return out.to(q.dtype), lse / math.log(2.0)


def _scores_f32(a, b):
    """a @ b^T for bf16 batches [n, m, d] x [n, k, d] -> float32 [n, m, k] with fp32 accumulation.

    The lse output is float32 and judged at fp32 precision, so scores rounded to bf16 would not do.
    On CUDA this is one tensor-core GEMM with an fp32 result (bmm's out_dtype); CPU bmm has no
    out_dtype, so the operands are upcast there (the products of bf16 values are exact either way).
    """
    if a.is_cuda:
        return torch.bmm(a, b.transpose(1, 2), out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float().transpose(1, 2))


def _causal_lse(qb, kb, scale):
    """Base-2 lse of one sequence's bottom-right causal scores: qb [H, q_len, D], kb [kv_heads, kv_len, D] -> [q_len, H]."""
    num_heads, q_len, head_dim = qb.shape
    kv_heads, kv_len, _ = kb.shape
    s = _scores_f32(qb.reshape(kv_heads, num_heads // kv_heads * q_len, head_dim), kb)
    s = s.view(num_heads, q_len, kv_len).mul_(scale)
    i = torch.arange(q_len, device=qb.device)[:, None]
    t = torch.arange(kv_len, device=qb.device)[None, :]
    s.masked_fill_(t > i + (kv_len - q_len), float("-inf"))
    return torch.logsumexp(s, dim=-1).T / math.log(2.0)


def eager(q, k, v, qo_indptr, kv_indptr, sm_scale):
    """The eager baseline: per sequence (a batch of a few), bf16 SDPA on its ragged slices.

    The bottom-right causal mask is torch's `causal_lower_right` bias (flash or memory-efficient
    attention on the GPU, GQA native); lse comes from fp32 scores on the side.
    """
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.empty((*q.shape[:2], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)  # [H, q_len, D]
        kb, vb = k[kvp[b] : kvp[b + 1]].transpose(0, 1), v[kvp[b] : kvp[b + 1]].transpose(0, 1)
        mask = causal_lower_right(qb.shape[1], kb.shape[1])
        ob = F.scaled_dot_product_attention(qb[None], kb[None], vb[None], attn_mask=mask, scale=sm_scale,
                                            enable_gqa=kb.shape[0] != qb.shape[0])
        out[qo[b] : qo[b + 1]] = ob[0].transpose(0, 1)
        lse[qo[b] : qo[b + 1]] = _causal_lse(qb, kb, sm_scale)
    return out, lse


def make_inputs(seed: int, *, device, size: str = "full"):
    qo_lens, kv_lens = _structure(size)
    meta = torch.device(device).type == "meta"
    g = None if meta else torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        if meta:
            return torch.empty(*shape, device=device, dtype=torch.bfloat16)
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    q = randn(sum(qo_lens), NUM_HEADS, QK_DIM)
    k = randn(sum(kv_lens), NUM_HEADS, QK_DIM)
    v = randn(sum(kv_lens), NUM_HEADS, V_DIM)

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    return q, k, v, i32(cu_seqlens(qo_lens)), i32(cu_seqlens(kv_lens)), SM_SCALE


def _cost():
    qo_lens, kv_lens = _structure("full")
    pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(qo_lens, kv_lens))
    flops = 2.0 * NUM_HEADS * (QK_DIM + V_DIM) * pairs
    kv_bytes = 2 * sum(kv_lens) * NUM_HEADS * (QK_DIM + V_DIM)
    qo_bytes = sum(qo_lens) * NUM_HEADS * (2 * (QK_DIM + V_DIM) + 4)
    return flops, float(kv_bytes + qo_bytes + 8 * (len(qo_lens) + 1)), (qo_lens, kv_lens)


_FLOPS, _BYTES, _LENS = _cost()

META = ProblemMeta(
    number=NUMBER,
    name="mla_ragged_prefill_causal_h16_qk192_vo128_bf16",
    family="attention",
    dtypes=("bfloat16", "int32", "float32"),
    source_model="deepseek-ai/DeepSeek-V3 at tensor-parallel 8 (FlashInfer BatchPrefillWithRaggedKVCache, "
    "head_dim_qk=192, head_dim_vo=128)",
    source_config="num_attention_heads=128 (TP=8 -> 16), qk_nope_head_dim=128, qk_rope_head_dim=64, "
    "v_head_dim=128, rope_scaling yarn factor=40 mscale_all_dim=1; causal",
    inputs=("q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale"),
    outputs=(Output("out"), Output("lse")),
    flops=_FLOPS,
    bytes=_BYTES,
    fixed_inputs=("qo_indptr", "kv_indptr"),
    peak="bf16_tc",
    upstream=Upstream(
        source="shipped",
        path="problems/attention/16_mla_ragged_prefill_causal_h16_qk192_vo128_bf16.py",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
    ),
    notes=f"full: {len(_LENS[0])} sequences, {sum(_LENS[0])} query rows, {sum(_LENS[1])} keys. flops count only unmasked (visible) pairs: "
    "2*H*(192+128)*sum_b(qo*(kv-qo) + qo*(qo+1)/2). Causal mask aligned bottom-right; lse base 2. "
    "Eager baseline: per sequence, bf16 torch SDPA with the causal_lower_right bias; lse from fp32 "
    "scores (a bf16 GEMM with fp32 result) on the side.",
)
