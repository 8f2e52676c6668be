"""Backward of a two-layer tanh-GELU MLP with biases from saved activations, at the recipe's width (fp32 training).

Upstream MetaKernelBench's problem 37 (a SOL-ExecBench recipe, Step1X-Edit's GELU MLP): given the
upstream gradient and the activations the forward saved,

    forward (for reference): h = x @ w1.T + b1,  a = gelu_tanh(h),  y = a @ w2.T + b2

return the gradients with respect to x, w1, b1, w2, b2, computed explicitly from the saved h
(`fc1_output`) and a (`gelu_output`) - nothing is recomputed:

    dw2 = dy.T @ a,  db2 = sum_tokens dy,  da = dy @ w2
    dh  = da * (0.5 (1 + t) + 0.5 h (1 - t^2) c (1 + 3 * 0.044715 h^2)),  t = tanh(c (h + 0.044715 h^3)), c = sqrt(2/pi)
    dw1 = dh.T @ x,  db1 = sum_tokens dh,  dx = dh @ w1

Inputs (fp32): grad_output [64, 128, 2048], hidden_states [64, 128, 2048], fc1_weight [8192, 2048],
fc2_weight [2048, 8192], fc1_output [64, 128, 8192], gelu_output [64, 128, 8192]. Outputs (fp32):
dx [64, 128, 2048], dw1 [8192, 2048], db1 [8192], dw2 [2048, 8192], db2 [2048]. Everything is fp32
without TF32. As in the recipe, the saved activations are drawn independently of x (N(0, 1)), so a
kernel must use them rather than recompute the forward.
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

GELU_C = math.sqrt(2.0 / math.pi)
SHAPES = {"full": (64, 128, 2048, 8192), "smoke": (1, 48, 64, 256)}  # batch, tokens, hidden, mlp hidden

_B, _T, _D, _F = SHAPES["full"]
_N = _B * _T

META = ProblemMeta(
    number=37,
    name="gelu_mlp_backward_step1x_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="stepfun-ai/Step1X-Edit (GELU MLP); SOL-ExecBench recipe",
    source_config="Linear(2048, 8192) + GELU(approximate=tanh) + Linear(8192, 2048) with biases; saved fc1 and GELU "
                  "outputs; batch 64 x 128 tokens",
    inputs=("grad_output", "hidden_states", "fc1_weight", "fc2_weight", "fc1_output", "gelu_output"),
    outputs=(Output("dx"), Output("dw1"), Output("db1"), Output("dw2"), Output("db2")),
    # dw2, da, dw1, dx: 4 GEMMs of N x D x F
    flops=4.0 * 2.0 * _N * _D * _F + 25.0 * _N * _F,
    bytes=4.0 * (3 * _N * _D + 2 * _N * _F + 4 * _D * _F + _F + _D),
    peak="fp32_simt",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/37_gelu_mlp_backward_step1x_fp32.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe hides its reference and the names of its inputs: mkb reads them as "
             "(grad_output, hidden_states, fc1_weight, fc2_weight, fc1_output, gelu_output), in the recipe's order and "
             "shapes, and uses the saved GELU output for dw2 and the saved fc1 output for the GELU derivative"),
        ),
    ),
    notes="Inputs as the recipe: every activation and gradient N(0, 1), fc1_weight N(0, 1)/sqrt(2048), fc2_weight "
          "N(0, 1)/sqrt(8192). Smoke: 48 tokens, hidden 64, mlp hidden 256.",
)


def reference(grad_output, hidden_states, fc1_weight, fc2_weight, fc1_output, gelu_output):
    ct = torch.promote_types(grad_output.dtype, torch.float32)
    d, f = hidden_states.shape[-1], fc1_output.shape[-1]
    dy, x = grad_output.to(ct).reshape(-1, d), hidden_states.to(ct).reshape(-1, d)
    h, a = fc1_output.to(ct).reshape(-1, f), gelu_output.to(ct).reshape(-1, f)
    dw2 = dy.T @ a
    db2 = dy.sum(dim=0)
    da = dy @ fc2_weight.to(ct)
    t = torch.tanh(GELU_C * (h + 0.044715 * h.pow(3)))
    dh = da * (0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044715 * h * h))
    dw1 = dh.T @ x
    db1 = dh.sum(dim=0)
    dx = dh @ fc1_weight.to(ct)
    dt = grad_output.dtype
    return dx.reshape(hidden_states.shape).to(dt), dw1.to(dt), db1.to(dt), dw2.to(dt), db2.to(dt)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, t, d, f = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=g, device=device)

    return (rn(b, t, d), rn(b, t, d), rn(f, d) / math.sqrt(d), rn(d, f) / math.sqrt(f), rn(b, t, f), rn(b, t, f))
