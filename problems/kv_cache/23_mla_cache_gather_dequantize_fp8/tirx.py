"""Baseline (TIRx): paged fp8 MLA cache gather + dequantise, one thread per 16-byte chunk of a token row.

Strategy: the cache bytes are viewed (no copy) as float8_e4m3fn [blocks * block_size, E] and the
output is fp32 [tokens, E]; V = 16 codes per thread when E divides (576 = 36 x 16), else 8 or 4,
so C = E / V threads cover a row. A CTA owns ROWS consecutive output rows (ROWS x C threads, about
256): a warp reads consecutive 16-byte chunks of one cache row (coalesced `float8_e4m3fnx16` loads)
and the CTA writes one contiguous span of the output with `float32x4` stores. Each thread finds its
row's request from the running sum of seq_lens (R <= 8 int32 loads, unrolled; zero-length requests
are skipped naturally), then the block from block_table, converts each code with `Cast("float32")`
(exact: every e4m3 value, subnormals included, is an fp32; 0x7f/0xff become NaN) and multiplies by
scale rounded to fp32 (as torch multiplies an fp32 tensor by a Python float). The host reads seq_lens
once (32 bytes, one sync: a declared structure input) only to size the output.

Bound: memory. 4096 x 576 x (1 B in + 4 B out) = 11.8 MB, about 2.5 us at 4.8 TB/s; 586 CTAs of
252 threads are one wave, so launch latency and the host read of seq_lens dominate the call.
Compiled once per (cache geometry, requests, block-table width, scale); tokens are dynamic.

Against torch.compile: 154.0 us, 0.77x torch.compile (119.0 us) and 3.01x eager; the CuTe DSL version 111.0 us, 1.07x
(problems/README.md speed table, events/h200-grader-2-2). Host-bound: both the ratio and the gap to CuTe DSL sit
within the timing spread of a call that syncs with the host. The output's row count is sum(seq_lens), so every
solution reads seq_lens on the host (torch.compile's too: a graph break, 2 graphs, per-call CV 0.35 in
events/h200-torch-compile). The timing window then holds that sync and the host's wake-up after it: this file's
three gradings in h200-grader-2-2 took 249.9, 156.2 and 154.0 us (CuTe DSL's 197.5, 130.6 and 111.0 us;
events/h200-grader-2-2/logs/README.md), and the same code (docstrings aside) took 90.0 us (CuTe DSL 90.2 us) under
grader 2.1 (events/h200-baselines-2-1). TIRx was the slower of each pair in h200-grader-2-2 but not under 2.1;
the device code is the same design in both DSLs, and what differs after the sync is each DSL's launch path on
the host (not measured apart).

Checked on the CPU in the generated CUDA/PTX: one 16-byte load per thread, one cvt.rn.f16x2.e4m3x2 +
cvt.f32.f16 per code (exact, NaN 0x7f/0xff included), mul.f32 by 0f3DCCCCCD (fp32(0.1)), four
st.global.v4.f32, no local memory; the index logic modelled in numpy against the reference for 5
seeds at both sizes. Not checked without a GPU: the run itself; that torch hands the float8_e4m3fn
view through DLPack (fine with torch 2.13 on the CPU; else pass uint8 and reinterpret); the speed.
"""

import torch
import tvm
from tvm.script import tirx as Tx

_CACHE = {}


def _make(NB: int, BS: int, E: int, R: int, W: int, scale: float):
    V = next(v for v in (16, 8, 4) if E % v == 0)
    C = E // V
    ROWS = max(1, 256 // C)
    NT = ROWS * C
    Q = V // 4

    @Tx.prim_func
    def gather_dequant(src_ptr: Tx.handle, bt_ptr: Tx.handle, lens_ptr: Tx.handle, out_ptr: Tx.handle):
        N = Tx.int32()
        Src = Tx.match_buffer(src_ptr, (NB * BS, E), "float8_e4m3fn")
        BT = Tx.match_buffer(bt_ptr, (R, W), "int32")
        Lens = Tx.match_buffer(lens_ptr, (R,), "int32")
        Out = Tx.match_buffer(out_ptr, (N, E), "float32")
        Tx.device_entry()
        bid = Tx.cta_id([(N + ROWS - 1) // ROWS])
        tx = Tx.thread_id([NT])
        codes = Tx.alloc_local((V,), "float8_e4m3fn")
        vals = Tx.alloc_local((V,), "float32")
        row: Tx.let[Tx.int32] = bid * ROWS + tx // C
        c: Tx.let[Tx.int32] = tx % C
        if row < N:
            # request of this row: the number of requests that end at or before it
            end: Tx.int32 = Tx.int32(0)
            req: Tx.int32 = Tx.int32(0)
            start: Tx.int32 = Tx.int32(0)
            for i in Tx.unroll(R):
                end = end + Lens[i]
                if end <= row:
                    req = req + 1
                    start = end
            pos: Tx.let[Tx.int32] = row - start
            blk: Tx.let[Tx.int32] = BT[req, pos // BS]
            codes.vstore([0], Src.vload([blk * BS + pos % BS, c * V], dtype=f"float8_e4m3fnx{V}"))
            for e in Tx.unroll(V):
                vals[e] = Tx.Cast("float32", codes[e]) * Tx.float32(scale)
            for q in Tx.unroll(Q):
                Out.vstore([row, c * V + q * 4], vals.vload([q * 4], dtype="float32x4"))

    return gather_dequant


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(NB: int, BS: int, E: int, R: int, W: int, scale: float):
    key = (NB, BS, E, R, W, scale)
    fn = _CACHE.get(key)
    if fn is None:
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            fn = tvm.compile(tvm.IRModule({"main": _make(NB, BS, E, R, W, scale)}), target=target, tir_pipeline="tirx")
        _CACHE[key] = fn
    return fn


def solve(src_cache, block_table, seq_lens, scale):
    NB, BS, E = src_cache.shape
    if E % 4:
        raise ValueError(f"cache row of {E} bytes: this kernel needs a multiple of 4")
    R, W = block_table.shape
    n = sum(seq_lens.tolist())  # the output size: 32 bytes read on the host (a declared structure input)
    out = torch.empty((n, E), dtype=torch.float32, device=src_cache.device)
    src = src_cache.contiguous().view(torch.float8_e4m3fn).view(NB * BS, E)
    _kernel(NB, BS, E, R, W, float(scale))(src, block_table.contiguous(), seq_lens.contiguous(), out)
    return out
