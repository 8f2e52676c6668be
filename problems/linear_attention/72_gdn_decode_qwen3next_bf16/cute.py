"""Baseline (CuTe DSL): Gated DeltaNet decode step, one CTA per (value head, request), state read and written once.

Thread t owns state column v = t % V and rows k in [kh*K/4, (kh+1)*K/4), kh = t // V, in
registers (loaded first, so their latency overlaps the rest of the prologue). The state arrives in
k-last layout ([V, K] per head), so thread t reads and writes the contiguous run state[i, h, v, kh*K/4 ...].
The CTA stages q and k in shared memory, computes q.k (warp-shuffle/shared block sum), the decay and
beta, decays its state slice, reduces k.S and q.S over k, and uses o = scale * (q.S' + (q.k) * delta)
(the same sum as scale * q.(S' + k delta^T)) so the state is read once and the new state written once.
Compiled once per shape and scale with TVM-FFI; launched on torch's current stream.

Against torch.compile: 290-292 us (events/h200-checks-ab-2, events/h200-grader-2-3), about 0.3x torch.compile (its
faster mode, max-autotune-no-cudagraphs, 89.9 us; default mode 142.7 us; events/h200-torch-compile), 1.08-1.11x eager,
0.094-0.097 of the speed of light (135.0 MB, the fp32 state read and written once: 2 x 67.1 MB, 28.1 us at 4.8 TB/s);
the TIRx version, the same design, 295-299 us with the same ratios (problems/README.md speed table). Not yet tuned; no
missing primitive. What the code does, read from the sm_90a SASS (ptxas 13.0 on the CPU; none of it measured on a
GPU): each thread reads its 32 state values with 32 scalar 4-byte loads (LDG.E: the loop indexes element by element,
so nothing is vectorised), all issued before the first barrier, and writes them back with 32 scalar stores. A warp's
32 lanes hold 32 consecutive v, i.e. rows 512 bytes apart, so every warp-wide load or store touches 32 different
128-byte lines, 4 bytes in each: 32 sectors for 128 useful bytes, where a coalesced warp access needs 4 sectors of one
line and 16-byte lanes would need a quarter of the requests. The rest of each loaded sector serves the thread's next 7
loads only if its line is still in L1, and the stores reach L2 as 16.8M 4-byte partial-sector writes where 2.1M full
sectors would do. Occupancy is not the limit on paper: 64 registers x 512 threads leave 2 CTAs (32 warps) per SM, the
1024 CTAs are ~3.9 waves on 132 SMs, and each thread has 32 loads in flight. The likely cause of the 0.094 is that
request count, not DRAM bandwidth. Likely fixes, untried: lanes along k (a warp reads one v row's 512 contiguous bytes
as 32 16-byte loads; the k.S and q.S sums become 5-step shuffles), or 16-byte loads and stores with the current
mapping.
"""

import operator

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

KSPLIT = 4
_CACHE = {}


@cute.jit
def block_sum(val: Float32, sbuf: cute.Tensor, NW: cutlass.Constexpr) -> Float32:
    lane = cute.arch.lane_idx()
    warp = cute.arch.warp_idx()
    val = cute.arch.warp_reduction(val, operator.add)
    if lane == 0:
        sbuf[warp] = val
    cute.arch.sync_threads()
    tot = Float32(0.0)
    if lane < NW:
        tot = sbuf[lane]
    return cute.arch.warp_reduction(tot, operator.add)


@cute.kernel
def gdn_decode_kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
                      mAlog: cute.Tensor, mDtb: cute.Tensor, mS: cute.Tensor, mNS: cute.Tensor, mO: cute.Tensor,
                      K: cutlass.Constexpr, V: cutlass.Constexpr, REP: cutlass.Constexpr, SCALE: cutlass.Constexpr):
    NT = V * KSPLIT
    NW = NT // 32
    KR = K // KSPLIT
    tidx, _, _ = cute.arch.thread_idx()
    h, i, _ = cute.arch.block_idx()
    smem = cutlass.utils.SmemAllocator()
    qs = smem.allocate_tensor(Float32, cute.make_layout(K))
    ks = smem.allocate_tensor(Float32, cute.make_layout(K))
    red_qk = smem.allocate_tensor(Float32, cute.make_layout(NW))
    part_kv = smem.allocate_tensor(Float32, cute.make_layout((KSPLIT, V), stride=(V, 1)))
    part_qs = smem.allocate_tensor(Float32, cute.make_layout((KSPLIT, V), stride=(V, 1)))
    s = cute.make_rmem_tensor(cute.make_layout(KR), Float32)
    hk = h // REP
    v = tidx % V
    kh = tidx // V
    # issue the state loads first: their latency overlaps the q.k reduction below
    for j in cutlass.range_constexpr(KR):
        s[j] = mS[i, h, v, kh * KR + j]
    qk = Float32(0.0)
    if tidx < K:
        qv = mQ[i, hk, tidx].to(Float32)
        kv = mK[i, hk, tidx].to(Float32)
        qs[tidx] = qv
        ks[tidx] = kv
        qk = qv * kv
    qk = block_sum(qk, red_qk, NW)  # its CTA barrier also publishes qs and ks
    x = mA[i, h].to(Float32) + mDtb[h]
    sp = x
    if x <= Float32(20.0):
        sp = cute.math.log1p(cute.math.exp(x))
    decay = cute.math.exp(-(cute.math.exp(mAlog[h]) * sp))
    beta = Float32(1.0) / (Float32(1.0) + cute.math.exp(-mB[i, h].to(Float32)))
    kvp = Float32(0.0)
    qsp = Float32(0.0)
    for j in cutlass.range_constexpr(KR):
        sv = s[j] * decay
        s[j] = sv
        kvp = kvp + ks[kh * KR + j] * sv
        qsp = qsp + qs[kh * KR + j] * sv
    part_kv[kh, v] = kvp
    part_qs[kh, v] = qsp
    cute.arch.sync_threads()
    kvm = Float32(0.0)
    qsm = Float32(0.0)
    for u in cutlass.range_constexpr(KSPLIT):
        kvm = kvm + part_kv[u, v]
        qsm = qsm + part_qs[u, v]
    delta = (mV[i, h, v].to(Float32) - kvm) * beta
    if kh == 0:
        mO[i, h, v] = (Float32(SCALE) * (qsm + qk * delta)).to(mO.element_type)
    for j in cutlass.range_constexpr(KR):
        mNS[i, h, v, kh * KR + j] = s[j] + ks[kh * KR + j] * delta


@cute.jit
def gdn_decode(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
               mAlog: cute.Tensor, mDtb: cute.Tensor, mS: cute.Tensor, mNS: cute.Tensor, mO: cute.Tensor, stream,
               K: cutlass.Constexpr, V: cutlass.Constexpr, REP: cutlass.Constexpr, SCALE: cutlass.Constexpr):
    gdn_decode_kernel(mQ, mK, mV, mA, mB, mAlog, mDtb, mS, mNS, mO, K, V, REP, SCALE).launch(
        grid=[mV.shape[1], mV.shape[0], 1], block=[V * KSPLIT, 1, 1], stream=stream
    )


def _kernel(key):
    fn = _CACHE.get(key)
    if fn is None:
        HK, HV, K, V, SCALE = key
        if (V * KSPLIT) % 32 or K % KSPLIT or V * KSPLIT > 1024 or K > V * KSPLIT or HV % HK:
            raise ValueError(f"unsupported head geometry {key}")
        B = cute.sym_int()
        rm = lambda dt, *shape: cute.runtime.make_fake_compact_tensor(dt, shape, stride_order=tuple(reversed(range(len(shape)))))
        args = (
            rm(cutlass.BFloat16, B, HK, K), rm(cutlass.BFloat16, B, HK, K), rm(cutlass.BFloat16, B, HV, V),
            rm(cutlass.BFloat16, B, HV), rm(cutlass.BFloat16, B, HV), rm(Float32, HV), rm(Float32, HV),
            rm(Float32, B, HV, V, K), rm(Float32, B, HV, V, K), rm(cutlass.BFloat16, B, HV, V),
        )
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(gdn_decode, *args, stream, K, V, HV // HK, SCALE, options="--enable-tvm-ffi")
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
