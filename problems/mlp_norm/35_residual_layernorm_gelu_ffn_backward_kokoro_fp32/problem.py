"""Backward of a pre-LN residual tanh-GELU feed-forward block (Kokoro-82M text stack) from saved tensors, fp32.

Forward (upstream's SOL-ExecBench recipe; per token over hidden 512, intermediate 2048, no biases in
the inputs):

    xhat = (x - mean(x)) * rsqrt(var + eps)       (var biased and saved as `var`)
    n    = xhat * ln_weight + ln_bias             (the LayerNorm output, saved as `normalized`)
    h    = n @ fc1_weight.T                       (512 -> 2048; `fc1_output` = h is saved)
    a    = gelu_tanh(h)                           (`gelu_output` = a is saved)
    y    = x + a @ fc2_weight.T                   (2048 -> 512, residual add)

Given dy = dL/dy, return the seven gradients of the block's parameters and input, explicitly:

    dfc2_weight = dy.T @ a,   dfc2_bias = sum_tokens dy,   da = dy @ fc2_weight
    dh = da * gelu_tanh'(h),  gelu_tanh'(h) = 0.5 (1 + t) + 0.5 h (1 - t^2) c (1 + 3 * 0.044715 h^2),
         t = tanh(c (h + 0.044715 h^3)),  c = sqrt(2/pi)
    dfc1_weight = dh.T @ n,   dfc1_bias = sum_tokens dh,   dn = dh @ fc1_weight
    dln_weight = sum_tokens dn * xhat,   dln_bias = sum_tokens dn,   g = dn * ln_weight
    xhat = (hidden_states - mean(hidden_states)) * rsqrt(var + eps)   (recomputed from the saved var)
    dx = dy + rsqrt(var + eps) * (g - mean(g) - xhat * mean(g * xhat))

Inputs (fp32): grad_output [64, 1087, 512], hidden_states [64, 1087, 512], fc1_weight [2048, 512],
fc1_output [64, 1087, 2048], gelu_output [64, 1087, 2048], fc2_weight [512, 2048], normalized
[64, 1087, 512], var [64, 1087, 1], ln_weight [512], eps (Python constant 1e-5).
Outputs (fp32): dx [64, 1087, 512], dfc1_weight [2048, 512], dfc1_bias [2048], dfc2_weight [512, 2048],
dfc2_bias [512], dln_weight [512], dln_bias [512]. Everything is fp32 without TF32.
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-5
GELU_C = math.sqrt(2.0 / math.pi)
SHAPES = {"full": (64, 1087, 512, 2048), "smoke": (2, 24, 64, 160)}  # batch, seq, hidden, intermediate

_B, _S, _D, _F = SHAPES["full"]
_N = _B * _S

META = ProblemMeta(
    number=35,
    name="residual_layernorm_gelu_ffn_backward_kokoro_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="hexgrad/Kokoro-82M",
    source_config="SOL-ExecBench workload: hidden 512, intermediate 2048, batch 64 x 1087 tokens; LayerNorm "
                  "(eps 1e-5) before a tanh-GELU FFN with a residual add",
    inputs=("grad_output", "hidden_states", "fc1_weight", "fc1_output", "gelu_output", "fc2_weight", "normalized",
            "var", "ln_weight", "eps"),
    outputs=(Output("dx"), Output("dfc1_weight"), Output("dfc1_bias"), Output("dfc2_weight"), Output("dfc2_bias"),
             Output("dln_weight"), Output("dln_bias")),
    # dfc2_weight, da, dfc1_weight, dn: 4 GEMMs of N x D x F
    flops=4.0 * 2.0 * _N * _D * _F + 20.0 * _N * _F + 20.0 * _N * _D,
    bytes=4.0 * (4 * _N * _D + 2 * _N * _F + _N + 2 * (2 * _D * _F) + _F + 4 * _D),
    peak="fp32_simt",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/35_residual_layernorm_gelu_ffn_backward_kokoro_fp32.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(
            ("computation", "the recipe's reference body is masked; mkb reads the block as pre-LN y = x + fc2(gelu_tanh(fc1(LN(x)))): `normalized` is the LN output that feeds fc1, xhat is recomputed from hidden_states and var, and the seven outputs are (dx, dfc1_weight, dfc1_bias, dfc2_weight, dfc2_bias, dln_weight, dln_bias); eps 1e-5 is read from the length of its masked line."),
        ),
    ),
    notes=(
        "Inputs as upstream's recipe: hidden_states and grad_output N(0, 1), fc1_weight N(0, 1)/sqrt(512), "
        "fc2_weight N(0, 1)/sqrt(2048), ln_weight 1 + 0.1 N(0, 1); normalized, var, fc1_output and gelu_output "
        "are the forward's values for these inputs (computed in fp32 at draw time, as the recipe does). The "
        "recipe's reference body is masked: the block is read from its description (residual add, layer "
        "normalisation, tanh-GELU feed-forward), its inputs (the LN output `normalized` feeds fc1, xhat is "
        "recomputed from hidden_states and var; the biases enter no gradient and are not inputs; mkb draws the LN "
        "bias zero) and its seven outputs (input, fc1/fc2 weight and bias, LN weight and bias); "
        "eps 1e-5 is read from the masked line's length. ~0.58 TFLOP of fp32 GEMMs without TF32 (~12 ms at "
        "~50 TFLOP/s). Smoke: 2 x 24 tokens, hidden 64, intermediate 160."
    ),
)


def reference(grad_output, hidden_states, fc1_weight, fc1_output, gelu_output, fc2_weight, normalized, var,
              ln_weight, eps):
    ct = torch.promote_types(hidden_states.dtype, torch.float32)
    d, f = fc1_weight.shape[1], fc1_weight.shape[0]
    dy = grad_output.to(ct).reshape(-1, d)
    x = hidden_states.to(ct).reshape(-1, d)
    rstd = torch.rsqrt(var.to(ct).reshape(-1, 1) + eps)
    xhat = (x - x.mean(dim=-1, keepdim=True)) * rstd
    h, a = fc1_output.to(ct).reshape(-1, f), gelu_output.to(ct).reshape(-1, f)
    w1, w2, gamma = fc1_weight.to(ct), fc2_weight.to(ct), ln_weight.to(ct)
    n = normalized.to(ct).reshape(-1, d)
    dw2, db2 = dy.T @ a, dy.sum(dim=0)
    da = dy @ w2
    t = torch.tanh(GELU_C * (h + 0.044715 * h.pow(3)))
    dh = da * (0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044715 * h * h))
    dw1, db1 = dh.T @ n, dh.sum(dim=0)
    dn = dh @ w1
    dgamma, dbeta = (dn * xhat).sum(dim=0), dn.sum(dim=0)
    g = dn * gamma
    dx = dy + rstd * (g - g.mean(dim=-1, keepdim=True) - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    dt = hidden_states.dtype
    return (dx.reshape(hidden_states.shape).to(dt), dw1.to(dt), db1.to(dt), dw2.to(dt), db2.to(dt),
            dgamma.to(dt), dbeta.to(dt))


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, s, d, f = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(b, s, d, generator=g, device=device)
    w1 = torch.randn(f, d, generator=g, device=device) / math.sqrt(d)
    w2 = torch.randn(d, f, generator=g, device=device) / math.sqrt(f)
    gamma = torch.randn(d, generator=g, device=device) * 0.1 + 1.0
    centered = x - x.mean(dim=-1, keepdim=True)
    var = centered.pow(2).mean(dim=-1, keepdim=True)
    normalized = centered * torch.rsqrt(var + EPS) * gamma
    h = normalized @ w1.T
    a = torch.nn.functional.gelu(h, approximate="tanh")
    dy = torch.randn(b, s, d, generator=g, device=device)
    return dy, x, w1, h, a, w2, normalized, var, gamma, EPS
