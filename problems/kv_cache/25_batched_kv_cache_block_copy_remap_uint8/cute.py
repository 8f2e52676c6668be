"""Baseline (CuTe DSL): batched KV-cache block copy with remapping, 16-byte vector copies.

A cache block of one layer is contiguous in both vLLM layouts, so each cache is viewed (no copy)
as int32 words [layers, blocks, vectors, 4]. One CTA per (pair, layer, cache) copies one block,
each thread moving 4 words (16 bytes) per step through a register fragment with a 128-bit copy
atom; the source/destination ids come from the int64 mapping. Compiled once per cache geometry
(static layouts, 16-byte alignment), launched on torch's current stream through TVM-FFI.
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32

_CACHE = {}


@cute.kernel
def kv_block_copy_kernel(mK: cute.Tensor, mV: cute.Tensor, mMap: cute.Tensor, NT: cutlass.Constexpr, ITERS: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    p, l, c = cute.arch.block_idx()
    src = Int32(mMap[p, 0])
    dst = Int32(mMap[p, 1])
    nvec = mK.shape[2]
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=128)
    frag = cute.make_rmem_tensor(cute.make_layout(4), Int32)
    for it in cutlass.range_constexpr(ITERS):
        e = it * NT + tidx
        if e < nvec:
            if c == 0:
                cute.copy(atom, mK[l, src, e, None], frag)
                cute.copy(atom, frag, mK[l, dst, e, None])
            else:
                cute.copy(atom, mV[l, src, e, None], frag)
                cute.copy(atom, frag, mV[l, dst, e, None])


@cute.jit
def kv_block_copy(mK: cute.Tensor, mV: cute.Tensor, mMap: cute.Tensor, stream, NT: cutlass.Constexpr, ITERS: cutlass.Constexpr):
    kv_block_copy_kernel(mK, mV, mMap, NT, ITERS).launch(
        grid=[mMap.shape[0], mK.shape[0], 2], block=[NT, 1, 1], stream=stream
    )


def _kernel(L: int, NB: int, VEC: int):
    key = (L, NB, VEC)
    fn = _CACHE.get(key)
    if fn is None:
        NT = min(256, ((VEC + 31) // 32) * 32)
        ITERS = (VEC + NT - 1) // NT
        cache = lambda: cute.runtime.make_fake_compact_tensor(Int32, (L, NB, VEC, 4), stride_order=(3, 2, 1, 0), assumed_align=16)
        mapping = cute.runtime.make_fake_compact_tensor(cutlass.Int64, (cute.sym_int(), 2), stride_order=(1, 0))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(kv_block_copy, cache(), cache(), mapping, stream, NT, ITERS, options="--enable-tvm-ffi")
        _CACHE[key] = fn
    return fn


def solve(key_caches, value_caches, block_mapping):
    L, NB = key_caches.shape[:2]
    kw = key_caches.view(L, NB, -1).view(torch.int32)
    vw = value_caches.view(L, NB, -1).view(torch.int32)
    if kw.shape != vw.shape or kw.shape[-1] % 4:
        raise ValueError("key and value blocks must have the same size, a multiple of 16 bytes")
    vec = kw.shape[-1] // 4
    _kernel(L, NB, vec)(kw.view(L, NB, vec, 4), vw.view(L, NB, vec, 4), block_mapping.contiguous())
    return key_caches, value_caches
