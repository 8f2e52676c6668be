"""Baseline (TIRx): Ring-flash router as a tensor-core GEMM into fp32 logits, then one warp per token for the routing.

Kernel 1 (router GEMM, logits = hidden @ weight^T, bf16 operands, fp32 accumulation): raw PTX
`mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` through `Tx.ptx[...]` (the `Tx.warp.gemm`
tile primitive needs TileLayout fragment layouts; the raw instruction with the PTX fragment layout
written out is shorter and checkable). 16 warps as 4 (tokens) x 4 (experts), each owning 32 tokens
x 32 experts = 2 x 4 m16n8 tiles; CTA tile 128 x 128, K step 32. A and W travel as int32 views
(two bf16 per word, element 2i in the low half, exactly the packing mma wants), so each thread
moves one 16-byte chunk of A and one of W per K step: global -> registers one K step ahead
(prefetch, overlapping the MMAs), registers -> shared (`int32x4` stores into rows padded to 20
words, so the fragment reads of 8 rows x 4 lanes hit 32 distinct banks), then 32-bit fragment
reads: a0..a3 = rows g, g+8 x k-words tg, tg+4; b0, b1 = expert g x k-words tg, tg+4; c0, c1 at
row g, columns 2tg, 2tg+1 and c2, c3 at row g+8 (g = lane/4, tg = lane%4). D is a compile-time
constant: with a dynamic row stride TVM cannot prove 16-byte alignment and splits every vector
load into 4 scalar loads (the same holds for a `bfloat16x8` vload, which even emits an 8-lane gather
nvcc rejects). Tail tokens are loaded clamped and never stored. nvcc: 96 registers, 20 KiB
shared memory, one 512-thread CTA per SM; 256 CTAs at full size (two waves on 132 SMs).
Accuracy: the MMAs of one K step accumulate into `part` (zeroed per K step), which is then added
to `acc` with ordinary fp32 adds (round to nearest). Tensor cores accumulate with truncation;
chaining all 256 k16 MMAs of K = 4096 in one accumulator could bias the logits by up to ~1e-5
(an estimate, not measured), enough to put topk_weights outside the grader's 3 x (fp32 reference
error) on some of the 131072 weights. With this split the chained part is 2 MMAs and the long sum
is 128 RN adds, no worse than the fp32 reference's own 4096 FFMAs (the problem's notes expect ~1e-6
on logits).
Kernel 2 (routing, fp32): one warp per token, lane l owns experts 8l..8l+7 (two float4 loads of
logits), so a group of 32 experts is 4 adjacent lanes. s = sigmoid, c = s + bias; each lane's
top-2 of c, merged over its 4 lanes with xor shuffles (max/min are exact, so the group score
top1 + top2 is bit-identical to torch's); a group's rank = number of better groups (ties to the
lower group, as the margins of make_inputs exclude ties); experts of the 4 best groups stay
candidates. 8 rounds of warp argmax (value max, then the owner's index max, then that expert's s)
give the experts in descending order; lane 0 writes indices (int64) and s_k / sum(s) * scale.
Removed and dropped experts hold -1e30 (c is in (-10, 11) for bf16 N(0, 1) biases), not -inf.

Bound: compute. 2*T*D*E = 34.4 GFLOP against the bf16 tensor-core peak (989 TFLOP/s -> 35 us);
hidden (128 MiB) is read by the two expert-half CTAs of a token tile back to back (the second
mostly from L2) -> ~30 us at 4.8 TB/s, so the floor is ~40-50 us. Expected: mma.sync without
ldmatrix, without cp.async multi-stage pipelining and with two barriers per K step reaches maybe
30-50% of the tensor-core peak -> ~70-120 us, plus ~10 us of routing (16 MiB of logits). wgmma +
TMA with a fused routing epilogue is the next step (the logits round trip and a launch would go).

Against CuTe DSL: 294.0 us, 4.68x torch.compile and 0.118 of the speed of light, against CuTe DSL's 265.9 us (5.17x,
0.131) (problems/README.md speed table, events/h200-grader-2-2): 10.6% slower, and as much under grader 2.1 (294.4
against 265.5 us, events/h200-baselines-2-1). The code does not show the cause. Same algorithm and tiles, and the
GEMM kernel's sm_90a SASS (nvcc / ptxas 13.0 on the CPU) has the same instruction mix in both DSLs: 16
HMMA.16816.F32.BF16, 4 16-byte global loads, 2 STS.128, 32 LDS, 2 barriers; both run one 512-thread CTA per SM (96
registers here, 124 in CuTe DSL). The differences are outside the K loop: this GEMM writes the logits (16 MiB) as 32
4-byte stores per thread where CuTe DSL's writes 16 8-byte ones, and the routing kernel reads a lane's 8 bf16 biases
with 8 2-byte loads where CuTe DSL's uses one 16-byte load. Which kernel holds the 28 us is not measured (no
per-kernel times were recorded).

Unchecked without a GPU (least sure first): the mma fragment indexing (modelled in numpy at smoke
size against the PTX fragment layout, which matches CuTe's printed MMA atom partitions), the
shuffles (`Tx.cuda.__shfl_xor_sync` / `__shfl_sync` with `__activemask()` inside the warp-uniform
`if t < T`), and the float -> int64 cast of the selected index. The branch history holds a SIMT
fp32 GEMM version of kernel 1 (simpler, ~10x slower).
"""

import torch
import tvm
from tvm.script import tirx as Tx

BM, BN, BK, NT = 128, 128, 32, 512  # router GEMM CTA tile (tokens, experts, K step), threads
LDW = BK // 2 + 4  # shared row stride in 32-bit words: 80 bytes keeps rows 16-byte aligned, fragment reads conflict-free
WM, WN = 4, 4  # warps over (tokens, experts): each warp owns 32 tokens x 32 experts
MT, NTL = BM // WM // 16, BN // WN // 8  # m16 and n8 MMA tiles per warp (2 x 4)
CPT = BM * BK // 8 // NT  # 16-byte chunks of A (and of W) each thread moves per K step
RSTEP = NT // (BK // 8)  # tile rows between a thread's chunks
N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
E = 256  # experts: 8 per lane of a warp
WPB = 8  # routing: tokens (warps) per CTA
NEG = -1.0e30  # "removed" score: below any c = sigmoid + bf16 bias
_CACHE = {}


def _make_gemm(D: int):
    K2 = D // 2  # static: with a dynamic row stride TVM cannot prove 16-byte alignment and emits 4 scalar loads
    NK = D // BK

    @Tx.prim_func
    def router_gemm(a_ptr: Tx.handle, w_ptr: Tx.handle, c_ptr: Tx.handle):
        M = Tx.int32()
        # A and W arrive as int32 views [*, D / 2] (two bf16 per word, element 2i in the low half, as mma wants)
        A = Tx.match_buffer(a_ptr, (M, K2), "int32")
        W = Tx.match_buffer(w_ptr, (E, K2), "int32")
        C = Tx.match_buffer(c_ptr, (M, E), "float32")
        Tx.device_entry()
        bn, bm = Tx.cta_id([E // BN, Tx.ceildiv(M, BM)])
        tx = Tx.thread_id([NT])
        sA = Tx.alloc_shared((BM, LDW), "int32")
        sW = Tx.alloc_shared((BN, LDW), "int32")
        acc = Tx.alloc_local((MT * NTL * 4,), "float32")  # [m16 tile][n8 tile][c0..c3]: the running sum (fp32 adds, RN)
        part = Tx.alloc_local((MT * NTL * 4,), "float32")  # the same for one K step's MMAs, started from zero
        af = Tx.alloc_local((MT * 4,), "uint32")  # A fragments of one k16 step: [m16 tile][a0..a3]
        bf = Tx.alloc_local((NTL * 2,), "uint32")  # B fragments: [n8 tile][b0, b1]
        la = Tx.alloc_local((CPT * 4,), "int32")  # this thread's 16-byte chunks of the next K step
        lw = Tx.alloc_local((CPT * 4,), "int32")
        lane: Tx.let[Tx.int32] = tx % 32
        g: Tx.let[Tx.int32] = lane // 4  # mma groupID: fragment row (A, C) / column (B)
        tg: Tx.let[Tx.int32] = lane % 4  # thread in group: fragment k word / C column pair
        wm: Tx.let[Tx.int32] = (tx // 32) % WM  # warp's 32-token slice of the tile
        wn: Tx.let[Tx.int32] = (tx // 32) // WM  # warp's 32-expert slice
        q: Tx.let[Tx.int32] = tx % (BK // 8)  # 16-byte chunk within a tile row
        r0: Tx.let[Tx.int32] = tx // (BK // 8)  # tile row of chunk 0 (chunk h: r0 + h * RSTEP)
        for i in Tx.unroll(MT * NTL * 4):
            acc[i] = Tx.float32(0)
        # prologue: K step 0 into registers (tail rows clamped: loaded, never stored)
        for h in Tx.unroll(CPT):
            la.vstore([h * 4], A.vload([Tx.min(bm * BM + r0 + h * RSTEP, M - 1), q * 4], dtype="int32x4"))
            lw.vstore([h * 4], W.vload([bn * BN + r0 + h * RSTEP, q * 4], dtype="int32x4"))
        for kb in Tx.serial(NK):
            for i in Tx.unroll(MT * NTL * 4):
                part[i] = Tx.float32(0)
            for h in Tx.unroll(CPT):
                sA.vstore([r0 + h * RSTEP, q * 4], la.vload([h * 4], dtype="int32x4"))
                sW.vstore([r0 + h * RSTEP, q * 4], lw.vload([h * 4], dtype="int32x4"))
            Tx.cuda.cta_sync()
            # prefetch the next K step into registers while this one is multiplied
            if kb + 1 < NK:
                for h in Tx.unroll(CPT):
                    la.vstore([h * 4], A.vload([Tx.min(bm * BM + r0 + h * RSTEP, M - 1), (kb + 1) * (BK // 2) + q * 4], dtype="int32x4"))
                    lw.vstore([h * 4], W.vload([bn * BN + r0 + h * RSTEP, (kb + 1) * (BK // 2) + q * 4], dtype="int32x4"))
            for kk in Tx.unroll(BK // 16):
                for mt in Tx.unroll(MT):
                    af[mt * 4 + 0] = Tx.Cast("uint32", sA[wm * (MT * 16) + mt * 16 + g, kk * 8 + tg])
                    af[mt * 4 + 1] = Tx.Cast("uint32", sA[wm * (MT * 16) + mt * 16 + g + 8, kk * 8 + tg])
                    af[mt * 4 + 2] = Tx.Cast("uint32", sA[wm * (MT * 16) + mt * 16 + g, kk * 8 + tg + 4])
                    af[mt * 4 + 3] = Tx.Cast("uint32", sA[wm * (MT * 16) + mt * 16 + g + 8, kk * 8 + tg + 4])
                for nt in Tx.unroll(NTL):
                    bf[nt * 2 + 0] = Tx.Cast("uint32", sW[wn * (NTL * 8) + nt * 8 + g, kk * 8 + tg])
                    bf[nt * 2 + 1] = Tx.Cast("uint32", sW[wn * (NTL * 8) + nt * 8 + g, kk * 8 + tg + 4])
                for mt in Tx.unroll(MT):
                    for nt in Tx.unroll(NTL):
                        Tx.ptx["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"](
                            part[(mt * NTL + nt) * 4 + 0], part[(mt * NTL + nt) * 4 + 1],
                            part[(mt * NTL + nt) * 4 + 2], part[(mt * NTL + nt) * 4 + 3],
                            af[mt * 4 + 0], af[mt * 4 + 1], af[mt * 4 + 2], af[mt * 4 + 3],
                            bf[nt * 2 + 0], bf[nt * 2 + 1],
                            part[(mt * NTL + nt) * 4 + 0], part[(mt * NTL + nt) * 4 + 1],
                            part[(mt * NTL + nt) * 4 + 2], part[(mt * NTL + nt) * 4 + 3])
            for i in Tx.unroll(MT * NTL * 4):
                acc[i] = acc[i] + part[i]
            Tx.cuda.cta_sync()
        for mt in Tx.unroll(MT):
            for nt in Tx.unroll(NTL):
                for hr in Tx.unroll(2):  # c0, c1 at row g; c2, c3 at row g + 8
                    gr: Tx.let[Tx.int32] = bm * BM + wm * (MT * 16) + mt * 16 + g + hr * 8
                    gc: Tx.let[Tx.int32] = bn * BN + wn * (NTL * 8) + nt * 8 + tg * 2
                    if gr < M:
                        C[gr, gc] = acc[(mt * NTL + nt) * 4 + hr * 2]
                        C[gr, gc + 1] = acc[(mt * NTL + nt) * 4 + hr * 2 + 1]

    return router_gemm


def _make_route(SCALE: float):
    @Tx.prim_func
    def route(l_ptr: Tx.handle, b_ptr: Tx.handle, i_ptr: Tx.handle, w_ptr: Tx.handle):
        T = Tx.int32()
        L = Tx.match_buffer(l_ptr, (T, E), "float32")
        Bias = Tx.match_buffer(b_ptr, (E,), "bfloat16")
        Idx = Tx.match_buffer(i_ptr, (T, TOP_K), "int64")
        Wt = Tx.match_buffer(w_ptr, (T, TOP_K), "float32")
        Tx.device_entry()
        bx = Tx.cta_id([Tx.ceildiv(T, WPB)])
        tx = Tx.thread_id([WPB * 32])
        lg = Tx.alloc_local((8,), "float32")
        s = Tx.alloc_local((8,), "float32")
        c = Tx.alloc_local((8,), "float32")
        sel = Tx.alloc_local((TOP_K,), "float32")
        lane: Tx.let[Tx.int32] = tx % 32
        t: Tx.let[Tx.int32] = bx * WPB + tx // 32
        if t < T:  # warp-uniform: every lane of a warp has the same t
            lg.vstore([0], L.vload([t, lane * 8], dtype="float32x4"))
            lg.vstore([4], L.vload([t, lane * 8 + 4], dtype="float32x4"))
            for j in Tx.unroll(8):
                sj: Tx.let[Tx.float32] = Tx.float32(1) / (Tx.float32(1) + Tx.exp(Tx.float32(0) - lg[j]))
                s[j] = sj
                c[j] = sj + Tx.Cast("float32", Bias[lane * 8 + j])
            # this lane's two largest c, then merged over the 4 lanes of the group
            m1: Tx.float32 = c[0]
            m2: Tx.float32 = Tx.float32(NEG)
            for j in Tx.unroll(7):
                m2 = Tx.max(m2, Tx.min(m1, c[j + 1]))
                m1 = Tx.max(m1, c[j + 1])
            mask: Tx.let[Tx.uint32] = Tx.cuda.__activemask()
            for r in Tx.unroll(2):
                o1: Tx.let[Tx.float32] = Tx.cuda.__shfl_xor_sync(mask, m1, r + 1, 32)
                o2: Tx.let[Tx.float32] = Tx.cuda.__shfl_xor_sync(mask, m2, r + 1, 32)
                m2 = Tx.max(Tx.min(m1, o1), Tx.max(m2, o2))
                m1 = Tx.max(m1, o1)
            gs: Tx.let[Tx.float32] = m1 + m2
            g: Tx.let[Tx.int32] = lane // 4
            rank: Tx.int32 = 0
            for h in Tx.unroll(N_GROUP):
                o: Tx.let[Tx.float32] = Tx.cuda.__shfl_sync(mask, gs, h * 4, 32)
                if o > gs:
                    rank = rank + 1
                if o == gs:
                    if g > h:  # a tie goes to the lower group (cannot occur on make_inputs' draws)
                        rank = rank + 1
            if rank >= TOPK_GROUP:
                for j in Tx.unroll(8):
                    c[j] = Tx.float32(NEG)
            for k in Tx.unroll(TOP_K):
                lb: Tx.float32 = c[0]
                lj: Tx.int32 = 0
                for j in Tx.unroll(7):
                    if c[j + 1] > lb:
                        lb = c[j + 1]
                        lj = j + 1
                v: Tx.let[Tx.float32] = Tx.cuda.warp_max(lb)
                cand: Tx.let[Tx.float32] = Tx.if_then_else(lb == v, Tx.Cast("float32", lane * 8 + lj), Tx.float32(-1))
                idx: Tx.let[Tx.float32] = Tx.cuda.warp_max(cand)  # the winner's expert index (exact in fp32)
                sc: Tx.float32 = Tx.float32(0)
                for j in Tx.unroll(8):
                    if Tx.Cast("float32", lane * 8 + j) == idx:
                        sc = s[j]
                        c[j] = Tx.float32(NEG)
                sel[k] = Tx.cuda.warp_max(sc)  # s > 0, so the owner's s wins
                if lane == 0:
                    Idx[t, k] = Tx.Cast("int64", idx)
            if lane == 0:
                tot: Tx.float32 = sel[0]
                for k in Tx.unroll(TOP_K - 1):
                    tot = tot + sel[k + 1]
                for k in Tx.unroll(TOP_K):
                    Wt[t, k] = sel[k] / tot * Tx.float32(SCALE)

    return route


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func):
    target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _kernels(D: int, scale: float):
    fns = _CACHE.get((D, scale))
    if fns is None:
        gemm = _CACHE.get(("gemm", D))
        if gemm is None:
            gemm = _CACHE["gemm", D] = _build(_make_gemm(D))
        route = _CACHE.get(("route", scale))
        if route is None:
            route = _CACHE["route", scale] = _build(_make_route(scale))
        fns = _CACHE[D, scale] = (gemm, route)
    return fns


def solve(hidden_states, weight, expert_bias, routed_scaling_factor):
    T, D = hidden_states.shape
    if weight.shape != (E, D) or expert_bias.shape != (E,) or D % BK:
        raise ValueError(f"unsupported router shape: hidden {tuple(hidden_states.shape)}, weight {tuple(weight.shape)}")
    dev = hidden_states.device
    logits = torch.empty((T, E), dtype=torch.float32, device=dev)
    idx = torch.empty((T, TOP_K), dtype=torch.int64, device=dev)
    wts = torch.empty((T, TOP_K), dtype=torch.float32, device=dev)
    gemm, route = _kernels(D, float(routed_scaling_factor))
    gemm(hidden_states.contiguous().view(torch.int32), weight.contiguous().view(torch.int32), logits)
    route(logits, expert_bias.contiguous(), idx, wts)
    return idx, wts
