"""Baseline (TIRx): GQA paged decode (page size 1) as split-KV flash-decoding, two kernels.

Strategy. The KV of every sequence is cut into chunks of CHUNK tokens; kernel 1 runs one CTA of 128
threads per (chunk, kv head) and kernel 2 merges a sequence's chunks by log-sum-exp. Chunks are
numbered sequence after sequence, so a CTA finds its (sequence, first token) with a warp prefix sum
of ceil(kv_len / CHUNK) over kv_indptr (`__shfl_up_sync`; no host read: the grid is an upper bound
from kv_indices' length, nnz // CHUNK + batch + 1, and CTAs past the last chunk do nothing).
Kernel 1: the 128 threads are 8 streams of 16 lanes; lane l of a stream owns head dims [8l, 8l + 8) of the
4 query heads that share the CTA's kv head (q pre-scaled by sm_scale * log2 e, in registers). Each
iteration a stream takes TPI consecutive tokens of the chunk, gathers their K and V rows through the
chunk's page ids (staged in shared memory once per CTA) with `bfloat16x8` (16-byte) loads (all issued
before any math), reduces the 4 dot products over its 16 lanes (`Tx.cuda.warp_sum(width=16)`) and updates
its own online softmax (running max m, sum l and an 8-wide fp32 accumulator per head, base 2). A token
index past the chunk is clamped to the chunk's last token (a valid address, same score, so the max stays
right) and its weight is set to 0. The 8 streams are merged through shared memory; thread d writes, per
head, the chunk's normalised partial output o[d] and lse = m + log2(l) (fp32 workspace).
Kernel 2: one CTA per (query head, sequence), thread d: out = sum_c 2^(lse_c - lse) o_c[d] with
lse = M + log2(sum_c 2^(lse_c - M)), lse returned in base 2 (as FlashInfer and the reference).
A sequence with no tokens gets out = 0 and lse = -inf (the reference's logsumexp of nothing).

Bound: memory. The referenced KV is 241.5 MB of the 242.8 MB counted (problem META); at ~4.8 TB/s that
is ~51 us. Extra traffic: the fp32 workspace (279 chunks x 32 heads x 129 floats, 4.6 MB, written
and read once, ~4%). 279 x 8 = 2232 CTAs of 128 KB each, ~4 waves at 4 CTAs per SM. Expect 50-70% of the bandwidth roof, like the CuTe DSL version (same algorithm).

Against CuTe DSL: 110.7 us, 11.62x torch.compile and 0.457 of the speed of light, against CuTe DSL's 102.4 us
(12.57x, 0.494) (problems/README.md speed table, events/h200-grader-2-2): 8% slower, and as much under grader 2.1
(110.0 against 99.9 us, events/h200-baselines-2-1). The code does not show why. Same algorithm, CHUNK and TPI, and
the split kernel's sm_90a SASS (nvcc / ptxas 13.0 on the CPU) has the same instruction mix in both DSLs: 12 16-byte
and 10 4-byte global loads, 158 SHFL.BFLY, 52 MUFU.EX2, 2 barriers. Registers: 155 here, 168 in CuTe DSL, so both
fit 3 CTAs of 128 threads per SM by registers (not the 4 estimated above: 2232 CTAs are ~5.6 waves in both). What
differs: the instruction order, not compared; this kernel's loads take the read-only path (LDG.E.CONSTANT, from
TVM's __restrict__ const parameters); and the combine kernel, compiled differently (76 global loads in CuTe DSL's
SASS against 28 here). Which of these holds the 8 us is not measured (no per-kernel times were recorded).

Risks not checked without a GPU (lines to look at first if it fails on the H200):
- the warp prefix sum in `gqa_split` (`__shfl_up_sync` keeps lanes below the offset unchanged;
  the `lane >= off` test adds only where a source exists);
- `Tx.cuda.warp_sum(d, width=16)` as a 16-lane butterfly (every lane of a stream must see the
  same score; the xor butterfly is symmetric, so it should);
- lse accuracy: fp32 scores with a different summation order than the reference; the grader's
  tolerance is 3 x max(reference error, eps x max|lse|) ~ 4e-6 at |lse| ~ 13.
Compiled once per (heads, sm_scale); launched on torch's current stream.
"""

import math

import torch
import tvm
from tvm.script import tirx as Tx

HEAD_DIM = 128
VEC = 8  # bf16 per 16-byte load
LANES = HEAD_DIM // VEC  # lanes per stream (16)
NT = 128  # threads per CTA in both kernels
NS = NT // LANES  # streams per CTA (8)
TPI = 4  # tokens per stream per iteration
CHUNK = 256  # tokens per split
NEG = -1.0e30  # finite "minus infinity" for the running max (no inf - inf anywhere)
FULL = 0xFFFFFFFF
_CACHE = {}


def _make_split(H: int, KVH: int, SCALE2: float):
    G = H // KVH
    D = HEAD_DIM

    @Tx.prim_func
    def gqa_split(q_ptr: Tx.handle, k_ptr: Tx.handle, v_ptr: Tx.handle, ip_ptr: Tx.handle, ix_ptr: Tx.handle,
                  op_ptr: Tx.handle, lp_ptr: Tx.handle):
        B = Tx.int32()
        R = Tx.int32()
        B1 = Tx.int32()
        NNZ = Tx.int32()
        MC = Tx.int32()
        Q = Tx.match_buffer(q_ptr, (B, H, D), "bfloat16")
        K = Tx.match_buffer(k_ptr, (R, D), "bfloat16")
        V = Tx.match_buffer(v_ptr, (R, D), "bfloat16")
        Ip = Tx.match_buffer(ip_ptr, (B1,), "int32")
        Ix = Tx.match_buffer(ix_ptr, (NNZ,), "int32")
        Op = Tx.match_buffer(op_ptr, (MC, H, D), "float32")
        Lp = Tx.match_buffer(lp_ptr, (MC, H), "float32")
        Tx.device_entry()
        c, kvh = Tx.cta_id([MC, KVH])
        tx = Tx.thread_id([NT])
        sm_m = Tx.alloc_shared((NS * G,), "float32")
        sm_l = Tx.alloc_shared((NS * G,), "float32")
        sm_acc = Tx.alloc_shared((NS * G * D,), "float32")
        sm_idx = Tx.alloc_shared((CHUNK,), "int32")
        lane: Tx.let[Tx.int32] = Tx.truncmod(tx, 32)
        nseq: Tx.let[Tx.int32] = B1 - 1
        # locate this CTA's chunk: each warp scans the chunk counts 32 sequences at a time
        seq1: Tx.int32 = Tx.int32(0)
        t0: Tx.int32 = Tx.int32(0)
        carry: Tx.int32 = Tx.int32(0)
        for w in Tx.serial(Tx.truncdiv(nseq + 31, 32)):
            j: Tx.let[Tx.int32] = w * 32 + lane
            n: Tx.int32 = Tx.int32(0)
            if j < nseq:
                n = Tx.truncdiv(Ip[j + 1] - Ip[j] + (CHUNK - 1), CHUNK)
            incl: Tx.int32 = n
            for k in Tx.unroll(5):
                off: Tx.let[Tx.int32] = Tx.shift_left(Tx.int32(1), k)
                y: Tx.let[Tx.int32] = Tx.cuda.__shfl_up_sync(Tx.uint32(FULL), incl, off, 32)
                if lane >= off:
                    incl = incl + y
            start: Tx.let[Tx.int32] = carry + incl - n
            cs: Tx.int32 = Tx.int32(0)
            ct: Tx.int32 = Tx.int32(0)
            if c >= start and c < start + n:
                cs = j + 1
                ct = (c - start) * CHUNK
            seq1 = seq1 + Tx.cuda.warp_sum(cs)
            t0 = t0 + Tx.cuda.warp_sum(ct)
            carry = carry + Tx.cuda.__shfl_sync(Tx.uint32(FULL), incl, 31, 32)
        if seq1 > 0:
            seq: Tx.let[Tx.int32] = seq1 - 1
            base: Tx.let[Tx.int32] = Ip[seq]
            t1: Tx.let[Tx.int32] = Tx.min(t0 + CHUNK, Ip[seq + 1] - base)  # chunk end (exclusive), > t0
            s: Tx.let[Tx.int32] = Tx.truncdiv(tx, LANES)
            l16: Tx.let[Tx.int32] = Tx.truncmod(tx, LANES)
            # the chunk's page ids, staged once (coalesced), so the gathers below wait on one memory trip, not two
            for i in Tx.unroll(CHUNK // NT):
                sm_idx[i * NT + tx] = Ix[base + Tx.min(t0 + i * NT + tx, t1 - 1)]
            qv = Tx.alloc_local((VEC,), "bfloat16")
            qf = Tx.alloc_local((G * VEC,), "float32")
            for g in Tx.unroll(G):
                qv.vstore([0], Q.vload([seq, kvh * G + g, l16 * VEC], dtype="bfloat16x8"))
                for e in Tx.unroll(VEC):
                    qf[g * VEC + e] = Tx.Cast("float32", qv[e]) * Tx.float32(SCALE2)
            Tx.cuda.cta_sync()  # publishes sm_idx (after the q loads, so both memory trips overlap)
            m = Tx.alloc_local((G,), "float32")
            lsum = Tx.alloc_local((G,), "float32")
            acc = Tx.alloc_local((G * VEC,), "float32")
            for g in Tx.unroll(G):
                m[g] = Tx.float32(NEG)
                lsum[g] = Tx.float32(0)
                for e in Tx.unroll(VEC):
                    acc[g * VEC + e] = Tx.float32(0)
            kf = Tx.alloc_local((TPI * VEC,), "bfloat16")
            vf = Tx.alloc_local((TPI * VEC,), "bfloat16")
            sc = Tx.alloc_local((G * TPI,), "float32")
            p = Tx.alloc_local((TPI,), "float32")
            niter: Tx.let[Tx.int32] = Tx.truncdiv(t1 - t0 + (NS * TPI - 1), NS * TPI)
            for it in Tx.serial(niter):
                tb: Tx.let[Tx.int32] = t0 + it * (NS * TPI) + s * TPI
                for j in Tx.unroll(TPI):
                    row: Tx.let[Tx.int32] = sm_idx[Tx.min(tb + j, t1 - 1) - t0] * KVH + kvh
                    kf.vstore([j * VEC], K.vload([row, l16 * VEC], dtype="bfloat16x8"))
                    vf.vstore([j * VEC], V.vload([row, l16 * VEC], dtype="bfloat16x8"))
                for j in Tx.unroll(TPI):
                    for g in Tx.unroll(G):
                        d: Tx.float32 = Tx.float32(0)
                        for e in Tx.unroll(VEC):
                            d = d + qf[g * VEC + e] * Tx.Cast("float32", kf[j * VEC + e])
                        sc[j * G + g] = Tx.cuda.warp_sum(d, width=LANES)
                for g in Tx.unroll(G):
                    mnew: Tx.float32 = m[g]
                    for j in Tx.unroll(TPI):
                        mnew = Tx.max(mnew, sc[j * G + g])
                    alpha: Tx.let[Tx.float32] = Tx.exp2(m[g] - mnew)
                    m[g] = mnew
                    ps: Tx.float32 = Tx.float32(0)
                    for j in Tx.unroll(TPI):
                        p[j] = Tx.if_then_else(tb + j < t1, Tx.exp2(sc[j * G + g] - mnew), Tx.float32(0))
                        ps = ps + p[j]
                    lsum[g] = lsum[g] * alpha + ps
                    for e in Tx.unroll(VEC):
                        a: Tx.float32 = acc[g * VEC + e] * alpha
                        for j in Tx.unroll(TPI):
                            a = a + p[j] * Tx.Cast("float32", vf[j * VEC + e])
                        acc[g * VEC + e] = a
            # merge the 8 streams: every stream saw at least one valid token address, so its m is a real score
            for g in Tx.unroll(G):
                if l16 == 0:
                    sm_m[s * G + g] = m[g]
                    sm_l[s * G + g] = lsum[g]
                for e in Tx.unroll(VEC):
                    sm_acc[(s * G + g) * D + l16 * VEC + e] = acc[g * VEC + e]
            Tx.cuda.cta_sync()
            for g in Tx.unroll(G):
                mx: Tx.float32 = sm_m[g]
                for u in Tx.unroll(NS - 1):
                    mx = Tx.max(mx, sm_m[(u + 1) * G + g])
                lt: Tx.float32 = Tx.float32(0)
                o: Tx.float32 = Tx.float32(0)
                for u in Tx.unroll(NS):
                    wt: Tx.let[Tx.float32] = Tx.exp2(sm_m[u * G + g] - mx)
                    lt = lt + sm_l[u * G + g] * wt
                    o = o + sm_acc[(u * G + g) * D + tx] * wt
                Op[c, kvh * G + g, tx] = o / lt
                if tx == 0:
                    Lp[c, kvh * G + g] = mx + Tx.log2(lt)

    return gqa_split


def _make_combine(H: int):
    D = HEAD_DIM

    @Tx.prim_func
    def gqa_combine(ip_ptr: Tx.handle, op_ptr: Tx.handle, lp_ptr: Tx.handle, o_ptr: Tx.handle, lse_ptr: Tx.handle):
        B1 = Tx.int32()
        MC = Tx.int32()
        B = Tx.int32()
        Ip = Tx.match_buffer(ip_ptr, (B1,), "int32")
        Op = Tx.match_buffer(op_ptr, (MC, H, D), "float32")
        Lp = Tx.match_buffer(lp_ptr, (MC, H), "float32")
        O = Tx.match_buffer(o_ptr, (B, H, D), "bfloat16")
        Lse = Tx.match_buffer(lse_ptr, (B, H), "float32")
        Tx.device_entry()
        h, b = Tx.cta_id([H, B])
        tx = Tx.thread_id([NT])
        lane: Tx.let[Tx.int32] = Tx.truncmod(tx, 32)
        # first chunk of sequence b: every warp sums the chunk counts of sequences 0..b-1 on its own
        part: Tx.int32 = Tx.int32(0)
        for w in Tx.serial(Tx.truncdiv(b + 31, 32)):
            j: Tx.let[Tx.int32] = w * 32 + lane
            if j < b:
                part = part + Tx.truncdiv(Ip[j + 1] - Ip[j] + (CHUNK - 1), CHUNK)
        cs: Tx.let[Tx.int32] = Tx.cuda.warp_sum(part)
        n: Tx.let[Tx.int32] = Tx.truncdiv(Ip[b + 1] - Ip[b] + (CHUNK - 1), CHUNK)
        if n > 0:
            mx: Tx.float32 = Lp[cs, h]
            for k in Tx.serial(n - 1):
                mx = Tx.max(mx, Lp[cs + k + 1, h])
            lt: Tx.float32 = Tx.float32(0)
            o: Tx.float32 = Tx.float32(0)
            for k in Tx.serial(n):
                wt: Tx.let[Tx.float32] = Tx.exp2(Lp[cs + k, h] - mx)
                lt = lt + wt
                o = o + wt * Op[cs + k, h, tx]
            O[b, h, tx] = Tx.Cast("bfloat16", o / lt)
            if tx == 0:
                Lse[b, h] = mx + Tx.log2(lt)
        else:
            O[b, h, tx] = Tx.Cast("bfloat16", Tx.float32(0))
            if tx == 0:
                Lse[b, h] = Tx.float32(0) - Tx.infinity("float32")

    return gqa_combine


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernels(H: int, KVH: int, scale2: float):
    key = (H, KVH, scale2)
    fns = _CACHE.get(key)
    if fns is None:
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            split = tvm.compile(tvm.IRModule({"main": _make_split(H, KVH, scale2)}), target=target, tir_pipeline="tirx")
            combine = tvm.compile(tvm.IRModule({"main": _make_combine(H)}), target=target, tir_pipeline="tirx")
        fns = (split, combine)
        _CACHE[key] = fns
    return fns


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch, H, D = q.shape
    _, page_size, KVH, _ = k_cache.shape
    if D != HEAD_DIM or page_size != 1 or H % KVH:
        raise ValueError(f"this kernel needs head_dim {HEAD_DIM}, page size 1 and H % KVH == 0, got q {tuple(q.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}")
    out = torch.empty((batch, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, H), dtype=torch.float32, device=q.device)
    max_chunks = kv_indices.shape[0] // CHUNK + batch + 1  # >= sum_b ceil(kv_len_b / CHUNK), from shapes only
    o_part = torch.empty((max_chunks, H, D), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((max_chunks, H), dtype=torch.float32, device=q.device)
    rows = k_cache.shape[0] * KVH
    split, combine = _kernels(H, KVH, float(sm_scale) * math.log2(math.e))
    indptr = kv_indptr.contiguous()
    split(q.contiguous(), k_cache.contiguous().view(rows, D), v_cache.contiguous().view(rows, D), indptr,
          kv_indices.contiguous(), o_part, lse_part)
    combine(indptr, o_part, lse_part, out, lse)
    return out, lse
