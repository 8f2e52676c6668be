"""A complete Hyena block (order 2): its operator with an implicit FFT long convolution, then a GELU MLP, both residual, fp32.

Upstream MetaKernelBench's problem 67 (a SOL-ExecBench recipe): batch 32 x 256 tokens, d_model 256, MLP
1024, order 2, short filter 3, implicit filter MLP of width 64 on a 5-wide positional embedding with a
sine activation (one shared frequency vector) and exponential modulation. The recipe hides its reference
body; mkb follows safari's HyenaOperator / HyenaFilter (Poli et al. 2023) in a pre-norm residual block.
In fp32 (the promoted dtype), for x [B, L, D]:

    pos: t = linspace(0, 1, L); z = [t, cos(f_j w), -sin(f_j w)] with w = 2 pi (0..L-1) / L, f = linspace(1e-4, 1, 2)
    filter h = W4 sin(f * (W3 sin(f * (W2 sin(f * (W1 z + b1)) + b2)) + b3)),  f = sin_freq  -> [L, D]
    k = h^T * (exp(-t |exp_mod_deltas|) + exp_mod_shift)                                     -> [D, L]
    a = LN1(x); u = a W_in^T + b_in; uc = causal depthwise conv (kernel 3) of u over time + short bias
    x0, x1, v = split(uc, D); v = v * x1; v = causal_conv(v, k) + v * filter_bias  (FFT of size 2L)
    h1 = x + ((v * x0) W_out^T + b_out);  out = h1 + fc2(gelu(fc1(LN2(h1))))     (exact erf GELU)

Inputs follow the recipe's order (28): hidden_states [B, L, 256]; norm1/2 weight and bias [256]; in_proj
[768, 256] and bias; short filter [768, 1, 3] and bias; filter layer 1 [64, 5] and bias [64]; sin_freq
[1, 64]; filter layers 2, 3 [64, 64] and biases; filter output [256, 64]; filter_bias [256];
exp_mod_deltas [256] (fixed: linspace(log(1e-2)/1.5, log(1e-2)/0.3, 256)); out_proj [256, 256] and bias;
fc1 [1024, 256] and bias; fc2 [256, 1024] and bias; eps 1e-5; exp_mod_shift 0.0. Output fp32 [B, L, 256].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mkb.problems._contract import Output, ProblemMeta, Upstream

BATCH = {"full": 32, "smoke": 2}
SEQ = {"full": 256, "smoke": 32}
D_MODEL = {"full": 256, "smoke": 16}
D_INNER = {"full": 1024, "smoke": 32}
FILTER_ORDER = {"full": 64, "smoke": 8}
ORDER, SHORT, EMB_DIM = 2, 3, 5
EPS, EXP_MOD_SHIFT = 1e-5, 0.0

_f = "full"
_B, _L, _D, _I, _O = BATCH[_f], SEQ[_f], D_MODEL[_f], D_INNER[_f], FILTER_ORDER[_f]
_T = _B * _L
_N = 2 * _L

META = ProblemMeta(
    number=67,
    name="hyena_fft_conv_block_hyena_small_fp32",
    family="linear_attention",
    dtypes=("fp32",),
    source_model="Hyena block (safari HyenaOperator, Poli et al. 2023); SOL-ExecBench recipe",
    source_config="batch 32 x 256 tokens, d_model 256, d_inner 1024, order 2, short_filter_order 3, filter_order "
    "64, emb_dim 5, LayerNorm eps 1e-5, exponential modulation (fast 0.3, slow 1.5, target 1e-2), fft size 2L",
    inputs=("hidden_states", "norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias", "in_proj_weight",
            "in_proj_bias", "short_filter_weight", "short_filter_bias", "filter_w1", "filter_b1", "sin_freq",
            "filter_w2", "filter_b2", "filter_w3", "filter_b3", "filter_w_out", "filter_bias", "exp_mod_deltas",
            "out_proj_weight", "out_proj_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "eps",
            "exp_mod_shift"),
    outputs=(Output("out"),),
    fixed_inputs=("exp_mod_deltas",),
    flops=float(2 * _T * _D * (3 * _D + _D + 2 * _I) + _B * _D * 3 * 2.5 * _N * math.log2(_N)
                + 2 * _L * (EMB_DIM * _O + 2 * _O * _O + _O * _D) + _T * (3 * _D * 6 + 20 * _D + 8 * _I)),
    bytes=float(2 * _T * _D * 4 + (3 * _D * _D + _D * _D + 2 * _I * _D + 2 * _O * _O + _O * _D) * 4),
    peak="fp32_simt",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/67_hyena_fft_conv_block_hyena_small_fp32.json",
        matches=("outputs", "in_place", "shapes", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe hides its reference body: mkb follows safari's HyenaOperator and HyenaFilter "
             "(positional embedding, three shared-frequency sine layers, exponential modulation, FFT convolution "
             "with the filter_bias skip, order-2 gating) in a pre-norm residual block with an exact-GELU MLP; the "
             "block layout, the GELU variant and the embedding's details are mkb's reading, not visible upstream"),
            ("dtypes", "the recipe hides the dtypes: mkb passes every tensor in float32 (the problem's name says "
             "fp32), eps and the modulation shift as Python floats"),
            ("distributions", "the recipe hides the weights' scale (a three-token factor, e.g. 0.02) and the "
             "modulation shift: mkb draws every projection and filter weight and bias N(0, 1)/sqrt(fan_in) and the "
             "filter_bias skip N(0, 1), because at 0.02 the gated long-convolution branch (a product of three "
             "projections and the filter) fell below the output's fp32 allowance and redrawing its inputs changed "
             "nothing, and uses shift 0.0 (safari's default); hidden_states N(0, 1), norm weights 1 + 0.1 N(0, 1), "
             "norm biases 0.1 N(0, 1), sin_freq 1 + 0.1 N(0, 1) and exp_mod_deltas a fixed linspace, as upstream"),
        ),
    ),
    notes="All fp32: the applicable peak is fp32 SIMT (the GEMMs are small: ~13 GFLOP).",
)


def _pos_emb(L, ct, device):
    t = torch.linspace(0, 1, L, dtype=ct, device=device)[:, None]
    w = 2 * math.pi * torch.arange(L, dtype=ct, device=device)[:, None] / L
    f = torch.linspace(1e-4, (EMB_DIM - 1) // 2 - 1, (EMB_DIM - 1) // 2, dtype=ct, device=device)[None, :]
    return torch.cat((t, torch.cos(f * w), -torch.sin(f * w)), dim=-1), t


def _ln(x, w, b, eps, ct):
    return F.layer_norm(x, (x.shape[-1],), w.to(ct), b.to(ct), eps)


def reference(hidden_states, norm1_weight, norm1_bias, norm2_weight, norm2_bias, in_proj_weight, in_proj_bias,
              short_filter_weight, short_filter_bias, filter_w1, filter_b1, sin_freq, filter_w2, filter_b2,
              filter_w3, filter_b3, filter_w_out, filter_bias, exp_mod_deltas, out_proj_weight, out_proj_bias,
              fc1_weight, fc1_bias, fc2_weight, fc2_bias, eps, exp_mod_shift):
    ct = torch.promote_types(hidden_states.dtype, torch.float32)
    x = hidden_states.to(ct)
    B, L, D = x.shape
    dev = x.device

    def c(t_):
        return t_.to(ct)

    # implicit long filter
    z, t = _pos_emb(L, ct, dev)
    fr = c(sin_freq)
    h = torch.sin(fr * (z @ c(filter_w1).T + c(filter_b1)))
    h = torch.sin(fr * (h @ c(filter_w2).T + c(filter_b2)))
    h = torch.sin(fr * (h @ c(filter_w3).T + c(filter_b3)))
    h = h @ c(filter_w_out).T  # [L, D]
    k = (h * (torch.exp(-t * c(exp_mod_deltas).abs()) + exp_mod_shift)).T  # [D, L]
    # operator
    u = (_ln(x, norm1_weight, norm1_bias, eps, ct) @ c(in_proj_weight).T + c(in_proj_bias)).transpose(1, 2)
    w = c(short_filter_weight)[:, 0, :]
    up = F.pad(u, (SHORT - 1, 0))
    uc = c(short_filter_bias)[:, None] + sum(w[:, j, None] * up[..., j : j + L] for j in range(SHORT))
    x0, x1, v = uc.split(D, dim=1)
    v = v * x1
    n = 2 * L
    conv = torch.fft.irfft(torch.fft.rfft(v, n=n) * (torch.fft.rfft(k, n=n) / n), n=n, norm="forward")[..., :L]
    v = conv + v * c(filter_bias)[:, None]
    h1 = x + ((v * x0).transpose(1, 2) @ c(out_proj_weight).T + c(out_proj_bias))
    m = F.gelu(_ln(h1, norm2_weight, norm2_bias, eps, ct) @ c(fc1_weight).T + c(fc1_bias))
    return (h1 + (m @ c(fc2_weight).T + c(fc2_bias))).to(hidden_states.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    B, L, D, I, O = BATCH[size], SEQ[size], D_MODEL[size], D_INNER[size], FILTER_ORDER[size]
    gen = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    def layer(rows, fan_in, *shape):  # weight and bias N(0, 1) / sqrt(fan_in)
        return [rn(rows, *shape) * fan_in**-0.5, rn(rows) * fan_in**-0.5]

    W = D * (ORDER + 1)
    hidden_states = rn(B, L, D)
    norms = [1 + 0.1 * rn(D), 0.1 * rn(D), 1 + 0.1 * rn(D), 0.1 * rn(D)]
    in_proj, short = layer(W, D, D), layer(W, SHORT, 1, SHORT)
    f1 = layer(O, EMB_DIM, EMB_DIM)
    sin_freq = 1 + 0.1 * rn(1, O)
    f2 = [*layer(O, O, O), *layer(O, O, O), rn(D, O) * O**-0.5]
    filter_bias = rn(D)
    deltas = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, D, device=device)
    tail = [*layer(D, D, D), *layer(I, D, D), *layer(D, I, I)]
    return (hidden_states, *norms, *in_proj, *short, *f1, sin_freq, *f2, filter_bias, deltas, *tail, EPS,
            EXP_MOD_SHIFT)
