"""Reassemble context-parallel (interleaved) fp8 K/V caches into full-sequence bf16 K and V.

With decode context parallelism (vLLM DCP, interleave size 1) the KV cache of a sequence is split
over CP ranks: token p of sequence b lives on rank r = p % CP at local position j = p // CP, in
that rank's paged pool through that rank's block table. After the caches of all ranks are
all-gathered (stacked here on the rank axis), a prefill over the full context needs them back in
token order and in bf16:

    page = block_tables[r, b, j // 16]
    k_out[cu_seq_lens[b] + p] = bf16(float(k_cache[r, page, j % 16]) * k_scale)
    v_out[cu_seq_lens[b] + p] = bf16(float(v_cache[r, page, j % 16]) * v_scale)

Layouts: k_cache, v_cache float8_e4m3fn [CP, num_blocks, 16, Hkv, D]; k_scale, v_scale fp32 [1]
(per tensor); block_tables int32 [CP, B, max_blocks] (padding points at pages the sequence does
not own); seq_lens int32 [B]; cu_seq_lens int32 [B + 1]. Outputs k_out, v_out bf16
[sum(seq_lens), Hkv, D]. Arithmetic in fp32 (promoted; the fp64 anchor stays fp64), one rounding
to bf16. Full size: CP = 4, Llama 3.1 70B KV heads (8 x 128), 8 sequences of 2k-32k tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.paged import cu_seqlens, draw_lengths, page_table, structure_rng

CP = {"full": 4, "smoke": 2}
SEQS = {"full": 8, "smoke": 3}
LENS = {"full": (2048, 32768), "smoke": (5, 60)}
KV_HEADS = {"full": 8, "smoke": 2}
HEAD_DIM = {"full": 128, "smoke": 16}
BLOCK = 16
FP8 = torch.float8_e4m3fn


def _structure(size: str):
    rng = structure_rng(24, size)
    cp = CP[size]
    lens = draw_lengths(rng, SEQS[size], *LENS[size])
    tables = []
    for r in range(cp):
        local = [max(0, -(-(n - r) // cp)) for n in lens]
        tables.append(page_table(rng, [max(1, x) for x in local], BLOCK))
    pages = max(t.num_pages for t in tables)
    width = max(t.max_pages for t in tables)
    bt = np.array([[list(row) + [t.pad] * (width - len(row)) for row in t.block_table] for t in tables], dtype=np.int32)
    return lens, bt, pages


_LENS, _BT, _PAGES = _structure("full")
_N, _Hkv, _D = sum(_LENS), KV_HEADS["full"], HEAD_DIM["full"]

META = ProblemMeta(
    number=24,
    name="context_parallel_cache_gather_fp8_upconvert_bf16",
    family="kv_cache",
    dtypes=("fp8_e4m3", "fp32", "int32", "bf16"),
    source_model="meta-llama/Llama-3.1-70B served by vLLM with decode context parallelism and an fp8 KV cache",
    source_config="num_key_value_heads=8, head_dim=128; CP=4, interleave 1, page size 16, per-tensor fp8 scales",
    inputs=("k_cache", "v_cache", "k_scale", "v_scale", "block_tables", "seq_lens", "cu_seq_lens"),
    outputs=(Output("k_out"), Output("v_out")),
    flops=float(2 * _N * _Hkv * _D),
    bytes=float(2 * _N * _Hkv * _D * (1 + 2) + _BT.size * 4),
    peak="memory",
    structure_inputs=("block_tables", "seq_lens", "cu_seq_lens"),
    notes=f"Full: {_N} tokens over {len(_LENS)} sequences; each rank's pool has {_PAGES} pages.",
)


def reference(k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, cu_seq_lens):
    ct = torch.promote_types(k_scale.dtype, torch.float32)
    out_dtype = torch.bfloat16 if ct == torch.float32 else ct
    cp, nb, bs = k_cache.shape[:3]
    dev = k_cache.device
    outs = []
    for cache, scale in ((k_cache, k_scale), (v_cache, v_scale)):
        flat = cache.flatten(0, 2)  # [(rank, page, row), Hkv, D]
        raw = flat.view(torch.uint8) if flat.dtype == FP8 else flat  # fp8 indexing is slow on the CPU
        out = torch.empty(int(cu_seq_lens[-1]), *flat.shape[1:], dtype=out_dtype, device=dev)
        for b in range(block_tables.shape[1]):
            n, start = int(seq_lens[b]), int(cu_seq_lens[b])
            p = torch.arange(n, device=dev)
            r, j = p % cp, p // cp
            page = block_tables[r, b, j // bs].long()
            codes = raw[(r * nb + page) * bs + j % bs]
            codes = codes.view(FP8) if flat.dtype == FP8 else codes
            out[start : start + n] = (codes.to(ct) * scale.to(ct)).to(out_dtype)
        outs.append(out)
    return tuple(outs)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    lens, bt, pages = _structure(size)
    cp, h, d = CP[size], KV_HEADS[size], HEAD_DIM[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def codes(spread):
        x = torch.randn(cp, pages, BLOCK, h, d, generator=g, device=device) * spread
        return x.clamp(-448, 448).to(FP8)

    k_cache, v_cache = codes(96.0), codes(64.0)
    k_scale = (0.01 + 0.02 * torch.rand(1, generator=g, device=device)).to(torch.float32)
    v_scale = (0.005 + 0.01 * torch.rand(1, generator=g, device=device)).to(torch.float32)
    i32 = torch.int32
    return (
        k_cache, v_cache, k_scale, v_scale,
        torch.from_numpy(bt).to(device),
        torch.tensor(lens, dtype=i32, device=device),
        torch.tensor(cu_seqlens(lens), dtype=i32, device=device),
    )
