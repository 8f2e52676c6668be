"""Baseline (TIRx): batched KV-cache block copy into separate destination caches, 16-byte vector copies.

A cache block is contiguous in vLLM's layout, so each of the four caches is viewed (no copy) as int32
words [blocks, words_per_block]. One CTA per (pair, cache) copies one block from the source cache
into the destination cache with `int32x4` (16-byte) loads and stores; the source/destination ids
come from the int64 mapping. Compiled once per cache geometry; launched on torch's current stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

_CACHE = {}


def _make(NB: int, W: int):
    VEC = W // 4  # int32x4 vectors per block
    NT = min(256, ((VEC + 31) // 32) * 32)
    ITERS = (VEC + NT - 1) // NT

    @Tx.prim_func
    def kv_block_copy(sk_ptr: Tx.handle, sv_ptr: Tx.handle, dk_ptr: Tx.handle, dv_ptr: Tx.handle, m_ptr: Tx.handle):
        P = Tx.int32()
        SK = Tx.match_buffer(sk_ptr, (NB, W), "int32")
        SV = Tx.match_buffer(sv_ptr, (NB, W), "int32")
        DK = Tx.match_buffer(dk_ptr, (NB, W), "int32")
        DV = Tx.match_buffer(dv_ptr, (NB, W), "int32")
        Map = Tx.match_buffer(m_ptr, (P, 2), "int64")
        Tx.device_entry()
        p, c = Tx.cta_id([P, 2])
        tx = Tx.thread_id([NT])
        src: Tx.let[Tx.int32] = Tx.Cast("int32", Map[p, 0])
        dst: Tx.let[Tx.int32] = Tx.Cast("int32", Map[p, 1])
        for it in Tx.unroll(ITERS):
            e: Tx.let[Tx.int32] = it * NT + tx
            if e < VEC:
                if c == 0:
                    DK.vstore([dst, e * 4], SK.vload([src, e * 4], dtype="int32x4"))
                else:
                    DV.vstore([dst, e * 4], SV.vload([src, e * 4], dtype="int32x4"))

    return kv_block_copy


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(NB: int, W: int):
    key = (NB, W)
    fn = _CACHE.get(key)
    if fn is None:
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            fn = tvm.compile(tvm.IRModule({"main": _make(NB, W)}), target=target, tir_pipeline="tirx")
        _CACHE[key] = fn
    return fn


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    NB = src_k.shape[0]
    words = [t.view(NB, -1).view(torch.int32) for t in (src_k, src_v, dst_k, dst_v)]
    if any(w.shape != words[0].shape for w in words) or words[0].shape[-1] % 4:
        raise ValueError("all four caches must have the same geometry, blocks a multiple of 16 bytes")
    _kernel(NB, words[0].shape[-1])(*words, block_mapping.contiguous())
    return dst_k, dst_v
