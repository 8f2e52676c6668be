"""RetNet multi-scale retention: xPos-style rotation, per-head fixed decay, per-head norm, swish gate, bf16.

The retention block of RetNet (Sun et al. 2023) between its projections. Per batch b and head h
(decay gamma_h = 1 - 2**(-5 - h)), positions n = 0..T-1, with S_{-1} = 0 ([K, V]), in fp32 (the
promoted dtype):

    rot(x)_n: pairs (2i, 2i+1) rotated by angle n * theta_i, theta_i = 10000**(-i / (K/2 - 1))
              (torchscale's `theta_shift` with `rotate_every_two`)
    qr = rot(q_n) ;  kr = rot(k_n) * K**-0.5
    S_n = gamma_h * S_{n-1} + outer(kr, v_n) ;  r_n = qr @ S_n        (the recurrent form)
    y_n = r_n / sqrt(mean(r_n**2) + 1e-6)                              (per-head RMSNorm, no affine)
    out[b, n, h*V:(h+1)*V] = silu(gate[b, n, h*V:(h+1)*V]) * y_n       (rounded to bf16)

Layouts: q, k bf16 [B, T, H, K]; v bf16 [B, T, H, V]; gate bf16 [B, T, H*V]. Output: out bf16
[B, T, H*V]. `reference` is the recurrent form; `eager` the parallel form (Q K^T masked by the decay
matrix D[n, m] = gamma**(n - m), n >= m) that RetNet trains with. torchscale's extra
normalisations of D and of Q K^T are omitted (the per-head RMSNorm makes them nearly cancel).
Full size: RetNet 1.3B (hidden 2048, 8 heads, key dim 256, value dim 512), 4 sequences of 2048.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

BATCH = {"full": 4, "smoke": 1}
SEQ = {"full": 2048, "smoke": 40}
HEADS = {"full": 8, "smoke": 2}
DK = {"full": 256, "smoke": 16}
DV = {"full": 512, "smoke": 32}
NORM_EPS = 1e-6

_f = "full"
_B, _T, _H, _K, _V = BATCH[_f], SEQ[_f], HEADS[_f], DK[_f], DV[_f]

META = ProblemMeta(
    number=70,
    name="multiscale_retention_retnet_bf16",
    family="linear_attention",
    dtypes=("bf16",),
    source_model="RetNet 1.3B (Sun et al. 2023; microsoft/torchscale MultiScaleRetention)",
    source_config="hidden 2048, 8 retention heads, key dim 256, value_factor 2 (value dim 512 per head), "
    "gamma_h = 1 - 2^(-5-h), RMSNorm eps 1e-6 without affine, swish gate",
    inputs=("q", "k", "v", "gate"),
    outputs=(Output("out"),),
    # parallel (causal) form: Q K^T and (.)V over the lower triangle
    flops=float(_B * _H * _T * _T * (_K + _V)),
    bytes=float(_B * _T * _H * (2 * _K + 3 * _V) * 2),
    peak="bf16_tc",
    notes="The reference is the recurrent form (its float64 run is the anchor); eager is the parallel "
    "form. A chunkwise kernel needs only O(T * chunk) work.",
)


def _rotate(x, pos_dtype):
    T, K = x.shape[1], x.shape[-1]
    theta = 10000.0 ** (-torch.linspace(0, 1, K // 2, dtype=pos_dtype, device=x.device))
    ang = torch.arange(T, dtype=pos_dtype, device=x.device)[:, None] * theta[None, :]  # [T, K/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def _gammas(H, ct, device):
    return 1.0 - torch.exp2(-5.0 - torch.arange(H, dtype=ct, device=device))


def _finish(r, gate):
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + NORM_EPS)  # [B, T, H, V]
    g = gate.to(r.dtype)
    return (torch.nn.functional.silu(g) * y.flatten(2)).to(gate.dtype)


def _prep(q, k, v):
    ct = torch.promote_types(q.dtype, torch.float32)
    qr = _rotate(q.to(ct), ct)
    kr = _rotate(k.to(ct), ct) * q.shape[-1] ** -0.5
    return ct, qr, kr, v.to(ct)


def reference(q, k, v, gate):
    ct, qr, kr, vv = _prep(q, k, v)
    B, T, H, K = q.shape
    gam = _gammas(H, ct, q.device)[None, :, None, None]
    S = torch.zeros(B, H, K, v.shape[-1], dtype=ct, device=q.device)
    out = []
    for t in range(T):
        S = gam * S + kr[:, t, :, :, None] * vv[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", qr[:, t], S))
    return _finish(torch.stack(out, dim=1), gate)


def eager(q, k, v, gate):
    ct, qr, kr, vv = _prep(q, k, v)
    B, T, H, K = q.shape
    n = torch.arange(T, device=q.device, dtype=ct)
    diff = n[:, None] - n[None, :]
    logg = torch.log(_gammas(H, ct, q.device))[:, None, None]
    D = torch.where(diff >= 0, torch.exp(diff.clamp_min(0) * logg), torch.zeros((), dtype=ct, device=q.device))
    scores = torch.einsum("bthk,bshk->bhts", qr, kr) * D[None]
    r = torch.einsum("bhts,bshv->bthv", scores, vv)
    return _finish(r, gate)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, T, H, K, V = BATCH[size], SEQ[size], HEADS[size], DK[size], DV[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    bf = torch.bfloat16
    return rn(B, T, H, K).to(bf), rn(B, T, H, K).to(bf), rn(B, T, H, V).to(bf), (1.5 * rn(B, T, H * V)).to(bf)
