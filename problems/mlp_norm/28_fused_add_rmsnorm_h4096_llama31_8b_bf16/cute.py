"""Baseline (CuTe DSL): fused residual add + RMSNorm, one CTA per row, 128-bit vector copies, the row kept in registers.

Rows are viewed as [rows, hidden/8, 8] so each group of 8 bf16 is a 16-byte vector. Each thread
owns hidden/(8*NT) groups (group index k*NT + tid so a warp reads contiguous memory), copies them
into registers with a 128-bit copy atom, adds x + residual in fp32 once, reduces the sum of
squares (warp shuffle, then shared memory), then writes y = s * rsqrt(mean + eps) * w with 128-bit
stores. Compiled once per hidden size with TVM-FFI on fake tensors (rows dynamic), launched on
torch's current stream.

Against torch.compile: 83.2 us, 0.99x torch.compile (max-autotune-no-cudagraphs, 82.6 us), 13.44x eager, 0.893 of
the speed of light (356.6 MB, 74.3 us at 4.8 TB/s); the TIRx version 83.0 us, 1.00x (problems/README.md speed table,
events/h200-grader-2-2). At parity within the timing spread (this file: 82.4-83.5 us over seven gradings in that
dataset): the kernel reads x and the residual and writes y once each, at 89% of the HBM roof, so torch.compile (82.6
us, 0.90 of the speed of light), this kernel and the TIRx one all sit at the memory bound.
"""

import operator

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32

VEC = 8
EPS = 1e-5
_CACHE = {}


@cute.kernel
def add_rmsnorm_kernel(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, H: cutlass.Constexpr, NT: cutlass.Constexpr):
    PER = H // (VEC * NT)
    NW = NT // 32
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    smem = cutlass.utils.SmemAllocator()
    red = smem.allocate_tensor(Float32, cute.make_layout(NW))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
    xv = cute.make_rmem_tensor(cute.make_layout(VEC), BFloat16)
    rv = cute.make_rmem_tensor(cute.make_layout(VEC), BFloat16)
    ov = cute.make_rmem_tensor(cute.make_layout(VEC), BFloat16)
    s = cute.make_rmem_tensor(cute.make_layout(PER * VEC), Float32)
    ss = Float32(0.0)
    for k in cutlass.range_constexpr(PER):
        cute.copy(atom, mX[row, k * NT + tidx, None], xv)
        cute.copy(atom, mR[row, k * NT + tidx, None], rv)
        for e in cutlass.range_constexpr(VEC):
            v = xv[e].to(Float32) + rv[e].to(Float32)
            s[k * VEC + e] = v
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
    for k in cutlass.range_constexpr(PER):
        cute.copy(atom, mW[k * NT + tidx, None], xv)
        for e in cutlass.range_constexpr(VEC):
            ov[e] = (s[k * VEC + e] * inv * xv[e].to(Float32)).to(BFloat16)
        cute.copy(atom, ov, mY[row, k * NT + tidx, None])


@cute.jit
def add_rmsnorm(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, stream, H: cutlass.Constexpr, NT: cutlass.Constexpr):
    add_rmsnorm_kernel(mX, mR, mW, mY, H, NT).launch(grid=[mX.shape[0], 1, 1], block=[NT, 1, 1], stream=stream)


def _kernel(H: int):
    fn = _CACHE.get(H)
    if fn is None:
        NT = min(256, H // VEC)
        if H % (VEC * 32) or H % (VEC * NT):
            raise ValueError(f"hidden size {H} must be a multiple of {VEC * 32} (and of {VEC * 256} above {VEC * 256})")
        m = cute.sym_int()
        mat = lambda: cute.runtime.make_fake_compact_tensor(BFloat16, (m, H // VEC, VEC), stride_order=(2, 1, 0), assumed_align=16)
        w = cute.runtime.make_fake_compact_tensor(BFloat16, (H // VEC, VEC), stride_order=(1, 0), assumed_align=16)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(add_rmsnorm, mat(), mat(), w, mat(), stream, H, NT, options="--enable-tvm-ffi")
        _CACHE[H] = fn
    return fn


def solve(x, residual, weight):
    H = x.shape[-1]
    y = torch.empty_like(x)
    g = lambda t: t.contiguous().view(-1, H // VEC, VEC)
    _kernel(H)(g(x), g(residual), weight.contiguous().view(H // VEC, VEC), y.view(-1, H // VEC, VEC))
    return y
