"""Baseline (TIRx): Gated DeltaNet decode step, one CTA per (request, value head), state read and written once.

Thread t owns state column v = t % V and rows k in [kh*K/4, (kh+1)*K/4), kh = t // V, in
registers (loaded first, so their latency overlaps the rest of the prologue). The state arrives in
k-last layout ([V, K] per head), so thread t reads and writes the contiguous run state[i, h, v, kh*K/4 ...].
The CTA stages q and k in shared memory, computes q.k (`Tx.cuda.cta_sum`), the decay and beta, decays
its state slice, reduces k.S and q.S over k, and uses o = scale * (q.S' + (q.k) * delta) (the same sum
as scale * q.(S' + k delta^T)) so the state is read once and the new state written once. Compiled once
per shape and scale; launched on torch's current stream.

Against torch.compile: 295-299 us (events/h200-checks-ab-2, events/h200-grader-2-3), about 0.3x torch.compile (its
faster mode, max-autotune-no-cudagraphs, 89.9 us; default mode 142.7 us; events/h200-torch-compile), 1.08-1.11x eager,
0.094-0.097 of the speed of light (135.0 MB, the fp32 state read and written once: 2 x 67.1 MB, 28.1 us at 4.8 TB/s);
the CuTe DSL version, the same design, 290-292 us with the same ratios (problems/README.md speed table). Not yet
tuned; no missing primitive. What the code does, read from the sm_90a SASS (nvcc 13.0 on the CPU; none of it measured
on a GPU): each thread reads its 32 state values with 32 scalar 4-byte loads (LDG.E.CONSTANT: the loop indexes element
by element, so nothing is vectorised), all issued before the first barrier, and writes them back with 32 scalar
stores. A warp's 32 lanes hold 32 consecutive v, i.e. rows 512 bytes apart, so every warp-wide load or store touches
32 different 128-byte lines, 4 bytes in each: 32 sectors for 128 useful bytes, where a coalesced warp access needs 4
sectors of one line and 16-byte lanes would need a quarter of the requests. The rest of each loaded sector serves the
thread's next 7 loads only if its line is still in L1, and the stores reach L2 as 16.8M 4-byte partial-sector writes
where 2.1M full sectors would do. Occupancy is not the limit on paper: 64 registers x 512 threads leave 2 CTAs (32
warps) per SM, the 1024 CTAs are ~3.9 waves on 132 SMs, and each thread has 32 loads in flight. The likely cause of
the 0.094 is that request count, not DRAM bandwidth. Likely fixes, untried: lanes along k (a warp reads one v row's
512 contiguous bytes as 32 16-byte loads; the k.S and q.S sums become 5-step shuffles), or 16-byte loads and stores
with the current mapping.
"""

import torch
import tvm
from tvm.script import tirx as Tx

KSPLIT = 4
_CACHE = {}


def _make(HK: int, HV: int, K: int, V: int, SCALE: float):
    NT = V * KSPLIT
    NW = NT // 32
    KR = K // KSPLIT
    REP = HV // HK

    @Tx.prim_func
    def gdn_decode(q_ptr: Tx.handle, k_ptr: Tx.handle, v_ptr: Tx.handle, a_ptr: Tx.handle, b_ptr: Tx.handle,
                   alog_ptr: Tx.handle, dtb_ptr: Tx.handle, s_ptr: Tx.handle, ns_ptr: Tx.handle, o_ptr: Tx.handle):
        B = Tx.int32()
        Q = Tx.match_buffer(q_ptr, (B, HK, K), "bfloat16")
        Kt = Tx.match_buffer(k_ptr, (B, HK, K), "bfloat16")
        Vt = Tx.match_buffer(v_ptr, (B, HV, V), "bfloat16")
        A = Tx.match_buffer(a_ptr, (B, HV), "bfloat16")
        Bb = Tx.match_buffer(b_ptr, (B, HV), "bfloat16")
        Alog = Tx.match_buffer(alog_ptr, (HV,), "float32")
        Dtb = Tx.match_buffer(dtb_ptr, (HV,), "float32")
        S = Tx.match_buffer(s_ptr, (B, HV, V, K), "float32")
        NS = Tx.match_buffer(ns_ptr, (B, HV, V, K), "float32")
        O = Tx.match_buffer(o_ptr, (B, HV, V), "bfloat16")
        Tx.device_entry()
        h, i = Tx.cta_id([HV, B])
        tx = Tx.thread_id([NT])
        qs = Tx.alloc_shared((K,), "float32")
        ks = Tx.alloc_shared((K,), "float32")
        red_qk = Tx.alloc_shared((NW,), "float32")
        part_kv = Tx.alloc_shared((KSPLIT, V), "float32")
        part_qs = Tx.alloc_shared((KSPLIT, V), "float32")
        s = Tx.alloc_local((KR,), "float32")
        hk: Tx.let[Tx.int32] = h // REP
        v: Tx.let[Tx.int32] = tx % V
        kh: Tx.let[Tx.int32] = tx // V
        # issue the state loads first: their latency overlaps the q.k reduction below
        for j in Tx.unroll(KR):
            s[j] = S[i, h, v, kh * KR + j]
        qk: Tx.float32 = Tx.float32(0)
        if tx < K:
            qv: Tx.let[Tx.float32] = Tx.Cast("float32", Q[i, hk, tx])
            kv: Tx.let[Tx.float32] = Tx.Cast("float32", Kt[i, hk, tx])
            qs[tx] = qv
            ks[tx] = kv
            qk = qv * kv
        qk = Tx.cuda.cta_sum(qk, NW, red_qk.ptr_to([0]))
        Tx.cuda.cta_sync()  # qs and ks are read by every thread below
        x: Tx.let[Tx.float32] = Tx.Cast("float32", A[i, h]) + Dtb[h]
        sp: Tx.let[Tx.float32] = Tx.if_then_else(x > Tx.float32(20), x, Tx.log1p(Tx.exp(x)))
        decay: Tx.let[Tx.float32] = Tx.exp(Tx.float32(0) - Tx.exp(Alog[h]) * sp)
        beta: Tx.let[Tx.float32] = Tx.float32(1) / (Tx.float32(1) + Tx.exp(Tx.float32(0) - Tx.Cast("float32", Bb[i, h])))
        kvp: Tx.float32 = Tx.float32(0)
        qsp: Tx.float32 = Tx.float32(0)
        for j in Tx.unroll(KR):
            sv: Tx.let[Tx.float32] = s[j] * decay
            s[j] = sv
            kvp = kvp + ks[kh * KR + j] * sv
            qsp = qsp + qs[kh * KR + j] * sv
        part_kv[kh, v] = kvp
        part_qs[kh, v] = qsp
        Tx.cuda.cta_sync()
        kvm: Tx.float32 = Tx.float32(0)
        qsm: Tx.float32 = Tx.float32(0)
        for u in Tx.unroll(KSPLIT):
            kvm = kvm + part_kv[u, v]
            qsm = qsm + part_qs[u, v]
        delta: Tx.let[Tx.float32] = (Tx.Cast("float32", Vt[i, h, v]) - kvm) * beta
        if kh == 0:
            O[i, h, v] = Tx.Cast("bfloat16", Tx.float32(SCALE) * (qsm + qk * delta))
        for j in Tx.unroll(KR):
            NS[i, h, v, kh * KR + j] = s[j] + ks[kh * KR + j] * delta

    return gdn_decode


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(key):
    fn = _CACHE.get(key)
    if fn is None:
        HK, HV, K, V, SCALE = key
        if (V * KSPLIT) % 32 or K % KSPLIT or V * KSPLIT > 1024 or K > V * KSPLIT or HV % HK:
            raise ValueError(f"unsupported head geometry {key}")
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            fn = tvm.compile(tvm.IRModule({"main": _make(*key)}), target=target, tir_pipeline="tirx")
        _CACHE[key] = fn
    return fn


def solve(q, k, v, state, A_log, a, dt_bias, b, scale):
    B, _, HK, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = torch.empty((B, 1, HV, V), dtype=q.dtype, device=q.device)
    new_state = torch.empty_like(state)
    fn = _kernel((HK, HV, K, V, float(scale)))
    fn(q.reshape(B, HK, K).contiguous(), k.reshape(B, HK, K).contiguous(), v.reshape(B, HV, V).contiguous(),
       a.reshape(B, HV).contiguous(), b.reshape(B, HV).contiguous(), A_log.contiguous(), dt_bias.contiguous(),
       state.contiguous(), new_state, o.view(B, HV, V))
    return o, new_state
