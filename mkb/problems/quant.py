"""Plain-PyTorch fp8 e4m3 block scaling and nvfp4 encodings shared by the quantised problems.

These functions are the numerics the quantised problems are specified in. They run anywhere (CPU
included) because nvfp4 has no tensor-core path on Hopper and the fp64 anchor must be computable
on any machine. Every encoding step is done in float32 whatever the input dtype, so that the
float32 reference and the float64 anchor quantise identically whenever their inputs agree: the
quantisation casts are fixed, only the surrounding arithmetic is promoted.

fp8 e4m3 (``torch.float8_e4m3fn``, max 448, no inf) with block scales
    For a block ``B`` of ``x`` (``block=(rows, cols)``; 1x128 for activations, 128x128 for
    weights, as DeepSeek-V3 and the Qwen3 FP8 checkpoints use): ``amax = max(|x| over B)`` in
    float32, ``scale = max(amax, 1e-10) / 448`` (float32, one per block), code =
    ``float8_e4m3fn(clamp(x / scale, -448, 448))`` (round to nearest even). Dequantised value =
    ``float(code) * scale``. Blocks at a ragged edge cover what is left (the scale grid is
    ``ceil(M / rows) x ceil(N / cols)``).

nvfp4 (e2m1 values, fp8 e4m3 scale per 16 consecutive elements, fp32 per-tensor scale)
    e2m1 magnitudes are {0, 0.5, 1, 1.5, 2, 3, 4, 6}, codes 0..7; bit 3 is the sign. With the
    per-tensor *dequantisation* multiplier ``g`` (float32; a tensor "global scale" such that the
    value is ``code_value * block_scale * g``), for each 16-element block along the last dim:
    ``block_scale = float8_e4m3fn(clamp(amax / (6 * g), max=448))`` and code =
    ``e2m1(x / (float(block_scale) * g))`` (float32 division; round to nearest, ties to even code;
    saturate at 6; a zero block scale gives code 0). Codes are packed two per uint8 along the last
    dim: element ``2j`` in the low nibble (bits 0-3), element ``2j+1`` in the high nibble (bits 4-7)
    of byte ``j``. Block scales are stored as ``float8_e4m3fn``, shape ``[..., K // 16]``.
    For weights ``g = amax(W) / (6 * 448)``; for activations ``g`` is a calibrated static input.
"""

from __future__ import annotations

import math

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_SCALE_FLOOR = 1e-10
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rounding boundaries between neighbouring magnitudes, and whether a tie goes up (to the even code).
_E2M1_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype the surrounding (non-quantisation) arithmetic runs in: promote(dtype, float32)."""
    dt = torch.float32
    for t in tensors:
        if t.dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
            dt = torch.promote_types(dt, t.dtype)
    return dt


# ---------------------------------------------------------------- fp8 e4m3 with block scales
def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    m, n = x.shape[-2], x.shape[-1]
    pm, pn = (-m) % rows, (-n) % cols
    if pm or pn:
        x = torch.nn.functional.pad(x, (0, pn, 0, pm))
    return x


def expand_block_scale(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Repeat a per-block scale grid to one value per element of a tensor of `shape`."""
    rows, cols = block
    s = scale.repeat_interleave(rows, dim=-2).repeat_interleave(cols, dim=-1)
    return s[..., : shape[-2], : shape[-1]]


def fp8_quantize(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-scaled fp8 e4m3 of `x` over its last two dims: (codes float8_e4m3fn, scales float32)."""
    rows, cols = block
    xf = x.float()
    m, n = xf.shape[-2], xf.shape[-1]
    xp = _pad_to(xf, rows, cols)
    lead = xp.shape[:-2]
    mb, nb = xp.shape[-2] // rows, xp.shape[-1] // cols
    amax = xp.reshape(*lead, mb, rows, nb, cols).abs().amax(dim=(-3, -1))
    scale = amax.clamp(min=FP8_SCALE_FLOOR) / FP8_MAX
    q = (xf / expand_block_scale(scale, block, xf.shape)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    assert q.shape[-2:] == (m, n)
    return q, scale


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """Codes times their block scale, in `dtype` (codes may arrive as fp8 or as an exact float copy)."""
    return q.to(dtype) * expand_block_scale(scale.to(dtype), block, q.shape)


def fp8_spacing(codes: torch.Tensor) -> torch.Tensor:
    """Distance from each e4m3 code value to the next larger magnitude (subnormal spacing 2^-9)."""
    a = codes.to(torch.float64).abs()
    e = torch.floor(torch.log2(a.clamp(min=2.0**-6)))
    return torch.exp2(e - 3).clamp(min=2.0**-9)


def fp8_values_and_quantum(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantised values and the size of one quantum there (format spacing x block scale), float64."""
    s = expand_block_scale(scale.to(torch.float64), block, q.shape)
    return q.to(torch.float64) * s, fp8_spacing(q) * s


# ---------------------------------------------------------------- nvfp4
def e2m1_encode(y: torch.Tensor) -> torch.Tensor:
    """Round float32 values (already divided by their scale) to e2m1 codes (uint8, 0..15)."""
    a = y.abs()
    mag = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for bound, tie_up in _E2M1_BOUNDS:
        mag += (a >= bound if tie_up else a > bound).to(torch.uint8)
    sign = (y < 0).to(torch.uint8) << 3
    return mag | sign


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15) to their values."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=dtype, device=codes.device)
    return lut[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim: element 2j low nibble, 2j+1 high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_nibbles`: [..., K/2] uint8 -> [..., K] codes."""
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor dequantisation multiplier g = amax / (6 * 448), float32 0-dim tensor."""
    return (x.float().abs().amax().clamp(min=FP8_SCALE_FLOOR) / (E2M1_MAX * FP8_MAX)).reshape(())


def nvfp4_quantize(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nvfp4 of `x` along its last dim (a multiple of 16): (packed uint8 [..., K/2], block scales fp8 [..., K/16])."""
    xf = x.float()
    k = xf.shape[-1]
    if k % NVFP4_BLOCK:
        raise ValueError(f"nvfp4 needs the last dim to be a multiple of 16, got {k}; hint: pad the tensor")
    gf = g.float()
    blocks = xf.reshape(*xf.shape[:-1], k // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    bscale = (amax / (E2M1_MAX * gf)).clamp(max=FP8_MAX).to(FP8)
    denom = (bscale.float() * gf).unsqueeze(-1)
    y = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(blocks))
    codes = e2m1_encode(y).reshape(xf.shape)
    return pack_nibbles(codes), bscale


def nvfp4_dequantize(packed: torch.Tensor, bscale: torch.Tensor, g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values of an nvfp4 tensor in `dtype`: e2m1 value x block scale x g (block scales may arrive as exact floats)."""
    vals = e2m1_decode(unpack_nibbles(packed), dtype)
    s = bscale.to(dtype).repeat_interleave(NVFP4_BLOCK, dim=-1) * g.to(dtype)
    return vals * s


def nvfp4_values_and_quantum(packed: torch.Tensor, bscale: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantised values and one quantum there (e2m1 spacing upward x block scale x g), float64."""
    codes = unpack_nibbles(packed)
    mag = e2m1_decode(codes & 0x7, torch.float64)
    spacing = torch.where(mag < 2, 0.5, torch.where(mag < 4, 1.0, 2.0)).to(torch.float64)
    s = bscale.to(torch.float64).repeat_interleave(NVFP4_BLOCK, dim=-1) * g.to(torch.float64)
    return e2m1_decode(codes, torch.float64) * s, spacing * s


# ---------------------------------------------------------------- quantised linear layers
def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, *, mdt: torch.dtype) -> torch.Tensor:
    """Dynamic 1x128 fp8 quantisation of `x`, then dequant(x) @ dequant(w)^T (128x128 weight blocks) in `mdt`."""
    xq, xs = fp8_quantize(x, (1, 128))
    return fp8_dequantize(xq, xs, (1, 128), mdt) @ fp8_dequantize(w, w_scale, (128, 128), mdt).T


def bf16_mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for bfloat16 2-D operands with float32 accumulation and a float32 result (cuBLAS on CUDA)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def nvfp4_linear(x: torch.Tensor, g_x: torch.Tensor, w: torch.Tensor, w_bs: torch.Tensor, w_g: torch.Tensor, *, mdt: torch.dtype) -> torch.Tensor:
    """nvfp4 quantisation of `x` with global scale `g_x`, then dequant(x) @ dequant(w)^T in `mdt` (W4A4).

    With `mdt=bfloat16` (the eager baselines) the operands are e2m1 x e4m3 products, exact in
    bfloat16, and the two global scales multiply the float32-accumulated result, so the baseline
    differs from the float32 reference only by summation order.
    """
    xp, xb = nvfp4_quantize(x, g_x)
    if mdt == torch.bfloat16:
        one = torch.ones((), dtype=torch.float32, device=x.device)
        a = nvfp4_dequantize(xp, xb, one, torch.bfloat16)
        b = nvfp4_dequantize(w, w_bs, one, torch.bfloat16)
        y = bf16_mm_f32(a.reshape(-1, a.shape[-1]), b.T)
        return y.reshape(*a.shape[:-1], b.shape[0]) * (g_x.float() * w_g.float())
    return nvfp4_dequantize(xp, xb, g_x, mdt) @ nvfp4_dequantize(w, w_bs, w_g, mdt).T


def nvfp4_weight(w: torch.Tensor, seed: int | None = None, index: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight in nvfp4 as checkpoints store it: (packed uint8, fp8 block scales, float32 global scale).

    With `seed`, the weight is first scaled by 2^(4 f - 2), in [1/4, 4], where f is a Knuth
    multiplicative hash of (seed, index) in [0, 1) (exact integer arithmetic, any 64-bit seed): the
    amax of a Gaussian matrix barely moves between draws, so without this the global scale would be
    nearly constant and a kernel that mishandled it could pass; the golden-ratio hash keeps the
    scales of neighbouring seeds far apart.
    """
    if seed is not None:
        frac = ((int(seed) * 2654435761 + index * 2147483648) % 2**32) / 2**32
        w = w * 2.0 ** (4 * frac - 2)
    g = nvfp4_global_scale(w)
    packed, bs = nvfp4_quantize(w, g)
    return packed, bs, g


def out_dtype(cdt: torch.dtype, dtype: torch.dtype = torch.bfloat16) -> torch.dtype:
    """The problem's output dtype for a float32 computation; the promoted dtype for the anchor."""
    return dtype if cdt == torch.float32 else cdt


# ---------------------------------------------------------------- input helpers
def blocky_weight(shape: tuple[int, ...], block: tuple[int, int], gen: torch.Generator, device, *, std: float) -> torch.Tensor:
    """Gaussian float32 weights whose blocks differ in magnitude (log-uniform x0.25..x4), so block scales vary."""
    w = torch.randn(shape, generator=gen, device=device) * std
    rows, cols = block
    grid = (*shape[:-2], math.ceil(shape[-2] / rows), math.ceil(shape[-1] / cols))
    f = torch.exp2(torch.rand(grid, generator=gen, device=device) * 4 - 2)
    return w * expand_block_scale(f, block, torch.Size(shape))


__all__ = [
    "bf16_mm_f32",
    "E2M1_MAX",
    "E2M1_VALUES",
    "FP8",
    "FP8_MAX",
    "NVFP4_BLOCK",
    "blocky_weight",
    "compute_dtype",
    "e2m1_decode",
    "e2m1_encode",
    "expand_block_scale",
    "fp8_dequantize",
    "fp8_linear",
    "fp8_quantize",
    "fp8_spacing",
    "fp8_values_and_quantum",
    "nvfp4_dequantize",
    "nvfp4_global_scale",
    "nvfp4_linear",
    "nvfp4_quantize",
    "nvfp4_values_and_quantum",
    "nvfp4_weight",
    "out_dtype",
    "pack_nibbles",
    "unpack_nibbles",
]
