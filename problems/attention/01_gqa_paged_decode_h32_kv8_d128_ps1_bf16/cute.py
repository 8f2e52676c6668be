"""Baseline (CuTe DSL): GQA paged decode (page size 1) as split-KV flash-decoding, two kernels.

Strategy. The KV of every sequence is cut into chunks of CHUNK tokens; kernel 1 runs one CTA of 128
threads per (chunk, kv head) and kernel 2 merges a sequence's chunks by log-sum-exp. Chunks are
numbered sequence after sequence, so a CTA finds its (sequence, first token) with a warp prefix sum
of ceil(kv_len / CHUNK) over kv_indptr (no host read: the grid is an upper bound from kv_indices'
length, nnz // CHUNK + batch + 1, and CTAs past the last chunk exit).
Kernel 1: the 128 threads are 8 streams of 16 lanes; lane l of a stream owns head dims [8l, 8l + 8) of the
4 query heads that share the CTA's kv head (q pre-scaled by sm_scale * log2 e, in registers). Each
iteration a stream takes TPI consecutive tokens of the chunk, gathers their K and V rows through the
chunk's page ids (staged in shared memory once per CTA) with 16-byte loads (all 2*TPI loads issued before
any math), reduces the 4 dot products over its 16 lanes with butterfly shuffles and updates its own online
softmax (running max m, sum l and an 8-wide fp32 accumulator per head, base 2). A token index past the
chunk is clamped to the chunk's last token (a valid address, same score, so the max stays right) and its
weight is set to 0. The 8 streams are merged through shared memory; thread d writes, per head, the chunk's
normalised partial output o[d] and lse = m + log2(l) (fp32 workspace).
Kernel 2: one CTA per (query head, sequence), thread d: out = sum_c 2^(lse_c - lse) o_c[d] with
lse = M + log2(sum_c 2^(lse_c - M)), lse returned in base 2 (as FlashInfer and the reference).
A sequence with no tokens gets out = 0 and lse = -inf (the reference's logsumexp of nothing).

Bound: memory. The referenced KV is 241.5 MB of the 242.8 MB counted (problem META); at ~4.8 TB/s that
is ~51 us. Extra traffic: the fp32 workspace (279 chunks x 32 heads x 129 floats, 4.6 MB, written
and read once, ~4%). 279 x 8 = 2232 CTAs of 128 KB each, ~4 waves at 4 CTAs per SM. Expect 50-70% of the bandwidth roof: the K/V rows are 256-byte gathers (one
page each), fine for DRAM, and the per-CTA locate scan costs a few hundred cycles.

Risks not checked without a GPU (lines to look at first if it fails on the H200):
- the warp prefix sum in `_locate` (shuffle_sync_up with the DSL's default clamp of 0; the lane
  test `lane >= off` keeps lanes below the offset unchanged);
- the 16-lane butterfly (`warp_reduction(..., threads_in_group=16)`) and that every lane of a stream
  sees bitwise-equal scores (the xor butterfly is symmetric, so it should);
- the rmem sub-views `kf[None, j]` as 128-bit copy destinations;
- lse accuracy: fp32 scores with a different summation order than the reference; the grader's
  tolerance is 3 x max(reference error, eps x max|lse|) ~ 4e-6 at |lse| ~ 13.
Compiled once per (sm_scale, chunk geometry) with TVM-FFI, launched on torch's current stream.
"""

import math
import operator

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32

HEAD_DIM = 128
VEC = 8  # bf16 per 16-byte load
LANES = HEAD_DIM // VEC  # lanes per stream (16)
NT = 128  # threads per CTA in both kernels
NS = NT // LANES  # streams per CTA (8)
TPI = 4  # tokens per stream per iteration
CHUNK = 256  # tokens per split
NEG = -1.0e30  # finite "minus infinity" for the running max (no inf - inf anywhere)
_CACHE = {}


@cute.jit
def _n_chunks(mIndptr: cute.Tensor, j: Int32, C: cutlass.Constexpr) -> Int32:
    return (mIndptr[j + 1] - mIndptr[j] + (C - 1)) // C


@cute.jit
def _locate(mIndptr: cute.Tensor, c: Int32, C: cutlass.Constexpr):
    """(seq + 1, first token) of global chunk c, or (0, 0) when c is past the last chunk.

    Each warp computes it on its own: lanes take 32 sequences at a time, an inclusive shuffle-up
    scan of their chunk counts gives each sequence's first chunk, and the one lane whose range holds
    c contributes its answer to a warp sum (every other lane adds 0).
    """
    lane = cute.arch.lane_idx()
    nseq = mIndptr.shape[0] - 1
    seq1 = Int32(0)
    t0 = Int32(0)
    carry = Int32(0)
    for w in range((nseq + 31) // 32):
        j = w * 32 + lane
        n = Int32(0)
        if j < nseq:
            n = _n_chunks(mIndptr, j, C)
        incl = n
        for k in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_up(incl, 1 << k)
            if lane >= (1 << k):
                incl = incl + y
        start = carry + incl - n
        cs = Int32(0)
        ct = Int32(0)
        if c >= start:
            if c < start + n:
                cs = j + 1
                ct = (c - start) * C
        seq1 = seq1 + cute.arch.warp_reduction(cs, operator.add)
        t0 = t0 + cute.arch.warp_reduction(ct, operator.add)
        carry = carry + cute.arch.shuffle_sync(incl, 31)
    return seq1, t0


@cute.kernel
def split_kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mIndptr: cute.Tensor, mIdx: cute.Tensor,
                 mOp: cute.Tensor, mLp: cute.Tensor, G: cutlass.Constexpr, KVH: cutlass.Constexpr,
                 SCALE2: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    c, kvh, _ = cute.arch.block_idx()
    smem = cutlass.utils.SmemAllocator()
    sm_m = smem.allocate_tensor(Float32, cute.make_layout((NS, G), stride=(G, 1)))
    sm_l = smem.allocate_tensor(Float32, cute.make_layout((NS, G), stride=(G, 1)))
    sm_acc = smem.allocate_tensor(Float32, cute.make_layout((NS, G, HEAD_DIM), stride=(G * HEAD_DIM, HEAD_DIM, 1)),
                                  byte_alignment=16)
    sm_idx = smem.allocate_tensor(Int32, cute.make_layout(CHUNK))
    seq1, t0 = _locate(mIndptr, c, CHUNK)
    if seq1 > 0:
        seq = seq1 - 1
        base = mIndptr[seq]
        t1 = cutlass.min(t0 + CHUNK, mIndptr[seq + 1] - base)  # chunk end (exclusive), > t0
        s = tidx // LANES
        l16 = tidx % LANES
        # the chunk's page ids, staged once (coalesced), so the gathers below wait on one memory trip, not two
        for i in cutlass.range_constexpr(CHUNK // NT):
            sm_idx[i * NT + tidx] = mIdx[base + cutlass.min(t0 + i * NT + tidx, t1 - 1)]
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        qv = cute.make_rmem_tensor(cute.make_layout(VEC), BFloat16)
        qf = cute.make_rmem_tensor(cute.make_layout(G * VEC), Float32)
        for g in cutlass.range_constexpr(G):
            cute.copy(atom, mQ[seq, kvh * G + g, l16, None], qv)
            for e in cutlass.range_constexpr(VEC):
                qf[g * VEC + e] = qv[e].to(Float32) * Float32(SCALE2)
        cute.arch.sync_threads()  # publishes sm_idx (after the q loads, so both memory trips overlap)
        m = cute.make_rmem_tensor(cute.make_layout(G), Float32)
        lsum = cute.make_rmem_tensor(cute.make_layout(G), Float32)
        acc = cute.make_rmem_tensor(cute.make_layout(G * VEC), Float32)
        for g in cutlass.range_constexpr(G):
            m[g] = Float32(NEG)
            lsum[g] = Float32(0.0)
            for e in cutlass.range_constexpr(VEC):
                acc[g * VEC + e] = Float32(0.0)
        kf = cute.make_rmem_tensor(cute.make_layout((VEC, TPI)), BFloat16)
        vf = cute.make_rmem_tensor(cute.make_layout((VEC, TPI)), BFloat16)
        sc = cute.make_rmem_tensor(cute.make_layout(G * TPI), Float32)
        p = cute.make_rmem_tensor(cute.make_layout(TPI), Float32)
        niter = (t1 - t0 + (NS * TPI - 1)) // (NS * TPI)
        for it in range(niter):
            tb = t0 + it * (NS * TPI) + s * TPI
            for j in cutlass.range_constexpr(TPI):
                row = sm_idx[cutlass.min(tb + j, t1 - 1) - t0] * KVH + kvh
                cute.copy(atom, mK[row, l16, None], kf[None, j])
                cute.copy(atom, mV[row, l16, None], vf[None, j])
            for j in cutlass.range_constexpr(TPI):
                for g in cutlass.range_constexpr(G):
                    d = Float32(0.0)
                    for e in cutlass.range_constexpr(VEC):
                        d = d + qf[g * VEC + e] * kf[e, j].to(Float32)
                    sc[j * G + g] = cute.arch.warp_reduction(d, operator.add, threads_in_group=LANES)
            for g in cutlass.range_constexpr(G):
                mnew = m[g]
                for j in cutlass.range_constexpr(TPI):
                    mnew = cute.arch.fmax(mnew, sc[j * G + g])
                alpha = cute.math.exp2(m[g] - mnew)
                m[g] = mnew
                ps = Float32(0.0)
                for j in cutlass.range_constexpr(TPI):
                    pj = cute.math.exp2(sc[j * G + g] - mnew)
                    if tb + j >= t1:
                        pj = Float32(0.0)
                    p[j] = pj
                    ps = ps + pj
                lsum[g] = lsum[g] * alpha + ps
                for e in cutlass.range_constexpr(VEC):
                    a = acc[g * VEC + e] * alpha
                    for j in cutlass.range_constexpr(TPI):
                        a = a + p[j] * vf[e, j].to(Float32)
                    acc[g * VEC + e] = a
        # merge the 8 streams: every stream saw at least one valid token address, so its m is a real score
        for g in cutlass.range_constexpr(G):
            if l16 == 0:
                sm_m[s, g] = m[g]
                sm_l[s, g] = lsum[g]
            for e in cutlass.range_constexpr(VEC):
                sm_acc[s, g, l16 * VEC + e] = acc[g * VEC + e]
        cute.arch.sync_threads()
        for g in cutlass.range_constexpr(G):
            mx = sm_m[0, g]
            for u in cutlass.range_constexpr(1, NS):
                mx = cute.arch.fmax(mx, sm_m[u, g])
            lt = Float32(0.0)
            o = Float32(0.0)
            for u in cutlass.range_constexpr(NS):
                w = cute.math.exp2(sm_m[u, g] - mx)
                lt = lt + sm_l[u, g] * w
                o = o + sm_acc[u, g, tidx] * w
            mOp[c, kvh * G + g, tidx] = o / lt
            if tidx == 0:
                mLp[c, kvh * G + g] = mx + cute.math.log2(lt)


@cute.kernel
def combine_kernel(mIndptr: cute.Tensor, mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    h, b, _ = cute.arch.block_idx()
    lane = cute.arch.lane_idx()
    # first chunk of sequence b: every warp sums the chunk counts of sequences 0..b-1 on its own
    part = Int32(0)
    for w in range((b + 31) // 32):
        j = w * 32 + lane
        if j < b:
            part = part + _n_chunks(mIndptr, j, CHUNK)
    cs = cute.arch.warp_reduction(part, operator.add)
    n = _n_chunks(mIndptr, b, CHUNK)
    if n > 0:
        mx = mLp[cs, h]
        for k in range(1, n):
            mx = cute.arch.fmax(mx, mLp[cs + k, h])
        lt = Float32(0.0)
        o = Float32(0.0)
        for k in range(n):
            w = cute.math.exp2(mLp[cs + k, h] - mx)
            lt = lt + w
            o = o + w * mOp[cs + k, h, tidx]
        mO[b, h, tidx] = (o / lt).to(mO.element_type)
        if tidx == 0:
            mLse[b, h] = mx + cute.math.log2(lt)
    else:
        mO[b, h, tidx] = Float32(0.0).to(mO.element_type)
        if tidx == 0:
            mLse[b, h] = Float32(-math.inf)


@cute.jit
def gqa_decode(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mIndptr: cute.Tensor, mIdx: cute.Tensor,
               mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor, stream,
               G: cutlass.Constexpr, KVH: cutlass.Constexpr, SCALE2: cutlass.Constexpr):
    split_kernel(mQ, mK, mV, mIndptr, mIdx, mOp, mLp, G, KVH, SCALE2).launch(
        grid=[mOp.shape[0], KVH, 1], block=[NT, 1, 1], stream=stream
    )
    combine_kernel(mIndptr, mOp, mLp, mO, mLse).launch(
        grid=[mO.shape[1], mO.shape[0], 1], block=[NT, 1, 1], stream=stream
    )


def _kernel(H: int, KVH: int, scale2: float):
    key = (H, KVH, scale2)
    fn = _CACHE.get(key)
    if fn is None:
        G = H // KVH
        B, B1, R, NNZ, MC = (cute.sym_int() for _ in range(5))
        fake = cute.runtime.make_fake_compact_tensor
        rm = lambda dt, *shape, **kw: fake(dt, shape, stride_order=tuple(reversed(range(len(shape)))), **kw)
        args = (
            rm(BFloat16, B, H, LANES, VEC, assumed_align=16),
            rm(BFloat16, R, LANES, VEC, assumed_align=16),
            rm(BFloat16, R, LANES, VEC, assumed_align=16),
            rm(Int32, B1), rm(Int32, NNZ),
            rm(Float32, MC, H, HEAD_DIM), rm(Float32, MC, H),
            rm(BFloat16, B, H, HEAD_DIM), rm(Float32, B, H),
        )
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(gqa_decode, *args, stream, G, KVH, scale2, options="--enable-tvm-ffi")
        _CACHE[key] = fn
    return fn


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch, H, D = q.shape
    _, page_size, KVH, _ = k_cache.shape
    if D != HEAD_DIM or page_size != 1 or H % KVH or NT % LANES:
        raise ValueError(f"this kernel needs head_dim {HEAD_DIM}, page size 1 and H % KVH == 0, got q {tuple(q.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}")
    out = torch.empty((batch, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, H), dtype=torch.float32, device=q.device)
    max_chunks = kv_indices.shape[0] // CHUNK + batch + 1  # >= sum_b ceil(kv_len_b / CHUNK), from shapes only
    o_part = torch.empty((max_chunks, H, D), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((max_chunks, H), dtype=torch.float32, device=q.device)
    rows = k_cache.shape[0] * KVH
    fn = _kernel(H, KVH, float(sm_scale) * math.log2(math.e))
    fn(q.contiguous().view(batch, H, LANES, VEC), k_cache.contiguous().view(rows, LANES, VEC),
       v_cache.contiguous().view(rows, LANES, VEC), kv_indptr.contiguous(), kv_indices.contiguous(),
       o_part, lse_part, out, lse)
    return out, lse
