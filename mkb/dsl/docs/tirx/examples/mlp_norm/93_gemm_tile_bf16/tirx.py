"""Worked example (TIRx): C = A @ B^T in bf16 with warp-level tensor-core MMA (mma.sync m16n8k16).

What it shows, in the order a GEMM is built:
1. A and B are passed as int32 views (two bf16 per word, no copy) because mma.sync takes its
   operands as 32-bit registers holding bf16 pairs; C stays bf16.
2. Each CTA owns a 64 x 64 tile of C and walks K in steps of 32: its 128 threads copy the A and B
   tiles into shared memory with `int32x4` (16-byte) loads, then `Tx.cuda.cta_sync()`.
3. Each warp computes 32 x 32 of the tile as 2 x 4 m16n8k16 atoms. It gathers its fragments from
   shared memory by the PTX ISA's fragment layout (groupID g = lane / 4, t = lane % 4: A rows g and
   g + 8 at words t and t + 4 of the k16 slice; B column g at words t and t + 4) and issues
   `Tx.ptx.mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32(d0..d3, a0..a3, b0, b1, c0..c3)`
   with the fp32 accumulators as both d and c, in a local array kept for the whole K loop.
4. The epilogue rounds each accumulator to bf16 once; thread (g, t) owns rows g, g + 8 and columns
   2t, 2t + 1 of every atom.
Deliberately simple: no cp.async pipeline, no ldmatrix, no swizzle (bank conflicts), two barriers
per K tile; Hopper's fast path is wgmma + TMA (`Tx.ptx` has both). Requires M, N multiples of 64 and
K of 32; A, B, C row-major.
"""

import torch
import tvm
from tvm.script import tirx as Tx

BM, BN, BK = 64, 64, 32
NT = 128  # 4 warps, 2 x 2 over the tile
W = BK // 2  # int32 words (bf16 pairs) per K step of a row
_CACHE = {}


def _make(K: int):
    KW = K // 2

    @Tx.prim_func
    def gemm(a_ptr: Tx.handle, b_ptr: Tx.handle, c_ptr: Tx.handle):
        M = Tx.int32()
        N = Tx.int32()
        A = Tx.match_buffer(a_ptr, (M, KW), "int32")  # bf16 pairs along K
        B = Tx.match_buffer(b_ptr, (N, KW), "int32")
        C = Tx.match_buffer(c_ptr, (M, N), "bfloat16")
        Tx.device_entry()
        bm, bn = Tx.cta_id([M // BM, N // BN])
        tx = Tx.thread_id([NT])
        sA = Tx.alloc_shared((BM, W), "int32")
        sB = Tx.alloc_shared((BN, W), "int32")
        acc = Tx.alloc_local((2 * 4 * 4,), "float32")  # (mi, ni, 4 accumulators of an m16n8 atom)
        warp: Tx.let[Tx.int32] = tx // 32
        g: Tx.let[Tx.int32] = tx % 32 // 4
        t: Tx.let[Tx.int32] = tx % 4
        wm: Tx.let[Tx.int32] = warp // 2 * 32  # the warp's rows and columns within the tile
        wn: Tx.let[Tx.int32] = warp % 2 * 32
        for i in Tx.unroll(32):
            acc[i] = Tx.float32(0)
        for kt in Tx.serial(K // BK):
            for it in Tx.unroll(BM * W // 4 // NT):  # 16-byte vectors of the tile, 2 per thread
                v: Tx.let[Tx.int32] = it * NT + tx
                sA.vstore([v // 4, v % 4 * 4], A.vload([bm * BM + v // 4, kt * W + v % 4 * 4], dtype="int32x4"))
                sB.vstore([v // 4, v % 4 * 4], B.vload([bn * BN + v // 4, kt * W + v % 4 * 4], dtype="int32x4"))
            Tx.cuda.cta_sync()
            for ks in Tx.unroll(BK // 16):  # k16 slices: 8 words each
                for mi in Tx.unroll(2):
                    for ni in Tx.unroll(4):
                        r: Tx.let[Tx.int32] = wm + mi * 16 + g
                        n: Tx.let[Tx.int32] = wn + ni * 8 + g
                        o: Tx.let[Tx.int32] = (mi * 4 + ni) * 4
                        Tx.ptx.mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32(
                            acc[o], acc[o + 1], acc[o + 2], acc[o + 3],
                            Tx.reinterpret("uint32", sA[r, ks * 8 + t]),
                            Tx.reinterpret("uint32", sA[r + 8, ks * 8 + t]),
                            Tx.reinterpret("uint32", sA[r, ks * 8 + 4 + t]),
                            Tx.reinterpret("uint32", sA[r + 8, ks * 8 + 4 + t]),
                            Tx.reinterpret("uint32", sB[n, ks * 8 + t]),
                            Tx.reinterpret("uint32", sB[n, ks * 8 + 4 + t]),
                            acc[o], acc[o + 1], acc[o + 2], acc[o + 3],
                        )
            Tx.cuda.cta_sync()  # everyone has read the tiles before the next copy overwrites them
        for mi in Tx.unroll(2):
            for ni in Tx.unroll(4):
                row: Tx.let[Tx.int32] = bm * BM + wm + mi * 16 + g
                col: Tx.let[Tx.int32] = bn * BN + wn + ni * 8 + t * 2
                o2: Tx.let[Tx.int32] = (mi * 4 + ni) * 4
                C[row, col] = Tx.Cast("bfloat16", acc[o2])
                C[row, col + 1] = Tx.Cast("bfloat16", acc[o2 + 1])
                C[row + 8, col] = Tx.Cast("bfloat16", acc[o2 + 2])
                C[row + 8, col + 1] = Tx.Cast("bfloat16", acc[o2 + 3])

    return gemm


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(K: int):
    fn = _CACHE.get(K)
    if fn is None:
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            fn = tvm.compile(tvm.IRModule({"main": _make(K)}), target=target, tir_pipeline="tirx")
        _CACHE[K] = fn
    return fn


def solve(a, b):
    (M, K), N = a.shape, b.shape[0]
    if M % BM or N % BN or K % BK:
        raise ValueError(f"M={M}, N={N}, K={K}: this example needs M, N multiples of {BM} and K of {BK}")
    c = torch.empty(M, N, dtype=torch.bfloat16, device=a.device)
    _kernel(K)(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32), c)
    return c
