"""Baseline (CuTe DSL): fp8 gate/up projections + SiLU gating with mma.sync m16n8k32 e4m3 and fp32 block-scale promotion.

Strategy: one CTA (8 warps) computes a 128-row x 64-column tile of BOTH gate and up, so the
activation tile is read once for the two GEMMs and the SiLU gating happens in registers. CTAs run
M-fastest, so a wave of CTAs shares a few weight tiles and the whole fp8 activation (31 MB) stays
in L2 while the weights stream from HBM once. The K loop walks the 128-wide scale blocks. Per
block the CTA stores the raw fp8 codes (the fp8 tensors are passed as int32 views, 4 codes per
word, so no fp8 dtype crosses the FFI) of 128 activation rows and 64 gate + 64 up weight rows into
shared memory (rows padded to 144 bytes so the fragment reads below are bank-conflict free) from
registers, where the previous iteration prefetched them with 128-bit loads while its tensor cores
ran. Each warp (a 32-row x 32-column tile of gate and of up) runs `cute.gemm` with the warp-level
`MmaFP8Op` atom (mma.sync.m16n8k32.row.col.f32.e4m3.e4m3.f32) on the codes into a per-block fp32
accumulator, and adds it times x_scale[m, kb] * w_scale[n // 128, kb] to the running fp32
accumulator (the block-scaled fp8 GEMM recipe: one fp32 promotion per 128-wide K block). The
epilogue computes silu(gate) * up in fp32 and rounds once to bf16.

The operands of each atom call are rank-3 register tensors ((4,1,1) words for A, (2,1,1) for B,
(4,1,1) fp32 for C/D) recast to Float8E4M3FN: the atom passes their registers to the instruction
in order (checked in the generated PTX on the CPU), so word i of `aw` is the PTX fragment register
a_i. K order inside a block is permuted, identically for A and B, so that each thread reads its
fragments with one 128-bit shared load per row per half block: in k-step s (0..3) the thread with
t = lane % 4 feeds the mma's logical columns 4t..4t+3 from code word 8t + 2s and 16+4t..16+4t+3
from word 8t + 2s + 1 (a bijection of the block's 32 words; the scale is uniform inside a block,
so any common permutation gives the same sum). Fragment registers follow the PTX ISA tables for
m16n8k32 with 8-bit types: A {row g, row g+8} x {k 0-15, k 16-31}, B {k 0-15, k 16-31} at column
g, D {row g: cols 2t, 2t+1; row g+8: cols 2t, 2t+1}, with g = lane // 4.

Bound: compute. 2 x 2 x 8704 x 3584 x 18944 = 2.36 TFLOP; the H200's dense fp8 peak (~1979 TFLOP/s,
wgmma) gives ~1.2 ms. This kernel cannot get near it: `mma.sync ... e4m3` is an Ada (sm_89)
instruction that sm_90 runs emulated. ptxas lowers each one to F2FP.F16.E4M3 conversions and two
fp16 HMMA.16816.F32 (seen in the SASS of the sm_90a build: 128 HMMA and 224 F2FP per thread per
128-wide block). The conversion is exact, so the numerics are unaffected, but the speed is the
legacy fp16 mma.sync rate, well under the 989 TFLOP/s bf16 peak. On top of that: one stage of shared
memory with a register prefetch, and 255 registers per thread (ptxas, no spills), so one CTA of 8
warps per SM. Expect several ms, likely slower than eager (dequantise to bf16, then two cuBLAS bf16
GEMMs on wgmma) and than torch.compile. Why: the missing piece is wgmma (m64nNk32 e4m3,
`cute.nvgpu.warpgroup`) fed by TMA through a multi-stage `PipelineTmaAsync`, i.e. the DeepGEMM
design; it was too risky to write without a GPU to test on.
Commit 84c0e11 holds an exact fp32 SIMT version of this kernel (no tensor cores).

Numerics: codes are multiplied exactly on the tensor cores; each 128-wide block's partial sum is
scaled by x_scale * w_scale in fp32 and added in fp32, so the result differs from the fp32
reference only by summation order and the tensor core's accumulation inside a block (far below
the bf16-output tolerance).

Risks not checked on a GPU: the fragment-to-register mapping (the `aw[...]` / `bw[...]`
assignments before `cute.gemm` and the accumulator index `h * 2 + c2` in the promotion and
epilogue loops), which is only as right as my reading of the PTX fragment tables; a numpy
emulation of the same index logic (per-lane registers through those tables) matched the reference
at M = 40 and failed loudly when two A registers were swapped, and the generated PTX feeds the
mma exactly those registers.
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

BM, BN, KBLK, NT = 128, 64, 128, 256
RC = 9  # 16-byte chunks per shared-memory row (8 data + 1 padding: 144-byte rows, conflict-free fragment reads)
_CACHE = {}


@cute.kernel
def gate_up_kernel(mX: cute.Tensor, mXs: cute.Tensor, mG: cute.Tensor, mGs: cute.Tensor, mU: cute.Tensor,
                   mUs: cute.Tensor, mOut: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bm, bn, _ = cute.arch.block_idx()  # M fastest: a wave shares weight tiles, the activation stays in L2
    M = mX.shape[0]
    N = mG.shape[0]
    KB = mXs.shape[1]
    smem = cutlass.utils.SmemAllocator()
    As = smem.allocate_tensor(Int32, cute.make_layout((BM, RC, 4), stride=(RC * 4, 4, 1)), byte_alignment=16)
    Bs = smem.allocate_tensor(Int32, cute.make_layout((2 * BN, RC, 4), stride=(RC * 4, 4, 1)), byte_alignment=16)
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=128)
    mma = cute.make_mma_atom(cute.nvgpu.warp.MmaFP8Op(cutlass.Float8E4M3FN, Float32, (16, 8, 32)))
    zero = cute.make_rmem_tensor(cute.make_layout(4), Int32)
    pa = [cute.make_rmem_tensor(cute.make_layout(4), Int32) for _ in range(4)]  # next block's A codes, 4 x 16 bytes
    pb = [cute.make_rmem_tensor(cute.make_layout(4), Int32) for _ in range(4)]  # next block's B: 0, 1 gate; 2, 3 up
    afr = [cute.make_rmem_tensor(cute.make_layout(4), Int32) for _ in range(4)]  # [mi][h]: 4 words of the half block
    bfr = cute.make_rmem_tensor(cute.make_layout(4), Int32)
    aw = cute.make_rmem_tensor(cute.make_layout((4, 1, 1)), Int32)
    bw = cute.make_rmem_tensor(cute.make_layout((2, 1, 1)), Int32)
    af = cute.recast_tensor(aw, cutlass.Float8E4M3FN)
    bf = cute.recast_tensor(bw, cutlass.Float8E4M3FN)
    blk = [cute.make_rmem_tensor(cute.make_layout((4, 1, 1)), Float32) for _ in range(16)]  # [sel][mi][ni]
    tot = cute.make_rmem_tensor(cute.make_layout(64), Float32)  # [sel][mi][ni][4]
    sa = cute.make_rmem_tensor(cute.make_layout(4), Float32)  # [mi][h]
    warp = tidx // 32
    lane = tidx % 32
    g = lane // 4
    t = lane % 4
    wr = (warp % 4) * 32  # warp's first row in the CTA tile
    wc = (warp // 4) * 32  # warp's first column in the 64-wide gate/up tile
    nsb = (bn * BN) // 128  # weight scale row of this CTA's columns
    for e in cutlass.range_constexpr(4):
        zero[e] = Int32(0)
    for i in cutlass.range_constexpr(64):
        tot[i] = Float32(0.0)
    # prologue: block 0's codes into registers (rows past M or N are clamped here and zeroed in shared memory)
    for i in cutlass.range_constexpr(4):
        row = (i * NT + tidx) // 8
        ch = (i * NT + tidx) % 8
        cute.copy(atom, mX[cutlass.min(bm * BM + row, M - 1), ch, None], pa[i])
        if cutlass.const_expr(i < 2):
            cute.copy(atom, mG[cutlass.min(bn * BN + row % BN, N - 1), ch, None], pb[i])
        else:
            cute.copy(atom, mU[cutlass.min(bn * BN + row % BN, N - 1), ch, None], pb[i])
    for kb in range(KB):
        # this block's scales: 4 activation rows per thread, one gate and one up weight block per CTA
        for e in cutlass.range_constexpr(4):
            srow = bm * BM + wr + (e // 2) * 16 + (e % 2) * 8 + g
            if srow < M:
                sa[e] = mXs[srow, kb]
            else:
                sa[e] = Float32(0.0)
        sbg = mGs[nsb, kb]
        sbu = mUs[nsb, kb]
        # registers -> shared memory
        for i in cutlass.range_constexpr(4):
            row = (i * NT + tidx) // 8
            ch = (i * NT + tidx) % 8
            if bm * BM + row < M:
                cute.copy(atom, pa[i], As[row, ch, None])
            else:
                cute.copy(atom, zero, As[row, ch, None])
            if bn * BN + row % BN < N:
                cute.copy(atom, pb[i], Bs[row, ch, None])
            else:
                cute.copy(atom, zero, Bs[row, ch, None])
        cute.arch.sync_threads()
        # prefetch the next block's codes into registers while this one is multiplied
        if kb + 1 < KB:
            for i in cutlass.range_constexpr(4):
                row = (i * NT + tidx) // 8
                ch = (i * NT + tidx) % 8
                cute.copy(atom, mX[cutlass.min(bm * BM + row, M - 1), (kb + 1) * 8 + ch, None], pa[i])
                if cutlass.const_expr(i < 2):
                    cute.copy(atom, mG[cutlass.min(bn * BN + row % BN, N - 1), (kb + 1) * 8 + ch, None], pb[i])
                else:
                    cute.copy(atom, mU[cutlass.min(bn * BN + row % BN, N - 1), (kb + 1) * 8 + ch, None], pb[i])
        for q in cutlass.range_constexpr(16):
            for e in cutlass.range_constexpr(4):
                blk[q][e, 0, 0] = Float32(0.0)
        # two halves of the block: half hf holds words 8t + 4hf .. 8t + 4hf + 3 of each row (k-steps 2hf, 2hf + 1)
        for hf in cutlass.range_constexpr(2):
            for mh in cutlass.range_constexpr(4):  # A rows g and g+8 of each 16-row m-tile
                arow = wr + (mh // 2) * 16 + (mh % 2) * 8 + g
                cute.copy(atom, As[arow, 2 * t + hf, None], afr[mh])
            for sel in cutlass.range_constexpr(2):
                for ni in cutlass.range_constexpr(4):
                    brow = sel * BN + wc + ni * 8 + g
                    cute.copy(atom, Bs[brow, 2 * t + hf, None], bfr)
                    for s2 in cutlass.range_constexpr(2):
                        bw[0, 0, 0] = bfr[2 * s2]
                        bw[1, 0, 0] = bfr[2 * s2 + 1]
                        for mi in cutlass.range_constexpr(2):
                            aw[0, 0, 0] = afr[mi * 2][2 * s2]  # row g, k 0-15
                            aw[1, 0, 0] = afr[mi * 2 + 1][2 * s2]  # row g+8, k 0-15
                            aw[2, 0, 0] = afr[mi * 2][2 * s2 + 1]  # row g, k 16-31
                            aw[3, 0, 0] = afr[mi * 2 + 1][2 * s2 + 1]  # row g+8, k 16-31
                            acc = blk[sel * 8 + mi * 4 + ni]
                            cute.gemm(mma, acc, af, bf, acc)
        cute.arch.sync_threads()
        # promote: tot += blk * x_scale[row] * w_scale (accumulator element h * 2 + c2 is row g + 8h)
        for mi in cutlass.range_constexpr(2):
            for ni in cutlass.range_constexpr(4):
                for h in cutlass.range_constexpr(2):
                    for c2 in cutlass.range_constexpr(2):
                        j = mi * 16 + ni * 4 + h * 2 + c2
                        tot[j] = tot[j] + blk[mi * 4 + ni][h * 2 + c2, 0, 0] * (sa[mi * 2 + h] * sbg)
                        tot[32 + j] = tot[32 + j] + blk[8 + mi * 4 + ni][h * 2 + c2, 0, 0] * (sa[mi * 2 + h] * sbu)
    # epilogue: out = silu(gate) * up in fp32, rounded once to bf16
    for mi in cutlass.range_constexpr(2):
        for ni in cutlass.range_constexpr(4):
            for h in cutlass.range_constexpr(2):
                for c2 in cutlass.range_constexpr(2):
                    orow = bm * BM + wr + mi * 16 + h * 8 + g
                    ocol = bn * BN + wc + ni * 8 + t * 2 + c2
                    if orow < M and ocol < N:
                        gv = tot[mi * 16 + ni * 4 + h * 2 + c2]
                        uv = tot[32 + mi * 16 + ni * 4 + h * 2 + c2]
                        mOut[orow, ocol] = (gv / (Float32(1.0) + cute.math.exp(-gv)) * uv).to(mOut.element_type)


@cute.jit
def gate_up(mX: cute.Tensor, mXs: cute.Tensor, mG: cute.Tensor, mGs: cute.Tensor, mU: cute.Tensor, mUs: cute.Tensor,
            mOut: cute.Tensor, stream):
    M = mX.shape[0]
    N = mG.shape[0]
    gate_up_kernel(mX, mXs, mG, mGs, mU, mUs, mOut).launch(
        grid=[(M + BM - 1) // BM, (N + BN - 1) // BN, 1], block=[NT, 1, 1], stream=stream
    )


def _kernel(k: int):
    """Compiled for one K (static, so the 16-byte loads are provably aligned); M and N are dynamic."""
    fn = _CACHE.get(k)
    if fn is None:
        m, n, nb = cute.sym_int(), cute.sym_int(), cute.sym_int()
        x = cute.runtime.make_fake_compact_tensor(Int32, (m, k // 16, 4), stride_order=(2, 1, 0), assumed_align=16)
        xs = cute.runtime.make_fake_compact_tensor(Float32, (m, k // KBLK), stride_order=(1, 0))
        w_g = cute.runtime.make_fake_compact_tensor(Int32, (n, k // 16, 4), stride_order=(2, 1, 0), assumed_align=16)
        w_u = cute.runtime.make_fake_compact_tensor(Int32, (n, k // 16, 4), stride_order=(2, 1, 0), assumed_align=16)
        ws_g = cute.runtime.make_fake_compact_tensor(Float32, (nb, k // KBLK), stride_order=(1, 0))
        ws_u = cute.runtime.make_fake_compact_tensor(Float32, (nb, k // KBLK), stride_order=(1, 0))
        out = cute.runtime.make_fake_compact_tensor(cutlass.BFloat16, (m, n), stride_order=(1, 0))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(gate_up, x, xs, w_g, ws_g, w_u, ws_u, out, stream, options="--enable-tvm-ffi")
        _CACHE[k] = fn
    return fn


def _words(q):
    """fp8 codes [rows, K] as int32 words [rows, K/16, 4] (a view: 4 codes per word, little-endian)."""
    return q.contiguous().view(torch.int32).view(q.shape[0], q.shape[1] // 16, 4)


def solve(x, x_scale, w_gate, w_gate_scale, w_up, w_up_scale):
    m, k = x.shape
    n = w_gate.shape[0]
    if k % KBLK or n % 128 or tuple(w_up.shape) != (n, k):
        raise ValueError(f"need K and N multiples of 128 and matching gate/up weights, got x {tuple(x.shape)}, "
                         f"w_gate {tuple(w_gate.shape)}, w_up {tuple(w_up.shape)}")
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    _kernel(k)(_words(x), x_scale.contiguous(), _words(w_gate), w_gate_scale.contiguous(), _words(w_up),
               w_up_scale.contiguous(), out)
    return out
