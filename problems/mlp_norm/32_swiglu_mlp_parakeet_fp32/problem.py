"""A SwiGLU MLP with a fused gate-up projection at Parakeet's width (d_model 1024, d_ff 4096), fp32.

Upstream MetaKernelBench's problem 32 (a SOL-ExecBench recipe): a fused gate-up projection, SiLU
gating and the projection back to the hidden size, without norm or biases:

    gu = x @ w_gate_up.T                       (1024 -> 2 x 4096; rows 0..4095 gate, 4096..8191 up)
    a  = silu(gu[..., :4096]) * gu[..., 4096:]
    y  = a @ w_down.T                          (4096 -> 1024)

Inputs (fp32): x [64, 128, 1024], w_gate_up [8192, 1024], w_down [1024, 4096] (nn.Linear layout).
Output y [64, 128, 1024] fp32. Everything is fp32 without TF32. The recipe does not show which half
of the fused projection is the gate; mkb takes the first half (the layout of fused gate_up_proj
weights in HF/vLLM checkpoints).
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

SHAPES = {"full": (64, 128, 1024, 4096), "smoke": (2, 24, 64, 256)}  # batch, frames, d_model, d_ff

_B, _T, _D, _F = SHAPES["full"]
_N = _B * _T

META = ProblemMeta(
    number=32,
    name="swiglu_mlp_parakeet_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="nvidia/parakeet-tdt-0.6b-v2 (widths); SOL-ExecBench recipe",
    source_config="d_model=1024, d_ff=4096 (FastConformer ff_expansion_factor 4); fused gate-up [8192, 1024], "
                  "down [1024, 4096], SiLU gating, no biases; batch 64 x 128 frames",
    inputs=("x", "w_gate_up", "w_down"),
    outputs=(Output("y"),),
    flops=2.0 * 3.0 * _N * _D * _F + 4.0 * _N * _F,
    bytes=4.0 * (2 * _N * _D + 3 * _D * _F),
    peak="fp32_simt",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/32_swiglu_mlp_parakeet_fp32.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ('computation', 'the recipe hides its reference and does not show which half of the fused gate-up projection is the gate: mkb takes the first half (the HF/vLLM fused gate_up_proj layout)'),
        ),
    ),
    notes="Inputs as the recipe: x N(0, 1), w_gate_up N(0, 1)/sqrt(1024), w_down N(0, 1)/sqrt(4096). The gate is "
          "the first half of the fused projection (the recipe does not show the order). Smoke: 2 x 24 frames, "
          "d_model 64, d_ff 256.",
)


def reference(x, w_gate_up, w_down):
    ct = torch.promote_types(x.dtype, torch.float32)
    f = w_down.shape[1]
    gu = x.to(ct) @ w_gate_up.to(ct).T
    a = torch.nn.functional.silu(gu[..., :f]) * gu[..., f:]
    return (a @ w_down.to(ct).T).to(x.dtype)


def eager(x, w_gate_up, w_down):
    F = torch.nn.functional
    g, u = F.linear(x, w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(g) * u, w_down)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, t, d, f = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(b, t, d, generator=g, device=device)
    w_gate_up = torch.randn(2 * f, d, generator=g, device=device) / math.sqrt(d)
    w_down = torch.randn(d, f, generator=g, device=device) / math.sqrt(f)
    return (x, w_gate_up, w_down)
