"""Backward of an embedding lookup followed by RMSNorm from saved fp32 activations (Jamba v0.1 widths), bf16.

Upstream MetaKernelBench's problem 43 (a SOL-ExecBench recipe). Forward (Jamba v0.1, hidden 4096,
vocab 65536): e = embed[input_ids] (kept in fp32 as `hidden_states_fp32`), rstd =
rsqrt(mean(e**2) + 1e-6) (saved), n = e * rstd * norm_weight. Given dy = dL/dn and the saved
tensors, return, computed explicitly:

    xhat  = hidden_states_fp32 * rstd
    d_norm_weight = sum over tokens of dy * xhat
    g     = dy * norm_weight
    de    = rstd * (g - xhat * mean(g * xhat))                  (per token, over hidden 4096)
    d_embed[v] = sum of de over the tokens whose id is v        (zero for ids that do not occur)

Inputs: grad_output [64, 256, 4096] bf16, input_ids [64, 256] int64 (uniform over the vocabulary;
repeated ids accumulate), hidden_states_fp32 [64, 256, 4096] fp32, rstd [64, 256, 1] fp32 (computed
from hidden_states_fp32, as the forward saved it), norm_weight [4096] bf16. Outputs (bf16): d_embed
[65536, 4096] (dense, as the embedding weight's gradient), d_norm_weight [4096].

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32), accumulates the
scatter-add in fp32 and rounds each output once to bf16. The order of the accumulation is free.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
SHAPES = {"full": (64, 256, 4096, 65536), "smoke": (2, 32, 128, 512)}  # batch, seq, hidden, vocab
# the vocabulary is a constant of the model, not visible in the inputs (ids need not cover it): by hidden size
VOCAB_OF = {hidden: vocab for _, _, hidden, vocab in SHAPES.values()}
_B, _S, _H, _V = SHAPES["full"]
_N = _B * _S

META = ProblemMeta(
    number=43,
    name="embedding_rmsnorm_backward_jamba_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="ai21labs/Jamba-v0.1",
    source_config="hidden_size=4096, vocab_size=65536, rms_norm_eps=1e-6 (JambaRMSNorm input_layernorm of layer 0); "
                  "batch 64 x 256 tokens (SOL-ExecBench recipe)",
    inputs=("grad_output", "input_ids", "hidden_states_fp32", "rstd", "norm_weight"),
    outputs=(Output("d_embed"), Output("d_norm_weight")),
    flops=10.0 * _N * _H,
    bytes=8.0 * _N + 2.0 * _N * _H + 4.0 * (_N * _H + _N) + 2.0 * (_V * _H + 2 * _H),  # ids, dy, hidden, rstd, outputs
    peak="memory",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/43_embedding_rmsnorm_backward_jamba_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "structure_per_draw", "exactness"),
        differs=(
            ("computation", "the recipe hides its reference: mkb reads its inputs as (grad_output, input_ids, "
             "hidden_states_fp32, rstd, norm_weight) and returns the dense embedding gradient and the norm weight's "
             "gradient, with the RMSNorm backward written above"),
            ("distributions", "upstream's rstd and norm weight scales are not fully visible in the recipe: mkb computes "
             "rstd from hidden_states_fp32 (eps 1e-6) and draws norm_weight 1 + 0.1 N(0, 1); grad_output and "
             "hidden_states_fp32 N(0, 1) and uniform ids as upstream"),
        ),
    ),
    notes="Writing the dense d_embed (0.5 GB) dominates the traffic. Ids are uniform over the vocabulary (16384 tokens "
          "over 65536 ids: ~1800 repeated ids accumulate). Smoke: 2 x 32 tokens, hidden 128, vocab 512.",
)


def reference(grad_output, input_ids, hidden_states_fp32, rstd, norm_weight):
    ct = torch.promote_types(grad_output.dtype, torch.float32)
    h = hidden_states_fp32.shape[-1]
    ids = input_ids.reshape(-1)
    dyf = grad_output.to(ct).reshape(-1, h)
    xhat = hidden_states_fp32.to(ct).reshape(-1, h) * rstd.to(ct).reshape(-1, 1)
    d_norm_weight = (dyf * xhat).sum(dim=0)
    g = dyf * norm_weight.to(ct)
    de = rstd.to(ct).reshape(-1, 1) * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    d_embed = torch.zeros(VOCAB_OF[h], h, dtype=ct, device=grad_output.device).index_add_(0, ids, de)
    return d_embed.to(grad_output.dtype), d_norm_weight.to(grad_output.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, s, h, v = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    grad_output = torch.randn(b, s, h, generator=g, device=device).to(torch.bfloat16)
    input_ids = torch.randint(0, v, (b, s), generator=g, device=device)
    hidden = torch.randn(b, s, h, generator=g, device=device)
    rstd = torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + EPS)
    norm_weight = (1.0 + 0.1 * torch.randn(h, generator=g, device=device)).to(torch.bfloat16)
    return grad_output, input_ids, hidden, rstd, norm_weight
