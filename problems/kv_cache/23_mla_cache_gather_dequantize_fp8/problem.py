"""Gather the paged fp8 MLA latent cache of a batch into one contiguous bf16 buffer (dequantised).

vLLM's `gather_and_maybe_dequant_cache`, used by MLA chunked prefill to up-project the cached
context: for sequence b and token position p < seq_lens[b]

    page = block_table[b, p // 64]
    out[cu_seq_lens[b] + p, :] = bf16(float(kv_cache[page, p % 64, :]) * scale)

Layouts: kv_cache float8_e4m3fn [num_blocks, 64, 576] (DeepSeek-V3 MLA: 512 latent + 64 rope dims,
page size 64); scale fp32 [1] (per-tensor); block_table int32 [B, max_blocks] (padding entries
point at a page the sequence does not own); seq_lens int32 [B]; cu_seq_lens int32 [B + 1].
Output: out bf16 [sum(seq_lens), 576]. Arithmetic in fp32 (the promoted dtype; under the fp64
anchor the output stays fp64), one rounding to bf16. Full size: 16 sequences with contexts of
1k-32k tokens, pages scattered through a shuffled pool.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta
from mkb.problems.paged import cu_seqlens, draw_lengths, page_table, structure_rng

SEQS = {"full": 16, "smoke": 3}
LENS = {"full": (1024, 32768), "smoke": (5, 150)}
DIM = {"full": 576, "smoke": 72}
BLOCK = {"full": 64, "smoke": 16}
FP8 = torch.float8_e4m3fn


def _structure(size: str):
    rng = structure_rng(23, size)
    lens = draw_lengths(rng, SEQS[size], *LENS[size])
    return page_table(rng, lens, BLOCK[size])


_PT = _structure("full")
_N = sum(_PT.kv_lens)

META = ProblemMeta(
    number=23,
    name="mla_cache_gather_dequantize_fp8",
    family="kv_cache",
    dtypes=("fp8_e4m3", "fp32", "int32", "bf16"),
    source_model="deepseek-ai/DeepSeek-V3 served by vLLM with an fp8 MLA cache",
    source_config="kv_lora_rank=512, qk_rope_head_dim=64 (576 cached dims per token), page size 64, "
    "per-tensor fp8 e4m3 scale",
    inputs=("kv_cache", "scale", "block_table", "seq_lens", "cu_seq_lens"),
    outputs=(Output("out"),),
    flops=float(_N * DIM["full"]),
    bytes=float(_N * DIM["full"] * (1 + 2) + _PT.batch * _PT.max_pages * 4),
    peak="memory",
    structure_inputs=("block_table", "seq_lens", "cu_seq_lens"),
    notes=f"Full: {_PT.batch} sequences, {_N} tokens gathered from a pool of {_PT.num_pages} pages.",
)


def reference(kv_cache, scale, block_table, seq_lens, cu_seq_lens):
    ct = torch.promote_types(scale.dtype, torch.float32)
    out_dtype = torch.bfloat16 if ct == torch.float32 else ct
    bs = kv_cache.shape[1]
    # gather raw bytes (fp8 indexing is slow on the CPU), then reinterpret
    flat = kv_cache.flatten(0, 1)
    raw = flat.view(torch.uint8) if flat.dtype == FP8 else flat
    out = torch.empty(int(cu_seq_lens[-1]), flat.shape[-1], dtype=out_dtype, device=kv_cache.device)
    for b in range(block_table.shape[0]):
        n, start = int(seq_lens[b]), int(cu_seq_lens[b])
        p = torch.arange(n, device=kv_cache.device)
        slots = block_table[b, p // bs].long() * bs + p % bs
        codes = raw[slots].view(FP8) if flat.dtype == FP8 else raw[slots]
        out[start : start + n] = (codes.to(ct) * scale.to(ct)).to(out_dtype)
    return out


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    pt = _structure(size)
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    d = DIM[size]
    # latent codes use the full e4m3 range (the scale was chosen from the latent amax)
    kv = (torch.randn(pt.num_pages, BLOCK[size], d, generator=g, device=device) * 96).clamp(-448, 448).to(FP8)
    scale = (0.002 + 0.01 * torch.rand(1, generator=g, device=device)).to(torch.float32)
    i32 = torch.int32
    return (
        kv,
        scale,
        torch.tensor(pt.block_table, dtype=i32, device=device),
        torch.tensor(pt.kv_lens, dtype=i32, device=device),
        torch.tensor(cu_seqlens(list(pt.kv_lens)), dtype=i32, device=device),
    )
