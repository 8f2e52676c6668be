"""The pointwise MLP of a ConvNeXt V2 block with Global Response Normalization (GRN), fp32.

In a ConvNeXt V2 block, after the 7x7 depthwise conv and the LayerNorm, the channels-last
activations go through an inverted-bottleneck MLP whose hidden layer is normalised by GRN:

    h  = x @ w1.T + b1                                    (pwconv1: C -> 4C, per pixel)
    a  = gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2)))       (exact erf GELU)
    G  = sqrt(sum over H, W of a**2)                      (per image and channel: [N, 1, 1, 4C])
    Nx = G / (mean over the 4C channels of G + 1e-6)
    r  = gamma * (a * Nx) + beta + a                      (GRN with its residual)
    y  = r @ w2.T + b2                                    (pwconv2: 4C -> C)

GRN couples all pixels of an image: each channel is rescaled by its L2 norm over the whole
feature map relative to the mean over channels, so the MLP cannot be computed pixel by pixel in
one pass. The block's drop-path and residual add are not part of this problem.

Inputs (fp32, channels-last): x [64, 56, 56, 128] (stage 1 of ConvNeXt V2-Base at 224x224, batch
64; upstream's recipe shape), w1 [512, 128], b1 [512], gamma [512], beta [512], w2 [128, 512], b2 [128].
Output y [64, 56, 56, 128] fp32. Everything is fp32 without TF32 (the tolerance is set by the fp32
reference's error against an fp64 anchor).
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
SHAPES = {"full": (64, 56, 56, 128), "smoke": (2, 6, 6, 32)}  # batch, height, width, channels
EXPANSION = 4

_N, _Hs, _Ws, _C = SHAPES["full"]
_T, _F = _N * _Hs * _Ws, EXPANSION * _C

META = ProblemMeta(
    number=30,
    name="gelu_grn_mlp_convnextv2_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="facebook/convnextv2-base-22k-224",
    source_config="hidden_sizes=[128,256,512,1024], depths=[3,3,27,3]; stage 1: C=128, 56x56 at 224x224; "
                  "pwconv1 C->4C, hidden_act=gelu (erf), GRN eps 1e-6 (L2 over H,W, divided by channel mean), pwconv2 4C->C",
    inputs=("x", "w1", "b1", "gamma", "beta", "w2", "b2"),
    outputs=(Output("y"),),
    flops=2.0 * 2.0 * _T * _C * _F + 14.0 * _T * _F,
    bytes=4.0 * (2 * _T * _C + 2 * _C * _F + 3 * _F + _C),
    peak="fp32_simt",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/30_gelu_grn_mlp_convnextv2_fp32.json",
        matches=("computation", "outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
    ),
    notes="Batch 64 of stage-1 feature maps. Inputs as upstream's recipe: x, b1, gamma, beta, b2 N(0, 1), "
          "w1 N(0, 1)/sqrt(C), w2 N(0, 1)/sqrt(4C). GRN eps 1e-6 is a constant here (upstream passes it as a "
          "scalar input). Smoke: 2 x 6 x 6 x 32.",
)


def reference(x, w1, b1, gamma, beta, w2, b2):
    ct = torch.promote_types(x.dtype, torch.float32)
    h = x.to(ct) @ w1.to(ct).T + b1.to(ct)
    a = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    gx = a.pow(2).sum(dim=(1, 2), keepdim=True).sqrt()
    nx = gx / (gx.mean(dim=-1, keepdim=True) + EPS)
    r = gamma.to(ct) * (a * nx) + beta.to(ct) + a
    return (r @ w2.to(ct).T + b2.to(ct)).to(x.dtype)


def eager(x, w1, b1, gamma, beta, w2, b2):
    F = torch.nn.functional
    a = F.gelu(F.linear(x, w1, b1))
    gx = torch.linalg.vector_norm(a, ord=2, dim=(1, 2), keepdim=True)
    nx = gx / (gx.mean(dim=-1, keepdim=True) + EPS)
    return F.linear(torch.addcmul(beta + a, gamma, a * nx), w2, b2)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    n, hh, ww, c = SHAPES[size]
    f = EXPANSION * c
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(n, hh, ww, c, generator=g, device=device)
    w1 = torch.randn(f, c, generator=g, device=device) / math.sqrt(c)
    b1 = torch.randn(f, generator=g, device=device)
    gamma = torch.randn(f, generator=g, device=device)
    beta = torch.randn(f, generator=g, device=device)
    w2 = torch.randn(c, f, generator=g, device=device) / math.sqrt(f)
    b2 = torch.randn(c, generator=g, device=device)
    return (x, w1, b1, gamma, beta, w2, b2)
