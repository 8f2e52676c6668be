"""Baseline (CuTe DSL): batched KV-cache block copy into separate destination caches, 16-byte vector copies.

A cache block is contiguous in vLLM's layout, so each of the four caches is viewed (no copy) as int32
words [blocks, vectors, 4]. One CTA per (pair, cache) copies one block from the source cache into
the destination cache, each thread moving 4 words (16 bytes) per step through a register fragment
with a 128-bit copy atom; the source/destination ids come from the int64 mapping. Compiled once per
cache geometry (static layouts, 16-byte alignment), launched on torch's current stream through TVM-FFI.

Against torch.compile: 21.0 us, 0.99x torch.compile (max-autotune-no-cudagraphs, 20.7 us), 13.11x eager, 0.67 of the
speed of light (67.1 MB moved, 14.0 us at 4.8 TB/s) (problems/README.md speed table, events/h200-grader-2-2): at
parity within this file's spread between gradings (20.7-21.7 us over six gradings in that dataset; every draw is
a new block mapping). The TIRx version of the same copy is 7% faster (19.6 us, 1.06x; 19.3-19.6 us), and the code
shows why: nothing tells the compiler that the source and destination caches do not alias, so each 16-byte load
stays behind the previous store (the sm_90a SASS, ptxas 13.0 on the CPU, alternates LDG.E.128 / STG.E.128: one
load in flight per thread), while TIRx passes `__restrict__` pointers and nvcc issues 7 of its 16-byte loads before
the first store. Not yet tuned: loading a thread's ITERS fragments before storing any is the likely fix (not
measured).
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32

_CACHE = {}


@cute.kernel
def kv_block_copy_kernel(mSK: cute.Tensor, mSV: cute.Tensor, mDK: cute.Tensor, mDV: cute.Tensor, mMap: cute.Tensor,
                         NT: cutlass.Constexpr, ITERS: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    p, c, _ = cute.arch.block_idx()
    src = Int32(mMap[p, 0])
    dst = Int32(mMap[p, 1])
    nvec = mSK.shape[1]
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=128)
    frag = cute.make_rmem_tensor(cute.make_layout(4), Int32)
    for it in cutlass.range_constexpr(ITERS):
        e = it * NT + tidx
        if e < nvec:
            if c == 0:
                cute.copy(atom, mSK[src, e, None], frag)
                cute.copy(atom, frag, mDK[dst, e, None])
            else:
                cute.copy(atom, mSV[src, e, None], frag)
                cute.copy(atom, frag, mDV[dst, e, None])


@cute.jit
def kv_block_copy(mSK: cute.Tensor, mSV: cute.Tensor, mDK: cute.Tensor, mDV: cute.Tensor, mMap: cute.Tensor, stream,
                  NT: cutlass.Constexpr, ITERS: cutlass.Constexpr):
    kv_block_copy_kernel(mSK, mSV, mDK, mDV, mMap, NT, ITERS).launch(
        grid=[mMap.shape[0], 2, 1], block=[NT, 1, 1], stream=stream
    )


def _kernel(NB: int, VEC: int):
    key = (NB, VEC)
    fn = _CACHE.get(key)
    if fn is None:
        NT = min(256, ((VEC + 31) // 32) * 32)
        ITERS = (VEC + NT - 1) // NT
        cache = lambda: cute.runtime.make_fake_compact_tensor(Int32, (NB, VEC, 4), stride_order=(2, 1, 0), assumed_align=16)
        mapping = cute.runtime.make_fake_compact_tensor(cutlass.Int64, (cute.sym_int(), 2), stride_order=(1, 0))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(kv_block_copy, cache(), cache(), cache(), cache(), mapping, stream, NT, ITERS,
                          options="--enable-tvm-ffi")
        _CACHE[key] = fn
    return fn


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    NB = src_k.shape[0]
    words = [t.view(NB, -1).view(torch.int32) for t in (src_k, src_v, dst_k, dst_v)]
    if any(w.shape != words[0].shape for w in words) or words[0].shape[-1] % 4:
        raise ValueError("all four caches must have the same geometry, blocks a multiple of 16 bytes")
    vec = words[0].shape[-1] // 4
    _kernel(NB, vec)(*(w.view(NB, vec, 4) for w in words), block_mapping.contiguous())
    return dst_k, dst_v
