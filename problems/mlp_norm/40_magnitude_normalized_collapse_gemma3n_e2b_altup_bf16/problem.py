"""The AltUp collapse of Gemma 3n: magnitude-normalised projections of the auxiliary streams averaged with the first, bf16.

Upstream MetaKernelBench's problem 40 (a SOL-ExecBench recipe): Gemma 3n keeps parallel copies of
the residual stream (AltUp); at the end of the text model they are collapsed into one hidden state
per token. With S = 3 streams h[0..2] ([B, T, 3072] each):

    target = sqrt(mean(h[0]**2))                                   (per token, over hidden)
    for i in 1..S-1:
        p_i = h[i] @ w_i.T                                         (altup_unembed_projections, no bias)
        p_i = p_i * target / sqrt(max(mean(p_i**2), eps))          (rescaled to stream 0's RMS; eps 1e-5)
    y = (h[0] + p_1 + ... + p_{S-1}) / S

Inputs (bf16): hidden_states [3, 64, 256, 3072], w_unembed_1 and w_unembed_2 [3072, 3072] (nn.Linear
layout), eps = 1e-5 (a constant, passed as upstream passes it). Output y [64, 256, 3072] bf16.

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) with no intermediate
rounding and rounds once to bf16. The eager baseline is the bf16 computation as HF runs it (bf16
projections and rescaling).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

STREAMS = 3
MAG_EPS = 1e-5
SHAPES = {"full": (64, 256, 3072), "smoke": (2, 24, 128)}  # batch, seq, hidden

_B, _S, _H = SHAPES["full"]
_T = _B * _S

META = ProblemMeta(
    number=40,
    name="magnitude_normalized_collapse_gemma3n_e2b_altup_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="google/gemma-3n-E2B-it (AltUp collapse); SOL-ExecBench recipe",
    source_config="3 AltUp streams of hidden 3072, altup_unembed_projections = 2 x Linear(3072, 3072, bias=False), "
                  "magnitude floor 1e-5; batch 64 x 256 tokens",
    inputs=("hidden_states", "w_unembed_1", "w_unembed_2", "eps"),
    outputs=(Output("y"),),
    flops=(STREAMS - 1) * 2.0 * _T * _H * _H + 12.0 * _T * _H,
    bytes=2.0 * (STREAMS * _T * _H + (STREAMS - 1) * _H * _H + _T * _H),
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/40_magnitude_normalized_collapse_gemma3n_e2b_altup_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe hides its reference ('project auxiliary hidden-state streams, match their "
             "magnitudes to the first stream, and average them with it'): mkb follows Gemma 3n's AltUp collapse, "
             "eps flooring the mean square of each projected stream"),
        ),
    ),
    notes="Inputs as the recipe: streams and weights N(0, 1) in bf16 (the weights unscaled: the rescaling undoes "
          "their gain). Smoke: 3 x 2 x 24 tokens x 128.",
)


def reference(hidden_states, w_unembed_1, w_unembed_2, eps):
    ct = torch.promote_types(hidden_states.dtype, torch.float32)
    hf = hidden_states.to(ct)
    target = hf[0].pow(2).mean(dim=-1, keepdim=True).sqrt()
    acc = hf[0]
    for i, w in enumerate((w_unembed_1, w_unembed_2), start=1):
        p = hf[i] @ w.to(ct).T
        acc = acc + p * target / p.pow(2).mean(dim=-1, keepdim=True).clamp_min(eps).sqrt()
    return (acc / hidden_states.shape[0]).to(hidden_states.dtype)


def eager(hidden_states, w_unembed_1, w_unembed_2, eps):
    h = hidden_states
    target = torch.mean(h[0] ** 2, dim=-1, keepdim=True) ** 0.5
    streams = [h[0]]
    for i, w in enumerate((w_unembed_1, w_unembed_2), start=1):
        p = torch.nn.functional.linear(h[i], w)
        streams.append(p * target / torch.sqrt(torch.clamp_min(torch.mean(p**2, dim=-1, keepdim=True), eps)))
    return torch.stack(streams).mean(dim=0)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, s, hd = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    h = torch.randn(STREAMS, b, s, hd, generator=g, device=device).to(torch.bfloat16)
    w1 = torch.randn(hd, hd, generator=g, device=device).to(torch.bfloat16)
    w2 = torch.randn(hd, hd, generator=g, device=device).to(torch.bfloat16)
    return h, w1, w2, MAG_EPS
