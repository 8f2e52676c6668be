"""A half-step (macaron) feed-forward module of the Parakeet FastConformer encoder, fp32.

Each FastConformer layer of Parakeet (NVIDIA NeMo `ConformerLayer`) opens with a feed-forward
module whose output is added to the residual with weight 1/2:

    n = LayerNorm(x) = (x - mean) * rsqrt(var + 1e-5) * ln_weight + ln_bias    (over d_model 1024)
    h = n @ w1.T + b1                                                           (1024 -> 4096)
    a = swish(h) = h * sigmoid(h)                                               (SiLU / Swish)
    y = x + 0.5 * (a @ w2.T + b2)                                               (4096 -> 1024)

Inputs (fp32): x [16, 375, 1024] (a batch of 16 thirty-second utterances after the 8x
subsampling: 80 ms frames), ln_weight/ln_bias [1024], w1 [4096, 1024], b1 [4096], w2 [1024, 4096],
b2 [1024] (nn.Linear layout). Output y [16, 375, 1024] fp32. Everything is fp32 without TF32.

Note on the name: the published problem calls this a "swiglu" MLP; Parakeet's FastConformer FFN is
the ungated Swish MLP written above (`ConformerFeedForward`: linear1 -> Swish -> linear2, biases
on), so that is what the reference computes.
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-5
FC_FACTOR = 0.5
SHAPES = {"full": (16, 375, 1024, 4096), "smoke": (2, 24, 64, 256)}  # batch, frames, d_model, d_ff

_B, _T, _D, _F = SHAPES["full"]
_N = _B * _T

META = ProblemMeta(
    number=32,
    name="swiglu_mlp_parakeet_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="nvidia/parakeet-tdt-0.6b-v2",
    source_config="FastConformer encoder: d_model=1024, ff_expansion_factor=4 (d_ff 4096), activation Swish, "
                  "use_bias=true, LayerNorm eps 1e-5 (norm_feed_forward1), fc_factor=0.5 (macaron half-step); "
                  "subsampling 8x (80 ms frames)",
    inputs=("x", "ln_weight", "ln_bias", "w1", "b1", "w2", "b2"),
    outputs=(Output("y"),),
    flops=2.0 * 2.0 * _N * _D * _F + 5.0 * _N * _F + 10.0 * _N * _D,
    bytes=4.0 * (2 * _N * _D + 2 * _D * _F + _F + 3 * _D),
    peak="fp32_simt",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/32_swiglu_mlp_parakeet_fp32.json',
        matches=('outputs', 'in_place', 'dtypes', 'structure_per_draw'),
        differs=(
            ('computation', "upstream's recipe takes x, a fused gate-up weight [8192, 1024] and a down weight [1024, 4096] (SiLU-gated, no LayerNorm, no biases); mkb's problem is the FastConformer feed-forward module (LayerNorm with affine, Linear with bias, Swish, Linear with bias) - not yet converted (issue #15 follow-up)"),
            ('shapes', 'upstream: batch 64 x 128 frames, d_model 1024, d_ff 4096; mkb: 16 x 375 frames (same d_model, d_ff) - not yet converted (issue #15 follow-up)'),
            ('distributions', 'upstream: x N(0, 1), weights N(0, 1)/sqrt(in); mkb: x with a per-frame offset, LN affine and biases drawn near a trained regime - not yet converted (issue #15 follow-up)'),
            ("exactness", "both compare within a tolerance; mkb's is anchored to fp64 (3 x the reference's own error "
             "vs the fp64 anchor, at least eps(dtype) x max|anchor|) instead of a fixed atol/rtol"),
        ),
    ),
    notes="First feed-forward module of a FastConformer layer (LayerNorm, Swish MLP, half-step residual); "
          "dropout is off (inference). The name's 'swiglu' is kept from the catalog; the model's FFN is ungated. "
          "Smoke: 2 x 24 frames, d_model 64, d_ff 256.",
)


def reference(x, ln_weight, ln_bias, w1, b1, w2, b2):
    ct = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(ct)
    mu = xf.mean(dim=-1, keepdim=True)
    var = (xf - mu).pow(2).mean(dim=-1, keepdim=True)
    n = (xf - mu) * torch.rsqrt(var + EPS) * ln_weight.to(ct) + ln_bias.to(ct)
    h = n @ w1.to(ct).T + b1.to(ct)
    a = h * torch.sigmoid(h)
    return (xf + FC_FACTOR * (a @ w2.to(ct).T + b2.to(ct))).to(x.dtype)


def eager(x, ln_weight, ln_bias, w1, b1, w2, b2):
    F = torch.nn.functional
    n = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, EPS)
    return x + FC_FACTOR * F.linear(F.silu(F.linear(n, w1, b1)), w2, b2)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, t, d, f = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = 2.0 * torch.randn(b, t, d, generator=g, device=device) + 0.5 * torch.randn(b, t, 1, generator=g, device=device)
    ln_weight = 1.0 + 0.2 * torch.randn(d, generator=g, device=device)
    ln_bias = 0.1 * torch.randn(d, generator=g, device=device)
    w1 = torch.randn(f, d, generator=g, device=device) / math.sqrt(d)
    b1 = 0.1 * torch.randn(f, generator=g, device=device)
    w2 = 2.0 * torch.randn(d, f, generator=g, device=device) / math.sqrt(f)
    b2 = 0.2 * torch.randn(d, generator=g, device=device)
    return (x, ln_weight, ln_bias, w1, b1, w2, b2)
