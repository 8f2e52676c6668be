"""Baseline (CuTe DSL): Ring-flash router as a tensor-core GEMM into fp32 logits, then one warp per token for the routing.

Kernel 1 (router GEMM, logits = hidden @ weight^T, bf16 operands, fp32 accumulation): warp-level
mma.sync m16n8k16 (`cute.nvgpu.warp.MmaF16BF16Op`) tiled over 16 warps (4 x 4), CTA tile 128 tokens
x 128 experts x K step 32, so each warp issues 2 x 4 x 2 MMAs per K step. Each thread moves one
16-byte chunk of A and one of W per K step: global -> registers one K step
ahead (prefetch, so the loads overlap the MMAs), registers -> shared with 128-bit stores into rows
padded to 80 bytes (the 32-bit fragment reads of 8 rows x 4 lanes then hit 32 distinct banks);
fragments come from `thr_mma.partition_A/B` + `autovec_copy`, the epilogue writes the accumulator
fragment through `partition_C` of the output tile, predicated on the token tail (tail rows are
loaded clamped and never stored). Grid 2 x T/128 (256 CTAs at full size; ptxas: 124 registers,
one 512-thread CTA per SM, two waves on 132 SMs).
Accuracy: the MMAs of one K step accumulate into a fragment started from zero, which is then added
to the running sum with ordinary fp32 adds (round to nearest). Tensor cores accumulate with
truncation; chaining all 256 k16 MMAs of K = 4096 in one accumulator could bias the logits by up
to ~1e-5 (an estimate, not measured), enough to put topk_weights outside the grader's
3 x (fp32 reference error) on some of the 131072 weights. With this split the chained part is 2
MMAs and the long sum is 128 RN adds, no worse than the fp32 reference's own 4096 FFMAs (the
problem's notes expect ~1e-6 on logits).
Kernel 2 (routing, fp32): one warp per token, lane l owns experts 8l..8l+7 (two 128-bit loads of
logits, one of bias), so a group of 32 experts is 4 adjacent lanes. s = sigmoid, c = s + bias;
each lane's top-2 of c, merged over its 4 lanes with xor shuffles (max/min are exact, so the group
score top1 + top2 is bit-identical to torch's); a group's rank = number of better groups (ties to
the lower group, as the margins of make_inputs exclude ties); experts of the 4 best groups stay
candidates. 8 rounds of warp argmax (value max, then the owner's index max, then that expert's s)
give the experts in descending order; lane 0 writes indices (int64) and s_k / sum(s) * scale.

Bound: compute. 2*T*D*E = 34.4 GFLOP against the bf16 tensor-core peak (989 TFLOP/s -> 35 us);
operands 130 MiB (hidden 128 MiB, read once per expert half = twice, mostly from L2 for the
second) -> ~40 us at 4.8 TB/s, so the floor is ~40-50 us. Expected: mma.sync without ldmatrix,
without cp.async multi-stage pipelining and with two barriers per K step reaches maybe 30-50% of
the tensor-core peak -> ~70-120 us, plus ~10 us of routing (16 MiB of logits). WGMMA + TMA with a
fused routing epilogue is the next step (the logits round trip and the second launch would go).

Unchecked without a GPU (least sure first): that `autovec_copy` from the shared partitions fills
the MMA fragments in the order `cute.gemm` expects (the partitions' coordinates were printed at
trace time and match the PTX fragment layout), the Float32 -> Int64 conversion of the selected
index, and whether `cute.math.exp` (fastmath=False) matches torch's expf within the weight
tolerance. The branch history holds a SIMT fp32 GEMM version of kernel 1 (simpler, ~10x slower).
"""

import math

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

BM, BN, BK, NT = 128, 128, 32, 512  # router GEMM CTA tile (tokens, experts, K step), threads
LDS = BK + 8  # shared row stride in bf16: 80 bytes keeps rows 16-byte aligned and the fragment reads conflict-free
CPT = BM * BK // 8 // NT  # 16-byte chunks of A (and of W) each thread moves per K step
MMA_WARPS = (4, 4, 1)  # 16 warps over (M, N, K): each warp owns 32 tokens x 32 experts
N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
E = 256  # experts: 8 per lane of a warp
WPB = 8  # routing: tokens (warps) per CTA
_CACHE = {}


@cute.kernel
def router_gemm_kernel(mA: cute.Tensor, mW: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mA.shape[0]
    KO = mA.shape[1]  # K / 8
    smem = cutlass.utils.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.BFloat16, cute.make_layout((BM, BK), stride=(LDS, 1)), byte_alignment=16)
    sW = smem.allocate_tensor(cutlass.BFloat16, cute.make_layout((BN, BK), stride=(LDS, 1)), byte_alignment=16)
    # the same tiles as rows of 16-byte chunks, for the 128-bit stores
    sA8 = cute.make_tensor(sA.iterator, cute.make_layout((BM, BK // 8, 8), stride=(LDS, 8, 1)))
    sW8 = cute.make_tensor(sW.iterator, cute.make_layout((BN, BK // 8, 8), stride=(LDS, 8, 1)))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=128)
    thr_mma = tiled_mma.get_slice(tidx)
    tCsA = thr_mma.partition_A(sA)
    tCsW = thr_mma.partition_B(sW)
    tCrA = tiled_mma.make_fragment_A(tCsA)
    tCrW = tiled_mma.make_fragment_B(tCsW)
    gC = cute.local_tile(mC, (BM, BN), (bm, bn))
    tCgC = thr_mma.partition_C(gC)
    tCcC = thr_mma.partition_C(cute.make_identity_tensor((BM, BN)))
    acc = tiled_mma.make_fragment_C(tCgC)  # the running sum, added in fp32 with round-to-nearest
    part = tiled_mma.make_fragment_C(tCgC)  # one K step's MMAs, started from zero
    acc.fill(0.0)
    # each thread moves CPT 16-byte chunks of A and of W per K step: chunk tidx + h*NT is (row, q) of the tile
    q = tidx % (BK // 8)
    la = [cute.make_rmem_tensor(cute.make_layout(8), cutlass.BFloat16) for _ in range(CPT)]
    lw = [cute.make_rmem_tensor(cute.make_layout(8), cutlass.BFloat16) for _ in range(CPT)]
    ra = [tidx // (BK // 8) + h * (NT // (BK // 8)) for h in range(CPT)]  # tile rows of this thread's chunks
    ga = [cutlass.min(bm * BM + ra[h], M - 1) for h in range(CPT)]  # tail rows: clamped loads, never stored
    nk = KO // (BK // 8)
    # prologue: K step 0 into registers
    for h in cutlass.range_constexpr(CPT):
        cute.copy(atom, mA[ga[h], q, None], la[h])
        cute.copy(atom, mW[bn * BN + ra[h], q, None], lw[h])
    for kb in range(nk):
        for h in cutlass.range_constexpr(CPT):
            cute.copy(atom, la[h], sA8[ra[h], q, None])
            cute.copy(atom, lw[h], sW8[ra[h], q, None])
        cute.arch.sync_threads()
        # prefetch the next K step into registers while this one is multiplied
        if kb + 1 < nk:
            for h in cutlass.range_constexpr(CPT):
                cute.copy(atom, mA[ga[h], (kb + 1) * (BK // 8) + q, None], la[h])
                cute.copy(atom, mW[bn * BN + ra[h], (kb + 1) * (BK // 8) + q, None], lw[h])
        cute.autovec_copy(tCsA, tCrA)
        cute.autovec_copy(tCsW, tCrW)
        part.fill(0.0)
        cute.gemm(tiled_mma, part, tCrA, tCrW, part)
        acc.store(acc.load() + part.load())
        cute.arch.sync_threads()
    rows_left = M - bm * BM
    for i in cutlass.range_constexpr(cute.size(acc)):
        if tCcC[i][0] < rows_left:
            tCgC[i] = acc[i]


@cute.kernel
def route_kernel(mL: cute.Tensor, mBias: cute.Tensor, mIdx: cute.Tensor, mWt: cute.Tensor, SCALE: cutlass.Constexpr):
    warp = cute.arch.warp_idx()
    lane = cute.arch.lane_idx()
    bidx, _, _ = cute.arch.block_idx()
    T = mL.shape[0]
    t = bidx * WPB + warp
    f_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
    h_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=128)
    l0 = cute.make_rmem_tensor(cute.make_layout(4), Float32)
    l1 = cute.make_rmem_tensor(cute.make_layout(4), Float32)
    bq = cute.make_rmem_tensor(cute.make_layout(8), cutlass.BFloat16)
    s = cute.make_rmem_tensor(cute.make_layout(8), Float32)
    c = cute.make_rmem_tensor(cute.make_layout(8), Float32)
    sel = cute.make_rmem_tensor(cute.make_layout(TOP_K), Float32)
    if t < T:  # warp-uniform: every lane of a warp has the same t
        cute.copy(f_atom, mL[t, lane * 2, None], l0)
        cute.copy(f_atom, mL[t, lane * 2 + 1, None], l1)
        cute.copy(h_atom, mBias[lane, None], bq)
        for j in cutlass.range_constexpr(8):
            x = Float32(0.0)
            if cutlass.const_expr(j < 4):
                x = l0[j]
            else:
                x = l1[j - 4]
            sj = Float32(1.0) / (Float32(1.0) + cute.math.exp(-x))
            s[j] = sj
            c[j] = sj + bq[j].to(Float32)
        # this lane's two largest c, then merged over the 4 lanes of the group
        m1 = c[0]
        m2 = Float32(-math.inf)
        for j in cutlass.range_constexpr(1, 8):
            m2 = cute.arch.fmax(m2, cute.arch.fmin(m1, c[j]))
            m1 = cute.arch.fmax(m1, c[j])
        for off in cutlass.range_constexpr(1, 3):
            o1 = cute.arch.shuffle_sync_bfly(m1, offset=off)
            o2 = cute.arch.shuffle_sync_bfly(m2, offset=off)
            m2 = cute.arch.fmax(cute.arch.fmin(m1, o1), cute.arch.fmax(m2, o2))
            m1 = cute.arch.fmax(m1, o1)
        gs = m1 + m2
        g = lane // 4
        rank = cutlass.Int32(0)
        for h in cutlass.range_constexpr(N_GROUP):
            o = cute.arch.shuffle_sync(gs, offset=4 * h)
            if o > gs:
                rank = rank + 1
            if o == gs:
                if g > h:  # a tie goes to the lower group (cannot occur on make_inputs' draws)
                    rank = rank + 1
        if rank >= TOPK_GROUP:
            for j in cutlass.range_constexpr(8):
                c[j] = Float32(-math.inf)
        for k in cutlass.range_constexpr(TOP_K):
            lb = c[0]
            lj = Float32(0.0)
            for j in cutlass.range_constexpr(1, 8):
                if c[j] > lb:
                    lb = c[j]
                    lj = Float32(j)
            v = cute.arch.warp_reduction(lb, cute.arch.fmax)
            cand = Float32(-1.0)
            if lb == v:
                cand = Float32(lane * 8) + lj
            idx = cute.arch.warp_reduction(cand, cute.arch.fmax)  # the winner's expert index (exact in fp32)
            sc = Float32(0.0)
            for j in cutlass.range_constexpr(8):
                if Float32(lane * 8 + j) == idx:
                    sc = s[j]
                    c[j] = Float32(-math.inf)
            sk = cute.arch.warp_reduction(sc, cute.arch.fmax)  # s > 0, so the owner's s wins
            sel[k] = sk
            if lane == 0:
                mIdx[t, k] = idx.to(cutlass.Int32).to(cutlass.Int64)
        if lane == 0:
            tot = sel[0]
            for k in cutlass.range_constexpr(1, TOP_K):
                tot = tot + sel[k]
            for k in cutlass.range_constexpr(TOP_K):
                mWt[t, k] = sel[k] / tot * Float32(SCALE)


@cute.jit
def router(mA: cute.Tensor, mW: cute.Tensor, mBias: cute.Tensor, mL: cute.Tensor, mL4: cute.Tensor,
           mIdx: cute.Tensor, mWt: cute.Tensor, stream, SCALE: cutlass.Constexpr):
    M = mA.shape[0]
    N = mW.shape[0]
    tiled_mma = cute.make_tiled_mma(cute.nvgpu.warp.MmaF16BF16Op(cutlass.BFloat16, Float32, (16, 8, 16)),
                                    cute.make_layout(MMA_WARPS))
    router_gemm_kernel(mA, mW, mL, tiled_mma).launch(
        grid=[(N + BN - 1) // BN, (M + BM - 1) // BM, 1], block=[NT, 1, 1], stream=stream
    )
    route_kernel(mL4, mBias, mIdx, mWt, SCALE).launch(
        grid=[(M + WPB - 1) // WPB, 1, 1], block=[WPB * 32, 1, 1], stream=stream
    )


def _kernel(key):
    fn = _CACHE.get(key)
    if fn is None:
        D, SCALE = key
        T = cute.sym_int()
        rm = lambda dt, shape, align=16: cute.runtime.make_fake_compact_tensor(
            dt, shape, stride_order=tuple(reversed(range(len(shape)))), assumed_align=align)
        args = (
            rm(cutlass.BFloat16, (T, D // 8, 8)), rm(cutlass.BFloat16, (E, D // 8, 8)), rm(cutlass.BFloat16, (E // 8, 8)),
            rm(Float32, (T, E)), rm(Float32, (T, E // 4, 4)), rm(cutlass.Int64, (T, TOP_K)), rm(Float32, (T, TOP_K)),
        )
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(router, *args, stream, SCALE, options="--enable-tvm-ffi")
        _CACHE[key] = fn
    return fn


def solve(hidden_states, weight, expert_bias, routed_scaling_factor):
    T, D = hidden_states.shape
    if weight.shape != (E, D) or expert_bias.shape != (E,) or D % BK:
        raise ValueError(f"unsupported router shape: hidden {tuple(hidden_states.shape)}, weight {tuple(weight.shape)}")
    dev = hidden_states.device
    logits = torch.empty((T, E), dtype=torch.float32, device=dev)
    idx = torch.empty((T, TOP_K), dtype=torch.int64, device=dev)
    wts = torch.empty((T, TOP_K), dtype=torch.float32, device=dev)
    fn = _kernel((D, float(routed_scaling_factor)))
    fn(hidden_states.contiguous().view(T, D // 8, 8), weight.contiguous().view(E, D // 8, 8),
       expert_bias.contiguous().view(E // 8, 8), logits, logits.view(T, E // 4, 4), idx, wts)
    return idx, wts
