"""Backward of the residual RMSNorm of Qwen3-4B (hidden 2560, eps 1e-6) from its saved tensors, bf16 training.

Forward (per token, over hidden 2560): s = hidden + residual, n = s * rstd with
rstd = rsqrt(mean(s**2) + 1e-6), y = n * weight. The backward receives grad_output = dL/dy and the
tensors the forward saved (the normalised input n and rstd), and returns, explicitly:

    g           = grad_output * weight
    grad_hidden = rstd * (g - n * mean(g * n))           (over hidden, per token)
    grad_resid  = grad_hidden                            (the add copies the gradient to both addends)
    grad_weight = sum over all tokens of grad_output * n

Inputs (bf16, upstream's SOL-ExecBench recipe, Qwen3-4B): grad_output [64, 8192, 2560], normalized
[64, 8192, 2560], rstd [64, 8192, 1], weight [2560]. Outputs (bf16): grad_hidden and grad_resid
[64, 8192, 2560], grad_weight [2560].

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) without intermediate
rounding and rounds each output once to bf16; grad_weight reduces over 524288 tokens.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
CHUNK = 8  # sequences per block in the reference (memory of the fp64 anchor)
SHAPES = {"full": (64, 8192, 2560), "smoke": (2, 32, 256)}  # batch, seq, hidden

_B, _S, _H = SHAPES["full"]
_T = _B * _S

META = ProblemMeta(
    number=38,
    name="residual_rmsnorm_backward_qwen3_4b_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="Qwen/Qwen3-4B",
    source_config="hidden_size=2560, rms_norm_eps=1e-6 (Qwen3RMSNorm); SOL-ExecBench workload batch 64 x seq 8192",
    inputs=("grad_output", "normalized", "rstd", "weight"),
    outputs=(Output("grad_hidden"), Output("grad_resid"), Output("grad_weight")),
    flops=9.0 * _T * _H,
    bytes=2.0 * (4 * _T * _H + _T + 2 * _H),
    peak="memory",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/38_residual_rmsnorm_backward_qwen3_4b_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(
            ("computation", "the recipe's reference body is masked; mkb reads its three outputs as (grad_hidden, grad_residual, grad_weight), the first two the same RMSNorm input gradient (the recipe: 'shared hidden-state and residual gradients')."),
        ),
    ),
    notes=(
        "Inputs as upstream's recipe: x = N(0, 1) * (1.5 U(0, 1) + 0.5) per token, rstd = rsqrt(mean(x**2) + 1e-6) "
        "and normalized = x * rstd (computed in bf16, as the recipe's bf16 tensors are), weight 1 + 0.1 N(0, 1), "
        "grad_output = N(0, 1) + 0.5 * normalized * weight. The recipe's three outputs are the hidden-state and "
        "residual gradients (shared, the recipe says) and the weight gradient; their order in its masked return "
        "is read as (hidden, residual, weight). ~2.7 GB per full-size bf16 tensor: memory-bound, ~2.2 ms at "
        "4.8 TB/s. Smoke: 2 x 32 tokens, hidden 256."
    ),
)


def reference(grad_output, normalized, rstd, weight):
    """Computed over blocks of CHUNK sequences: at full size one fp64 temporary of the whole tensor is 10.7 GB,
    and the fp64 anchor would need several at once; per block the peak stays ~1/8 of that."""
    ct = torch.promote_types(grad_output.dtype, torch.float32)
    w = weight.to(ct)
    dx = torch.empty(grad_output.shape, dtype=ct, device=grad_output.device)
    dw = torch.zeros(weight.shape, dtype=ct, device=grad_output.device)
    for b in range(0, grad_output.shape[0], CHUNK):
        go, n = grad_output[b : b + CHUNK].to(ct), normalized[b : b + CHUNK].to(ct)
        g = go * w
        dx[b : b + CHUNK] = rstd[b : b + CHUNK].to(ct) * (g - n * (g * n).mean(dim=-1, keepdim=True))
        dw += (go * n).sum(dim=(0, 1))
    dx = dx.to(grad_output.dtype)
    return dx, dx.clone(), dw.to(grad_output.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, s, h = SHAPES[size]
    bf = torch.bfloat16
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    x = torch.randn(b, s, h, generator=g, device=device).to(bf)
    x = x * (torch.rand(b, s, 1, generator=g, device=device) * 1.5 + 0.5).to(bf)
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    normalized = x * rstd
    weight = (torch.randn(h, generator=g, device=device) * 0.1 + 1.0).to(bf)
    grad_output = torch.randn(b, s, h, generator=g, device=device).to(bf) + 0.5 * normalized * weight
    return grad_output, normalized, rstd, weight
