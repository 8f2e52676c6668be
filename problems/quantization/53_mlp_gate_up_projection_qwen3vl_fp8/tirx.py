"""Baseline (TIRx): fp8 gate/up projections + SiLU gating with mma.sync m16n8k32 e4m3 and fp32 block-scale promotion.

Strategy: one CTA (8 warps) computes a 128-row x 64-column tile of BOTH gate and up, so the
activation tile is read once for the two GEMMs and the SiLU gating happens in registers. CTAs run
M-fastest, so a wave of CTAs shares a few weight tiles and the whole fp8 activation (31 MB) stays
in L2 while the weights stream from HBM once. The K loop walks the 128-wide scale blocks. Per
block the CTA stores the raw fp8 codes (the fp8 tensors are passed as int32 views, 4 codes per
word, so no fp8 dtype crosses the FFI) of 128 activation rows and 64 gate + 64 up weight rows into
shared memory (rows padded to 144 bytes so the fragment reads below are bank-conflict free) from
registers, where the previous iteration prefetched them with 16-byte loads while its tensor cores
ran. Each warp (a 32-row x 32-column tile of gate and of up) runs
`mma.sync.m16n8k32.row.col.f32.e4m3.e4m3.f32` on the codes into a per-block fp32 accumulator, and
adds it times x_scale[m, kb] * w_scale[n // 128, kb] to the running fp32 accumulator (the
block-scaled fp8 GEMM recipe: one fp32 promotion per 128-wide K block). The epilogue computes
silu(gate) * up in fp32 and rounds once to bf16.

K order inside a block is permuted, identically for A and B, so that each thread reads its
fragments with one 16-byte shared load per row per half block: in k-step s (0..3) the thread with
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
GEMMs on wgmma) and than torch.compile. Why: the missing piece is wgmma (m64nNk32 e4m3 from shared-
memory descriptors) fed by TMA through a multi-stage mbarrier pipeline, i.e. the DeepGEMM design; it
was too risky to write without a GPU to test on.
Commit 84c0e11 holds an exact fp32 SIMT version of this kernel (no tensor cores).

Against torch.compile: 9337.9 us, 0.36x torch.compile (3395.3 us), 0.70x eager, 0.128 of the fp8 tensor-core speed
of light (problems/README.md speed table, events/h200-grader-2-2), as expected above: the emulated fp8 mma.sync is
the limit, a missing primitive on this path. The CuTe DSL baseline is 2153.7 us, 1.58x torch.compile
(events/h200-53-wgmma), with the design named above: wgmma m64n128k32 e4m3 from 128B-swizzled shared memory fed by a
TMA ring on mbarriers, a producer warp and two math warpgroups (setmaxnreg), TMA multicast across 2-CTA clusters.
Why TIRx did not get that design: TIRx as shipped (apache-tvm 0.27.0.post1) reaches each instruction of it, but only
as raw PTX, with no GEMM layer above it on Hopper. In the wheel, tvm/backend/cuda/ptx/table.py registers
wgmma.mma_async m64nNk32 .f32.e4m3.e4m3 (ss and rs forms, certified for sm_90a) with wgmma fence/commit/wait,
tvm/backend/cuda/tile_primitive/copy_async/tma.py accepts tiled TMA copies from SM90 on, and
Tx.cuda.wgmma.encode_matrix_descriptor builds shared-memory descriptors; but there is no wgmma tile primitive
(tile_primitive/gemm_async/ holds only tcgen05.py, tile_primitive/gemm/ only mma_m16n8k_.py for mma.sync), and the
mbarrier Pipeline helpers (tvm/backend/cuda/lang/pipeline.py) are documented as for SM100 kernels. mkb's TIRx notes
name the same raw route for Hopper GEMMs (mkb/dsl/docs/tirx/patterns.md, GEMM: raw Tx.ptx wgmma + TMA + mbarrier)
and hold no Hopper example of it. In CuTe DSL each piece of the design is a library call (PipelineTmaAsync, a
warpgroup MMA atom through make_tiled_mma, partition_C for the accumulator's coordinates, the TMA multicast copy
op); in TIRx each is hand-written (descriptors, the 128B swizzle, the accumulator fragment table, the barrier
protocol), and that was not attempted without a GPU to debug it on. So: a missing library layer rather than a
compiler limit (a raw Tx.ptx["wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"] call with descriptors from
encode_matrix_descriptor lowers and compiles to QGMMA.64x8x32.F32.E4M3.E4M3 for sm_90a: checked on the CPU with nvcc
13.0, not run), and not yet done.

Numerics: codes are multiplied exactly on the tensor cores; each 128-wide block's partial sum
(fp32, or the tensor core's internal accumulation) is scaled by x_scale * w_scale in fp32 and
added in fp32, so the result differs from the fp32 reference only by summation order and the
tensor core's accumulation inside a block (far below the bf16-output tolerance).

Risks not checked on a GPU: the fragment-to-register mapping (the lines building the mma
operands: `afr[... 2 * s2]` / `bfr[2 * s2]` and the accumulator index `h * 2 + c2` in the
promotion and epilogue loops), which is only as right as my reading of the PTX fragment tables; a
numpy emulation of this kernel's index logic (per-lane registers through those tables) matched the
reference at M = 40 and failed loudly when two A registers were swapped.
"""

import torch
import tvm
from tvm.script import tirx as Tx

BM, BN, KBLK, NT = 128, 64, 128, 256
RW = 36  # shared-memory row stride in int32 words (32 data words + 4 padding: conflict-free fragment reads)
MMA = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
_CACHE = {}


def _make(K: int):
    KW = K // 4  # int32 words per row: static, so that the 16-byte global loads are provably aligned
    KB = K // KBLK

    @Tx.prim_func
    def gate_up(x_ptr: Tx.handle, xs_ptr: Tx.handle, g_ptr: Tx.handle, gs_ptr: Tx.handle, u_ptr: Tx.handle,
                us_ptr: Tx.handle, o_ptr: Tx.handle):
        M = Tx.int32()
        N = Tx.int32()
        NB = Tx.int32()  # N / 128
        X = Tx.match_buffer(x_ptr, (M, KW), "int32")
        Xs = Tx.match_buffer(xs_ptr, (M, KB), "float32")
        G = Tx.match_buffer(g_ptr, (N, KW), "int32")
        Gsc = Tx.match_buffer(gs_ptr, (NB, KB), "float32")
        U = Tx.match_buffer(u_ptr, (N, KW), "int32")
        Usc = Tx.match_buffer(us_ptr, (NB, KB), "float32")
        O = Tx.match_buffer(o_ptr, (M, N), "bfloat16")
        Tx.device_entry()
        # M fastest: a wave of CTAs shares a few weight tiles, and the activation stays in L2
        bm, bn = Tx.cta_id([Tx.ceildiv(M, BM), Tx.ceildiv(N, BN)])
        tx = Tx.thread_id([NT])
        As = Tx.alloc_shared((BM, RW), "int32")
        Bs = Tx.alloc_shared((2 * BN, RW), "int32")  # rows 0..63 gate, 64..127 up
        tot = Tx.alloc_local((64,), "float32")  # [gate/up][mi][ni][4]
        blk = Tx.alloc_local((64,), "float32")
        afr = Tx.alloc_local((16,), "int32")  # [mi][h][4 words of the current half block]
        bfr = Tx.alloc_local((4,), "int32")
        pa = Tx.alloc_local((16,), "int32")  # next block's A codes, 4 x 16 bytes
        pb = Tx.alloc_local((16,), "int32")  # next block's B codes (chunks 0, 1: gate rows; 2, 3: up rows)
        sa = Tx.alloc_local((4,), "float32")  # [mi][h]
        warp: Tx.let[Tx.int32] = tx // 32
        lane: Tx.let[Tx.int32] = tx % 32
        g: Tx.let[Tx.int32] = lane // 4
        t: Tx.let[Tx.int32] = lane % 4
        wr: Tx.let[Tx.int32] = (warp % 4) * 32  # warp's first row in the CTA tile
        wc: Tx.let[Tx.int32] = (warp // 4) * 32  # warp's first column in the 64-wide gate/up tile
        nsb: Tx.let[Tx.int32] = (bn * BN) // 128  # weight scale row of this CTA's columns
        for i in Tx.unroll(64):
            tot[i] = Tx.float32(0)
        # prologue: block 0's codes into registers (rows past M or N are clamped here and zeroed in shared memory)
        for i in Tx.unroll(4):
            r0: Tx.let[Tx.int32] = Tx.min(bm * BM + (i * NT + tx) // 8, M - 1)
            n0: Tx.let[Tx.int32] = Tx.min(bn * BN + (i * NT + tx) // 8 % BN, N - 1)
            w0: Tx.let[Tx.int32] = ((i * NT + tx) % 8) * 4
            pa.vstore([i * 4], X.vload([r0, w0], dtype="int32x4"))
            if i < 2:
                pb.vstore([i * 4], G.vload([n0, w0], dtype="int32x4"))
            else:
                pb.vstore([i * 4], U.vload([n0, w0], dtype="int32x4"))
        for kb in Tx.serial(KB):
            # this block's scales: 4 activation rows per thread, one gate and one up weight block per CTA
            for e in Tx.unroll(4):
                srow: Tx.let[Tx.int32] = bm * BM + wr + (e // 2) * 16 + (e % 2) * 8 + g
                sa[e] = Tx.if_then_else(srow < M, Xs[Tx.min(srow, M - 1), kb], Tx.float32(0))
            sbg: Tx.let[Tx.float32] = Gsc[nsb, kb]
            sbu: Tx.let[Tx.float32] = Usc[nsb, kb]
            # registers -> shared memory (rows past M or N hold zeros)
            for i in Tx.unroll(4):
                row: Tx.let[Tx.int32] = (i * NT + tx) // 8
                ch: Tx.let[Tx.int32] = (i * NT + tx) % 8
                if bm * BM + row < M:
                    As.vstore([row, ch * 4], pa.vload([i * 4], dtype="int32x4"))
                else:
                    for e in Tx.unroll(4):
                        As[row, ch * 4 + e] = 0
                if bn * BN + row % BN < N:
                    Bs.vstore([row, ch * 4], pb.vload([i * 4], dtype="int32x4"))
                else:
                    for e in Tx.unroll(4):
                        Bs[row, ch * 4 + e] = 0
            Tx.cuda.cta_sync()
            # prefetch the next block's codes into registers while this one is multiplied
            if kb + 1 < KB:
                for i in Tx.unroll(4):
                    r1: Tx.let[Tx.int32] = Tx.min(bm * BM + (i * NT + tx) // 8, M - 1)
                    n1: Tx.let[Tx.int32] = Tx.min(bn * BN + (i * NT + tx) // 8 % BN, N - 1)
                    w1: Tx.let[Tx.int32] = (kb + 1) * 32 + ((i * NT + tx) % 8) * 4
                    pa.vstore([i * 4], X.vload([r1, w1], dtype="int32x4"))
                    if i < 2:
                        pb.vstore([i * 4], G.vload([n1, w1], dtype="int32x4"))
                    else:
                        pb.vstore([i * 4], U.vload([n1, w1], dtype="int32x4"))
            for i in Tx.unroll(64):
                blk[i] = Tx.float32(0)
            # two halves of the block: half hf holds words 8t + 4hf .. 8t + 4hf + 3 of each row (k-steps 2hf, 2hf + 1)
            for hf in Tx.unroll(2):
                for mh in Tx.unroll(4):  # A rows g and g+8 of each 16-row m-tile
                    arow: Tx.let[Tx.int32] = wr + (mh // 2) * 16 + (mh % 2) * 8 + g
                    afr.vstore([mh * 4], As.vload([arow, t * 8 + hf * 4], dtype="int32x4"))
                for sel in Tx.unroll(2):
                    for ni in Tx.unroll(4):
                        brow: Tx.let[Tx.int32] = sel * BN + wc + ni * 8 + g
                        bfr.vstore([0], Bs.vload([brow, t * 8 + hf * 4], dtype="int32x4"))
                        for s2 in Tx.unroll(2):
                            for mi in Tx.unroll(2):
                                d: Tx.let[Tx.int32] = sel * 32 + mi * 16 + ni * 4
                                Tx.ptx[MMA](
                                    blk[d], blk[d + 1], blk[d + 2], blk[d + 3],
                                    Tx.reinterpret("uint32", afr[(mi * 2) * 4 + 2 * s2]),  # row g, k 0-15
                                    Tx.reinterpret("uint32", afr[(mi * 2 + 1) * 4 + 2 * s2]),  # row g+8, k 0-15
                                    Tx.reinterpret("uint32", afr[(mi * 2) * 4 + 2 * s2 + 1]),  # row g, k 16-31
                                    Tx.reinterpret("uint32", afr[(mi * 2 + 1) * 4 + 2 * s2 + 1]),  # row g+8, k 16-31
                                    Tx.reinterpret("uint32", bfr[2 * s2]),
                                    Tx.reinterpret("uint32", bfr[2 * s2 + 1]),
                                    blk[d], blk[d + 1], blk[d + 2], blk[d + 3],
                                )
            Tx.cuda.cta_sync()
            # promote: tot += blk * x_scale[row] * w_scale (accumulator element h * 2 + c2 is row g + 8h)
            for mi in Tx.unroll(2):
                for ni in Tx.unroll(4):
                    for h in Tx.unroll(2):
                        for c2 in Tx.unroll(2):
                            j: Tx.let[Tx.int32] = mi * 16 + ni * 4 + h * 2 + c2
                            tot[j] = tot[j] + blk[j] * (sa[mi * 2 + h] * sbg)
                            tot[32 + j] = tot[32 + j] + blk[32 + j] * (sa[mi * 2 + h] * sbu)
        # epilogue: out = silu(gate) * up in fp32, rounded once to bf16
        for mi in Tx.unroll(2):
            for ni in Tx.unroll(4):
                for h in Tx.unroll(2):
                    for c2 in Tx.unroll(2):
                        orow: Tx.let[Tx.int32] = bm * BM + wr + mi * 16 + h * 8 + g
                        ocol: Tx.let[Tx.int32] = bn * BN + wc + ni * 8 + t * 2 + c2
                        if orow < M and ocol < N:
                            gv: Tx.let[Tx.float32] = tot[mi * 16 + ni * 4 + h * 2 + c2]
                            uv: Tx.let[Tx.float32] = tot[32 + mi * 16 + ni * 4 + h * 2 + c2]
                            O[orow, ocol] = Tx.Cast("bfloat16", gv / (Tx.float32(1) + Tx.exp(Tx.float32(0) - gv)) * uv)

    return gate_up


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


def _words(q):
    """fp8 codes [rows, K] as int32 words [rows, K/4] (a view: 4 codes per word, little-endian)."""
    return q.contiguous().view(torch.int32)


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
