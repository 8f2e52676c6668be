"""Worked example (CuTe DSL): C = A @ B^T in bf16 with warp-level tensor-core MMA (mma.sync m16n8k16).

What it shows, in the order a GEMM is built:
1. `cute.local_tile` cuts the CTA's tiles out of the global tensors: gA (BM, BK, k), gB (BN, BK, k),
   gC (BM, BN); the last mode of gA/gB walks K.
2. A tiled copy (`make_tiled_copy_tv`: 128 threads x 8 bf16 = 16-byte copies) moves each K tile of
   A and B into shared memory; every thread gets its slice with `get_slice(tidx).partition_S/D`.
3. A tiled MMA (`MmaF16BF16Op(BFloat16, Float32, (16, 8, 16))` tiled 2 x 2 over the 4 warps, each
   warp 32 x 32 of the 64 x 64 tile) partitions the shared tiles and the output for each thread
   (`partition_A/B/C`), builds the register fragments (`make_fragment_A/B/C`) and multiplies one
   k-block (16) at a time with `cute.gemm`; the fp32 accumulators stay in registers for all of K.
4. The epilogue converts the accumulators to bf16 once and writes them to the thread's C elements.
Deliberately simple: no cp.async pipeline, no ldmatrix, no swizzled shared memory (bank conflicts),
one barrier pair per K tile; the next steps are those (see CUTLASS's Ampere tensorop_gemm) and on
Hopper WGMMA + TMA. Requires M, N multiples of 64 and K of 32; A, B, C row-major.
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32

BM, BN, BK = 64, 64, 32
NT = 128  # 4 warps
_CACHE = {}


@cute.kernel
def gemm_kernel(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, tiled_copy: cute.TiledCopy,
                tiled_mma: cute.TiledMma):
    tidx, _, _ = cute.arch.thread_idx()
    bm, bn, _ = cute.arch.block_idx()
    gA = cute.local_tile(mA, (BM, BK), (bm, None))  # (BM, BK, K / BK)
    gB = cute.local_tile(mB, (BN, BK), (bn, None))  # (BN, BK, K / BK)
    gC = cute.local_tile(mC, (BM, BN), (bm, bn))  # (BM, BN)

    smem = cutlass.utils.SmemAllocator()
    sA = smem.allocate_tensor(BFloat16, cute.make_layout((BM, BK), stride=(BK, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(BFloat16, cute.make_layout((BN, BK), stride=(BK, 1)), byte_alignment=16)

    thr_copy = tiled_copy.get_slice(tidx)
    tAgA = thr_copy.partition_S(gA)  # this thread's 16-byte pieces of every K tile of A
    tAsA = thr_copy.partition_D(sA)
    tBgB = thr_copy.partition_S(gB)
    tBsB = thr_copy.partition_D(sB)

    thr_mma = tiled_mma.get_slice(tidx)
    tCsA = thr_mma.partition_A(sA)  # (MMA, MMA_M, MMA_K): what this thread feeds the tensor cores
    tCsB = thr_mma.partition_B(sB)
    tCgC = thr_mma.partition_C(gC)
    tCrA = tiled_mma.make_fragment_A(tCsA)  # registers
    tCrB = tiled_mma.make_fragment_B(tCsB)
    acc = tiled_mma.make_fragment_C(tCgC)
    acc.fill(0.0)

    for kt in range(cute.size(gA, mode=[2])):  # runtime loop over the K tiles
        cute.copy(tiled_copy, tAgA[None, None, None, kt], tAsA)
        cute.copy(tiled_copy, tBgB[None, None, None, kt], tBsB)
        cute.arch.sync_threads()  # the tiles are in shared memory
        cute.autovec_copy(tCsA, tCrA)
        cute.autovec_copy(tCsB, tCrB)
        for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):  # BK / 16 mma k-blocks
            cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)
        cute.arch.sync_threads()  # everyone has read the tiles before the next copy overwrites them

    out = cute.make_fragment_like(acc, BFloat16)
    out.store(acc.load().to(BFloat16))  # one rounding, as the reference
    cute.autovec_copy(out, tCgC)


@cute.jit
def gemm(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
    # threads tile the (rows, BK) tile 4 wide along K (4 x 8 bf16 = BK) and 32 tall; each copies 8 contiguous bf16
    tiled_copy = cute.make_tiled_copy_tv(atom, cute.make_layout((NT // 4, 4), stride=(4, 1)), cute.make_layout((1, 8)))
    mma = cute.nvgpu.warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16))
    tiled_mma = cute.make_tiled_mma(mma, cute.make_layout((2, 2, 1)), permutation_mnk=(32, 32, 16))
    grid = [mC.shape[0] // BM, mC.shape[1] // BN, 1]
    gemm_kernel(mA, mB, mC, tiled_copy, tiled_mma).launch(grid=grid, block=[NT, 1, 1], stream=stream)


def _kernel(K: int):
    fn = _CACHE.get(K)
    if fn is None:
        m, n = cute.sym_int(), cute.sym_int()
        a = cute.runtime.make_fake_compact_tensor(BFloat16, (m, K), stride_order=(1, 0), assumed_align=16)
        b = cute.runtime.make_fake_compact_tensor(BFloat16, (n, K), stride_order=(1, 0), assumed_align=16)
        c = cute.runtime.make_fake_compact_tensor(BFloat16, (m, n), stride_order=(1, 0), assumed_align=16)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(gemm, a, b, c, stream, options="--enable-tvm-ffi")
        _CACHE[K] = fn
    return fn


def solve(a, b):
    (M, K), N = a.shape, b.shape[0]
    if M % BM or N % BN or K % BK:
        raise ValueError(f"M={M}, N={N}, K={K}: this example needs M, N multiples of {BM} and K of {BK}")
    c = torch.empty(M, N, dtype=torch.bfloat16, device=a.device)
    _kernel(K)(a.contiguous(), b.contiguous(), c)
    return c
