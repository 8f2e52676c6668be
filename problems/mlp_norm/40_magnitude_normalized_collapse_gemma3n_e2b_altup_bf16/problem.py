"""The AltUp collapse at the end of the Gemma 3n E2B text model: magnitude-normalised unembedding of
the 4 AltUp streams, their mean, and the final RMSNorm, bf16.

Gemma 3n keeps 4 parallel copies of the residual stream (AltUp, altup_num_inputs=4). After the last
decoder layer they are collapsed into one hidden state per token:

    target = sqrt(mean(h[0]**2))                                   (per token, over hidden 2048)
    for i in 1..3:
        p_i = h[i] @ w_unembed[i-1].T                              (altup_unembed_projections, no bias)
        p_i = p_i * target / sqrt(max(mean(p_i**2), 1e-5))         (rescaled to stream 0's RMS)
    c = (h[0] + p_1 + p_2 + p_3) / 4
    y = c * rsqrt(mean(c**2) + 1e-6) * norm_weight                 (Gemma3nRMSNorm: plain weight, not 1 + w)

Inputs (bf16): h [4, 8192, 2048] (the AltUp streams of a 8192-token prefill batch), w_unembed
[3, 2048, 2048] (nn.Linear layout), norm_weight [2048]. Output y [8192, 2048] bf16 (what the
lm_head reads).

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) with no intermediate
rounding and rounds once to bf16. Note the asymmetric epsilons: none inside stream 0's magnitude,
a floor of 1e-5 on the mean square of each projected stream, and 1e-6 in the final RMSNorm. The
eager baseline is the bf16 computation as HF runs it (bf16 projections and rescaling, fp32 RMSNorm
statistics); it stays within the comparison tolerance.
"""

from __future__ import annotations

import math

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

ALTUP = 4
MAG_EPS = 1e-5
EPS = 1e-6
SHAPES = {"full": (8192, 2048), "smoke": (48, 128)}  # tokens, hidden

_T, _H = SHAPES["full"]

META = ProblemMeta(
    number=40,
    name="magnitude_normalized_collapse_gemma3n_e2b_altup_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="google/gemma-3n-E2B-it",
    source_config="text_config: hidden_size=2048, altup_num_inputs=4, rms_norm_eps=1e-6; altup_unembed_projections = "
                  "3 x Linear(2048, 2048, bias=False); magnitude floor 1e-5; final norm Gemma3nRMSNorm (x * weight)",
    inputs=("h", "w_unembed", "norm_weight"),
    outputs=(Output("y"),),
    flops=(ALTUP - 1) * 2.0 * _T * _H * _H + 30.0 * _T * _H,
    bytes=2.0 * (ALTUP * _T * _H + (ALTUP - 1) * _H * _H + _H + _T * _H),
    peak="bf16_tc",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/40_magnitude_normalized_collapse_gemma3n_e2b_altup_bf16.json',
        matches=('outputs', 'in_place', 'dtypes', 'structure_per_draw'),
        differs=(
            ('computation', 'upstream: 3 AltUp streams, two [3072, 3072] projections of the auxiliary streams matched in magnitude to the first and averaged with it (eps 1e-5 as an input), no final norm; mkb: 4 streams (altup_num_inputs 4), hidden 2048, and the final RMSNorm - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: [3, 64, 256, 3072]; mkb: [4, 8192, 2048] - not yet converted (issue #15 follow-up)'),
            ('distributions', 'upstream: streams and weights N(0, 1) in bf16 (weights unscaled); mkb: per-token log-normal stream scales, weights / sqrt(hidden) - not yet converted (issue #15 follow-up)'),
            ("exactness", "both compare within a tolerance; mkb's is anchored to fp64 (3 x the reference's own error "
             "vs the fp64 anchor, at least eps(dtype) x max|anchor|) instead of a fixed atol/rtol"),
        ),
    ),
    notes="Includes the final RMSNorm that follows the collapse in Gemma3nTextModel. Smoke: 48 tokens x 128.",
)


def reference(h, w_unembed, norm_weight):
    ct = torch.promote_types(h.dtype, torch.float32)
    hf, w = h.to(ct), w_unembed.to(ct)
    target = hf[0].pow(2).mean(dim=-1, keepdim=True).sqrt()
    acc = hf[0]
    for i in range(1, h.shape[0]):
        p = hf[i] @ w[i - 1].T
        mag = p.pow(2).mean(dim=-1, keepdim=True).clamp_min(MAG_EPS).sqrt()
        acc = acc + p * target / mag
    c = acc / h.shape[0]
    return (c * torch.rsqrt(c.pow(2).mean(dim=-1, keepdim=True) + EPS) * norm_weight.to(ct)).to(h.dtype)


def eager(h, w_unembed, norm_weight):
    target = torch.mean(h[0] ** 2, dim=-1, keepdim=True) ** 0.5
    streams = [h[0]]
    for i in range(1, h.shape[0]):
        p = torch.nn.functional.linear(h[i], w_unembed[i - 1])
        mag = torch.sqrt(torch.clamp_min(torch.mean(p**2, dim=-1, keepdim=True), MAG_EPS))
        streams.append(p * target / mag)
    c = torch.stack(streams).mean(dim=0).float()
    return (c * torch.rsqrt(c.pow(2).mean(dim=-1, keepdim=True) + EPS) * norm_weight.float()).to(h.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    t, hd = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    # streams with different per-token scales; the projections change the scale, the collapse undoes it
    scales = torch.exp(0.7 * torch.randn(ALTUP, t, 1, generator=g, device=device))
    h = torch.randn(ALTUP, t, hd, generator=g, device=device) * scales * 4.0
    w_unembed = torch.randn(ALTUP - 1, hd, hd, generator=g, device=device) / math.sqrt(hd)
    w_unembed *= torch.tensor([0.5, 1.0, 3.0], device=device)[:, None, None]
    norm_weight = 1.0 + 0.3 * torch.randn(hd, generator=g, device=device)
    return tuple(v.to(torch.bfloat16) for v in (h, w_unembed, norm_weight))
