"""Baseline (CuTe DSL): Ring-flash router as a SIMT GEMM into fp32 logits, then one warp per token for the routing.

Kernel 1 (router GEMM, logits = hidden @ weight^T in fp32): register-blocked SIMT, 128 tokens x 128
experts per CTA, K step 16, 256 threads with an 8x8 micro-tile each (two 4-wide row and column
groups, 128-bit conflict-free shared reads). Each thread loads 8 bf16 of A and 8 of W per K step
with one 128-bit global load each, widens them to fp32 and stores them k-major in shared memory.
bf16 values are exact in fp32, so the products are exact and only the fp32 summation order differs
from a tensor-core or cuBLAS fp32 GEMM (~1e-6 on the logits). Tail rows are clamped (loaded from
the last row, never stored).
Kernel 2 (routing, fp32): one warp per token, lane l owns experts 8l..8l+7 (two 128-bit loads of
logits, one of bias), so a group of 32 experts is 4 adjacent lanes. s = sigmoid, c = s + bias;
each lane's top-2 of c, merged over its 4 lanes with xor shuffles (max/min are exact, so the group
score top1 + top2 is bit-identical to torch's); a group's rank = number of better groups (ties to
the lower group, as the margins of make_inputs exclude ties); experts of the 4 best groups stay
candidates. 8 rounds of warp argmax (value max, then the owner's index max, then that expert's s)
give the experts in descending order; lane 0 writes indices (int64) and s_k / sum(s) * scale.

Bound: compute. 2*T*D*E = 34.4 GFLOP. No tensor cores here: SIMT fp32 FMA peaks at ~67 TFLOP/s on
the H200, so this kernel needs >= 0.5 ms (expected ~1 ms, ~3% of the bf16 tensor-core speed of
light the problem is scored against, 989 TFLOP/s -> 35 us). Routing reads 16 MiB of logits (~10 us).
This is the simple, obviously-correct version; eager (the fp32 reference) runs an fp32 cuBLAS GEMM,
so expect this baseline to be near or below eager speed.

Unchecked without a GPU (least sure first): the Float32 -> Int64 conversion of the selected index
(`idx.to(Int32).to(Int64)`), the warp-uniform `if t < T` around shuffles, and whether
`cute.math.exp` (fastmath=False) matches torch's expf to within the weight tolerance.
"""

import math

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

BM, BN, BK, NT = 128, 128, 16, 256
N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
E = 256  # experts: 8 per lane of a warp
WPB = 8  # routing: tokens (warps) per CTA
_CACHE = {}


@cute.kernel
def router_gemm_kernel(mA: cute.Tensor, mW: cute.Tensor, mC: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mA.shape[0]
    N = mW.shape[0]
    KO = mA.shape[1]  # K / 8
    smem = cutlass.utils.SmemAllocator()
    As = smem.allocate_tensor(Float32, cute.make_layout((BK, BM // 4, 4), stride=(BM, 4, 1)), byte_alignment=16)
    Ws = smem.allocate_tensor(Float32, cute.make_layout((BK, BN // 4, 4), stride=(BN, 4, 1)), byte_alignment=16)
    g_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=128)
    s_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
    acc = cute.make_rmem_tensor(cute.make_layout(64), Float32)
    a0 = cute.make_rmem_tensor(cute.make_layout(4), Float32)
    a1 = cute.make_rmem_tensor(cute.make_layout(4), Float32)
    w0 = cute.make_rmem_tensor(cute.make_layout(4), Float32)
    w1 = cute.make_rmem_tensor(cute.make_layout(4), Float32)
    la = cute.make_rmem_tensor(cute.make_layout(8), cutlass.BFloat16)
    lw = cute.make_rmem_tensor(cute.make_layout(8), cutlass.BFloat16)
    ty = tidx // 16
    tc = tidx % 16
    lr = tidx // 2  # the tile row this thread loads (A: token, W: expert)
    lq = tidx % 2  # which 8-wide half of the K step
    ra = bm * BM + lr
    if ra >= M:
        ra = M - 1
    rw = bn * BN + lr
    if rw >= N:
        rw = N - 1
    for i in cutlass.range_constexpr(64):
        acc[i] = Float32(0.0)
    for kb in range(KO // 2):
        cute.copy(g_atom, mA[ra, kb * 2 + lq, None], la)
        cute.copy(g_atom, mW[rw, kb * 2 + lq, None], lw)
        for e in cutlass.range_constexpr(8):
            As[lq * 8 + e, lr // 4, lr % 4] = la[e].to(Float32)
            Ws[lq * 8 + e, lr // 4, lr % 4] = lw[e].to(Float32)
        cute.arch.sync_threads()
        for kk in cutlass.range_constexpr(BK):
            cute.copy(s_atom, As[kk, ty, None], a0)
            cute.copy(s_atom, As[kk, 16 + ty, None], a1)
            cute.copy(s_atom, Ws[kk, tc, None], w0)
            cute.copy(s_atom, Ws[kk, 16 + tc, None], w1)
            for i in cutlass.range_constexpr(4):
                for j in cutlass.range_constexpr(4):
                    acc[i * 8 + j] = acc[i * 8 + j] + a0[i] * w0[j]
                    acc[i * 8 + 4 + j] = acc[i * 8 + 4 + j] + a0[i] * w1[j]
                    acc[(4 + i) * 8 + j] = acc[(4 + i) * 8 + j] + a1[i] * w0[j]
                    acc[(4 + i) * 8 + 4 + j] = acc[(4 + i) * 8 + 4 + j] + a1[i] * w1[j]
        cute.arch.sync_threads()
    for i in cutlass.range_constexpr(8):
        for j in cutlass.range_constexpr(8):
            gr = bm * BM + (i // 4) * 64 + ty * 4 + i % 4
            gc = bn * BN + (j // 4) * 64 + tc * 4 + j % 4
            if gr < M and gc < N:
                mC[gr, gc] = acc[i * 8 + j]


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
    router_gemm_kernel(mA, mW, mL).launch(
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
