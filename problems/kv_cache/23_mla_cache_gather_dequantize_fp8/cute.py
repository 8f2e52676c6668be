"""Baseline (CuTe DSL): paged fp8 MLA cache gather + dequantise, one thread per 16-byte chunk of a token row.

Strategy: the cache bytes are viewed (no copy) as Float8E4M3FN [blocks, block_size, C, V] and the
output as fp32 [tokens, C * V/4, 4], with V = 16 bytes when the row length E divides (576 = 36 x 16),
else 8 or 4. A CTA owns ROWS consecutive output rows (ROWS x C threads, about 256), so thread t
handles chunk t % C of row t // C: a warp reads consecutive 16-byte chunks of one cache row
(coalesced 128-bit loads) and the CTA writes one contiguous span of the output. Each thread finds its
row's request from the running sum of seq_lens (R <= 8 cached int32 loads, unrolled; zero-length
requests are skipped naturally), then the block from block_table, loads V codes with one copy atom,
converts them with the DSL's fp8 -> fp32 conversion (exact: every e4m3 value, subnormals included, is
an fp32; 0x7f/0xff become NaN), multiplies by scale rounded to fp32 (as torch multiplies an fp32
tensor by a Python float) and stores V floats as V/4 128-bit stores. The host reads seq_lens once (32
bytes, one sync: a declared structure input) only to size the output; the prefix sums are on the GPU.

Bound: memory. 4096 x 576 x (1 B in + 4 B out) = 11.8 MB, about 2.5 us at 4.8 TB/s; with 586 CTAs
of 252 threads a single wave, so launch latency and the host read of seq_lens dominate the call.
Compiled once per (cache geometry, requests, block-table width, scale); tokens are dynamic.

Against torch.compile: 111.0 us, 1.07x torch.compile (119.0 us) and 4.18x eager; the TIRx version 154.0 us, 0.77x
(problems/README.md speed table, events/h200-grader-2-2). Host-bound, so neither ratio is a property of the kernel.
The output's row count is sum(seq_lens), so every solution reads seq_lens on the host (torch.compile's too: a graph
break, 2 graphs, per-call CV 0.35 in events/h200-torch-compile). The timing window then holds that sync and the
host's wake-up after it, which move with the host: this file's three gradings in h200-grader-2-2 took 197.5, 130.6
and 111.0 us (TIRx's 249.9, 156.2 and 154.0 us; events/h200-grader-2-2/logs/README.md), and the same code
(docstrings aside) took 90.2 us (TIRx 90.0 us) under grader 2.1 (events/h200-baselines-2-1).

Checked on the CPU in the sm_90a PTX: one ld.global.v4 per thread, cvt.rn.f16x2.e4m3x2 + cvt.f32.f16
(exact for every code, NaN 0x7f/0xff included), mul.f32 by 0f3DCCCCCD (fp32(0.1)), four st.global.v4;
the index logic modelled in numpy against the reference for 5 seeds at both sizes. Not checked
without a GPU: the run itself; that the codes reach the kernel as a torch float8_e4m3fn view through
DLPack (fine with torch 2.13 on the CPU; if the wrapper rejects the dtype, pass the uint8 bytes and
recast the register fragment); the speed (the 4 stores of a thread are 64 bytes apart per
instruction: a 4-byte-load / one-float4-store mapping would coalesce stores better, at 4x the threads).
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

_CACHE = {}


@cute.kernel
def gather_dequant_kernel(mSrc: cute.Tensor, mBT: cute.Tensor, mLens: cute.Tensor, mOut: cute.Tensor,
                          BS: cutlass.Constexpr, C: cutlass.Constexpr, V: cutlass.Constexpr, R: cutlass.Constexpr,
                          ROWS: cutlass.Constexpr, SCALE: cutlass.Constexpr):
    Q = V // 4
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    row = bid * ROWS + tidx // C
    c = tidx % C
    if row < mOut.shape[0]:
        # request of this row: the number of requests that end at or before it
        end = Int32(0)
        req = Int32(0)
        start = Int32(0)
        for i in cutlass.range_constexpr(R):
            end = end + mLens[i]
            if end <= row:
                req = req + 1
                start = end
        pos = row - start
        blk = mBT[req, pos // BS]
        ld = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mSrc.element_type, num_bits_per_copy=V * 8)
        st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
        codes = cute.make_rmem_tensor(cute.make_layout(V), mSrc.element_type)
        vals = cute.make_rmem_tensor(cute.make_layout((4, Q), stride=(1, 4)), Float32)
        cute.copy(ld, mSrc[blk, pos % BS, c, None], codes)
        x = codes.load().to(Float32) * Float32(SCALE)
        vals.store(x.reshape((4, Q)))
        for q in cutlass.range_constexpr(Q):
            cute.copy(st, vals[None, q], mOut[row, c * Q + q, None])


@cute.jit
def gather_dequant(mSrc: cute.Tensor, mBT: cute.Tensor, mLens: cute.Tensor, mOut: cute.Tensor, stream,
                   BS: cutlass.Constexpr, C: cutlass.Constexpr, V: cutlass.Constexpr, R: cutlass.Constexpr,
                   ROWS: cutlass.Constexpr, SCALE: cutlass.Constexpr):
    grid = (mOut.shape[0] + ROWS - 1) // ROWS
    gather_dequant_kernel(mSrc, mBT, mLens, mOut, BS, C, V, R, ROWS, SCALE).launch(
        grid=[grid, 1, 1], block=[ROWS * C, 1, 1], stream=stream
    )


def _kernel(NB: int, BS: int, E: int, R: int, W: int, scale: float):
    key = (NB, BS, E, R, W, scale)
    fn = _CACHE.get(key)
    if fn is None:
        V = next(v for v in (16, 8, 4) if E % v == 0)
        C = E // V
        ROWS = max(1, 256 // C)
        src = cute.runtime.make_fake_compact_tensor(cutlass.Float8E4M3FN, (NB, BS, C, V), stride_order=(3, 2, 1, 0),
                                                    assumed_align=16)
        bt = cute.runtime.make_fake_compact_tensor(Int32, (R, W), stride_order=(1, 0))
        lens = cute.runtime.make_fake_compact_tensor(Int32, (R,), stride_order=(0,))
        out = cute.runtime.make_fake_compact_tensor(Float32, (cute.sym_int(), C * V // 4, 4), stride_order=(2, 1, 0),
                                                    assumed_align=16)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(gather_dequant, src, bt, lens, out, stream, BS, C, V, R, ROWS, scale,
                          options="--enable-tvm-ffi")
        _CACHE[key] = fn
    return fn


def solve(src_cache, block_table, seq_lens, scale):
    NB, BS, E = src_cache.shape
    if E % 4:
        raise ValueError(f"cache row of {E} bytes: this kernel needs a multiple of 4")
    R, W = block_table.shape
    n = sum(seq_lens.tolist())  # the output size: 32 bytes read on the host (a declared structure input)
    V = next(v for v in (16, 8, 4) if E % v == 0)
    out = torch.empty((n, E), dtype=torch.float32, device=src_cache.device)
    src = src_cache.contiguous().view(torch.float8_e4m3fn).view(NB, BS, E // V, V)
    fn = _kernel(NB, BS, E, R, W, float(scale))
    fn(src, block_table.contiguous(), seq_lens.contiguous(), out.view(n, E // 4, 4))
    return out
