"""Baseline (TIRx): fused residual add + RMSNorm, one CTA per row, 16-byte vector loads, the row kept in registers.

Each thread owns hidden/(8*NT) chunks of 8 bf16 (16 bytes; chunk index k*NT + tx so a warp reads
contiguous memory), loads them with `bfloat16x8` vector loads, adds x + residual in fp32 once,
reduces the sum of squares with `Tx.cuda.cta_sum`, then writes y = s * rsqrt(mean + eps) * w
with vector stores. One kernel per hidden size, compiled on first use.

Against torch.compile: 83.0 us, 1.00x torch.compile (max-autotune-no-cudagraphs, 82.6 us), 13.46x eager, 0.895 of
the speed of light (356.6 MB, 74.3 us at 4.8 TB/s); the CuTe DSL version 83.2 us, 0.99x (problems/README.md speed
table, events/h200-grader-2-2). At parity within the timing spread (this file: 82.4-83.2 us over seven gradings in
that dataset): the kernel reads x and the residual and writes y once each, at 90% of the HBM roof, so torch.compile
(82.6 us, 0.90 of the speed of light), this kernel and the CuTe DSL one all sit at the memory bound.
"""

import torch
import tvm
from tvm.script import tirx as Tx

VEC = 8
EPS = 1e-5
_CACHE = {}


def _make(H: int):
    NT = min(256, H // VEC)
    NW = NT // 32
    PER = H // (VEC * NT)

    @Tx.prim_func
    def add_rmsnorm(x_ptr: Tx.handle, r_ptr: Tx.handle, w_ptr: Tx.handle, y_ptr: Tx.handle):
        M = Tx.int32()
        X = Tx.match_buffer(x_ptr, (M, H), "bfloat16")
        R = Tx.match_buffer(r_ptr, (M, H), "bfloat16")
        W = Tx.match_buffer(w_ptr, (H,), "bfloat16")
        Y = Tx.match_buffer(y_ptr, (M, H), "bfloat16")
        Tx.device_entry()
        row = Tx.cta_id([M])
        tx = Tx.thread_id([NT])
        red = Tx.alloc_shared((NW,), "float32")
        s = Tx.alloc_local((PER * VEC,), "float32")
        xv = Tx.alloc_local((VEC,), "bfloat16")
        rv = Tx.alloc_local((VEC,), "bfloat16")
        ov = Tx.alloc_local((VEC,), "bfloat16")
        ss: Tx.float32 = Tx.float32(0)
        for k in Tx.unroll(PER):
            xv.vstore([0], X.vload([row, (k * NT + tx) * VEC], dtype="bfloat16x8"))
            rv.vstore([0], R.vload([row, (k * NT + tx) * VEC], dtype="bfloat16x8"))
            for e in Tx.unroll(VEC):
                v: Tx.let[Tx.float32] = Tx.Cast("float32", xv[e]) + Tx.Cast("float32", rv[e])
                s[k * VEC + e] = v
                ss = ss + v * v
        tot: Tx.let[Tx.float32] = Tx.cuda.cta_sum(ss, NW, red.ptr_to([0]))
        inv: Tx.let[Tx.float32] = Tx.rsqrt(tot / Tx.float32(H) + Tx.float32(EPS))
        for k in Tx.unroll(PER):
            xv.vstore([0], W.vload([(k * NT + tx) * VEC], dtype="bfloat16x8"))
            for e in Tx.unroll(VEC):
                ov[e] = Tx.Cast("bfloat16", s[k * VEC + e] * inv * Tx.Cast("float32", xv[e]))
            Y.vstore([row, (k * NT + tx) * VEC], ov.vload([0], dtype="bfloat16x8"))

    return add_rmsnorm


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(H: int):
    fn = _CACHE.get(H)
    if fn is None:
        if H % (VEC * 32) or (H // VEC > 256 and H % (VEC * 256)):
            raise ValueError(f"hidden size {H} must be a multiple of {VEC * 32} (and of {VEC * 256} above {VEC * 256})")
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            fn = tvm.compile(tvm.IRModule({"main": _make(H)}), target=target, tir_pipeline="tirx")
        _CACHE[H] = fn
    return fn


def solve(x, residual, weight):
    y = torch.empty_like(x)
    _kernel(x.shape[-1])(x.contiguous(), residual.contiguous(), weight.contiguous(), y)
    return y
