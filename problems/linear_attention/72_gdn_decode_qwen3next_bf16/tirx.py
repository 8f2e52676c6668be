"""Baseline (TIRx): Gated DeltaNet decode step, one CTA per (request, value head), state read and written once.

Thread t owns state column v = t % V and rows k in [kh*K/4, (kh+1)*K/4), kh = t // V, in
registers (loaded first, so their latency overlaps the rest of the prologue). The CTA normalises q and k (shared memory + `Tx.cuda.cta_sum`), computes the gate and
beta, streams its state slice in (decayed), reduces k.S and q.S over k, and uses
o = q.S' + (q.k) * delta (the same sum as q.(S' + k delta^T)) so the state is read once and
written once. Compiled once per shape; launched on torch's current stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

KSPLIT = 4
L2_EPS = 1e-6
_CACHE = {}


def _make(NS: int, HK: int, HV: int, K: int, V: int):
    NT = V * KSPLIT
    NW = NT // 32
    KR = K // KSPLIT
    REP = HV // HK
    SCALE = float(K) ** -0.5

    @Tx.prim_func
    def gdn_decode(q_ptr: Tx.handle, k_ptr: Tx.handle, v_ptr: Tx.handle, a_ptr: Tx.handle, b_ptr: Tx.handle,
                   alog_ptr: Tx.handle, dtb_ptr: Tx.handle, s_ptr: Tx.handle, idx_ptr: Tx.handle, o_ptr: Tx.handle):
        B = Tx.int32()
        Q = Tx.match_buffer(q_ptr, (B, HK, K), "bfloat16")
        Kt = Tx.match_buffer(k_ptr, (B, HK, K), "bfloat16")
        Vt = Tx.match_buffer(v_ptr, (B, HV, V), "bfloat16")
        A = Tx.match_buffer(a_ptr, (B, HV), "bfloat16")
        Bb = Tx.match_buffer(b_ptr, (B, HV), "bfloat16")
        Alog = Tx.match_buffer(alog_ptr, (HV,), "float32")
        Dtb = Tx.match_buffer(dtb_ptr, (HV,), "float32")
        S = Tx.match_buffer(s_ptr, (NS, HV, K, V), "float32")
        Idx = Tx.match_buffer(idx_ptr, (B,), "int32")
        O = Tx.match_buffer(o_ptr, (B, HV, V), "bfloat16")
        Tx.device_entry()
        h, i = Tx.cta_id([HV, B])
        tx = Tx.thread_id([NT])
        qs = Tx.alloc_shared((K,), "float32")
        ks = Tx.alloc_shared((K,), "float32")
        red_q = Tx.alloc_shared((NW,), "float32")
        red_k = Tx.alloc_shared((NW,), "float32")
        red_qk = Tx.alloc_shared((NW,), "float32")
        part_kv = Tx.alloc_shared((KSPLIT, V), "float32")
        part_qs = Tx.alloc_shared((KSPLIT, V), "float32")
        s = Tx.alloc_local((KR,), "float32")
        hk: Tx.let[Tx.int32] = h // REP
        slot: Tx.let[Tx.int32] = Idx[i]
        v: Tx.let[Tx.int32] = tx % V
        kh: Tx.let[Tx.int32] = tx // V
        # issue the state loads first: their latency overlaps the q/k normalisation below
        for j in Tx.unroll(KR):
            s[j] = S[slot, h, kh * KR + j, v]
        qq: Tx.float32 = Tx.float32(0)
        kk2: Tx.float32 = Tx.float32(0)
        qk: Tx.float32 = Tx.float32(0)
        if tx < K:
            qv: Tx.let[Tx.float32] = Tx.Cast("float32", Q[i, hk, tx])
            kv: Tx.let[Tx.float32] = Tx.Cast("float32", Kt[i, hk, tx])
            qs[tx] = qv
            ks[tx] = kv
            qq = qv * qv
            kk2 = kv * kv
            qk = qv * kv
        qq = Tx.cuda.cta_sum(qq, NW, red_q.ptr_to([0]))
        kk2 = Tx.cuda.cta_sum(kk2, NW, red_k.ptr_to([0]))
        qk = Tx.cuda.cta_sum(qk, NW, red_qk.ptr_to([0]))
        rq: Tx.let[Tx.float32] = Tx.rsqrt(qq + Tx.float32(L2_EPS)) * Tx.float32(SCALE)
        rk: Tx.let[Tx.float32] = Tx.rsqrt(kk2 + Tx.float32(L2_EPS))
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
        part_kv[kh, v] = kvp * rk
        part_qs[kh, v] = qsp * rq
        Tx.cuda.cta_sync()
        kvm: Tx.float32 = Tx.float32(0)
        qsm: Tx.float32 = Tx.float32(0)
        for u in Tx.unroll(KSPLIT):
            kvm = kvm + part_kv[u, v]
            qsm = qsm + part_qs[u, v]
        delta: Tx.let[Tx.float32] = (Tx.Cast("float32", Vt[i, h, v]) - kvm) * beta
        if kh == 0:
            O[i, h, v] = Tx.Cast("bfloat16", qsm + qk * rq * rk * delta)
        for j in Tx.unroll(KR):
            S[slot, h, kh * KR + j, v] = s[j] + ks[kh * KR + j] * rk * delta

    return gdn_decode


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(key):
    fn = _CACHE.get(key)
    if fn is None:
        NS, HK, HV, K, V = key
        if (V * KSPLIT) % 32 or K % KSPLIT or V * KSPLIT > 1024 or K > V * KSPLIT or HV % HK:
            raise ValueError(f"unsupported head geometry {key}")
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            fn = tvm.compile(tvm.IRModule({"main": _make(*key)}), target=target, tir_pipeline="tirx")
        _CACHE[key] = fn
    return fn


def solve(q, k, v, a, b, A_log, dt_bias, ssm_state, state_indices):
    B, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    o = torch.empty((B, HV, V), dtype=q.dtype, device=q.device)
    fn = _kernel((ssm_state.shape[0], HK, HV, K, V))
    fn(q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous(), A_log.contiguous(),
       dt_bias.contiguous(), ssm_state, state_indices.contiguous(), o)
    return o, ssm_state
