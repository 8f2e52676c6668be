"""Baseline (TIRx): batched KV-cache block copy with remapping, 16-byte vector copies.

A cache block of one layer is contiguous in both vLLM layouts, so each cache is viewed (no copy)
as int32 words [layers, blocks, words_per_block]. One CTA per (pair, layer, cache) copies one
block with `int32x4` (16-byte) loads and stores; the source/destination ids come from the int64
mapping. Compiled once per cache geometry; launched on torch's current stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

_CACHE = {}


def _make(L: int, NB: int, W: int):
    VEC = W // 4  # int32x4 vectors per block
    NT = min(256, ((VEC + 31) // 32) * 32)
    ITERS = (VEC + NT - 1) // NT

    @Tx.prim_func
    def kv_block_copy(k_ptr: Tx.handle, v_ptr: Tx.handle, m_ptr: Tx.handle):
        P = Tx.int32()
        Kc = Tx.match_buffer(k_ptr, (L, NB, W), "int32")
        Vc = Tx.match_buffer(v_ptr, (L, NB, W), "int32")
        Map = Tx.match_buffer(m_ptr, (P, 2), "int64")
        Tx.device_entry()
        p, l, c = Tx.cta_id([P, L, 2])
        tx = Tx.thread_id([NT])
        src: Tx.let[Tx.int32] = Tx.Cast("int32", Map[p, 0])
        dst: Tx.let[Tx.int32] = Tx.Cast("int32", Map[p, 1])
        for it in Tx.unroll(ITERS):
            e: Tx.let[Tx.int32] = it * NT + tx
            if e < VEC:
                if c == 0:
                    Kc.vstore([l, dst, e * 4], Kc.vload([l, src, e * 4], dtype="int32x4"))
                else:
                    Vc.vstore([l, dst, e * 4], Vc.vload([l, src, e * 4], dtype="int32x4"))

    return kv_block_copy


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(L: int, NB: int, W: int):
    key = (L, NB, W)
    fn = _CACHE.get(key)
    if fn is None:
        target = tvm.target.Target({"kind": "cuda", "arch": _arch()})
        with target:
            fn = tvm.compile(tvm.IRModule({"main": _make(L, NB, W)}), target=target, tir_pipeline="tirx")
        _CACHE[key] = fn
    return fn


def solve(key_caches, value_caches, block_mapping):
    L, NB = key_caches.shape[:2]
    kw = key_caches.view(L, NB, -1).view(torch.int32)
    vw = value_caches.view(L, NB, -1).view(torch.int32)
    if kw.shape != vw.shape or kw.shape[-1] % 4:
        raise ValueError("key and value blocks must have the same size, a multiple of 16 bytes")
    _kernel(L, NB, kw.shape[-1])(kw, vw, block_mapping.contiguous())
    return key_caches, value_caches
