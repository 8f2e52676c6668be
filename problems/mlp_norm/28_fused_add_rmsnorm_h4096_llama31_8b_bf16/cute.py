"""Baseline (CuTe DSL): fused residual add + RMSNorm, one CTA per row, the row kept in registers.

Each of the 256 threads owns hidden/256 columns (strided, so a warp reads contiguous memory),
adds x + residual in fp32 once, reduces the sum of squares (warp shuffle, then shared memory),
then writes y = s * rsqrt(mean + eps) * w as bf16. Compiled once per hidden size with TVM-FFI on
fake tensors (rows dynamic), launched on torch's current stream.
"""

import operator

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

NT = 256
NW = NT // 32
EPS = 1e-5
_CACHE = {}


@cute.kernel
def add_rmsnorm_kernel(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, H: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    smem = cutlass.utils.SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout(NW))
    s = cute.make_rmem_tensor(cute.make_layout(H // NT), Float32)
    ss = Float32(0.0)
    for k in cutlass.range_constexpr(H // NT):
        v = mX[row, k * NT + tidx].to(Float32) + mR[row, k * NT + tidx].to(Float32)
        s[k] = v
        ss = ss + v * v
    ss = cute.arch.warp_reduction(ss, operator.add)
    lane = cute.arch.lane_idx()
    warp = cute.arch.warp_idx()
    if lane == 0:
        red[warp] = ss
    cute.arch.sync_threads()
    tot = Float32(0.0)
    if lane < NW:
        tot = red[lane]
    tot = cute.arch.warp_reduction(tot, operator.add)
    inv = cute.math.rsqrt(tot / Float32(H) + Float32(EPS))
    for k in cutlass.range_constexpr(H // NT):
        mY[row, k * NT + tidx] = (s[k] * inv * mW[k * NT + tidx].to(Float32)).to(mY.element_type)


@cute.jit
def add_rmsnorm(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, stream, H: cutlass.Constexpr):
    add_rmsnorm_kernel(mX, mR, mW, mY, H).launch(grid=[mX.shape[0], 1, 1], block=[NT, 1, 1], stream=stream)


def _kernel(H: int):
    fn = _CACHE.get(H)
    if fn is None:
        if H % NT:
            raise ValueError(f"hidden size {H} must be a multiple of {NT}")
        m = cute.sym_int()
        mat = lambda: cute.runtime.make_fake_compact_tensor(cutlass.BFloat16, (m, H), stride_order=(1, 0), assumed_align=16)
        w = cute.runtime.make_fake_compact_tensor(cutlass.BFloat16, (H,), assumed_align=16)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(add_rmsnorm, mat(), mat(), w, mat(), stream, H, options="--enable-tvm-ffi")
        _CACHE[H] = fn
    return fn


def solve(x, residual, weight):
    y = torch.empty_like(x)
    _kernel(x.shape[-1])(x.contiguous(), residual.contiguous(), weight.contiguous(), y)
    return y
