"""The input stage of the multi-token-prediction (MTP) layer of Ling-flash-2.0: shifted token
embedding, two RMSNorms (enorm, hnorm), concatenation and the eh_proj projection, bf16.

The MTP layer (DeepSeek-V3 style, as in Ling 2.0) predicts token i+2 from the main model's hidden
state at position i and the embedding of token i+1:

    ids_next[b, i] = input_ids[b, i + 1]  for i < S - 1;   ids_next[b, S - 1] = 0
                     (a roll left by one whose wrapped-around last position is zeroed, as Megatron's MTP does)
    e   = word_embeddings[ids_next]                                          ([B, S, 4096])
    c   = concat( e * rsqrt(mean(e**2) + eps) * enorm_weight,
                  h * rsqrt(mean(h**2) + eps) * hnorm_weight,  dim=-1)      ([B, S, 8192])
    out = c @ eh_proj_weight.T                                               ([B, S, 4096], no bias)

RMSNorms are over the hidden size 4096 with plain weights (Llama-style, not 1 + w).

Inputs (upstream's SOL-ExecBench recipe): input_ids [32, 256] int64, hidden_states [32, 256, 4096]
bf16 (main-model hidden states), word_embeddings [157184, 4096] bf16, enorm_weight [4096] bf16,
hnorm_weight [4096] bf16, eh_proj_weight [4096, 8192] bf16, eps (Python constant 1e-6).
Output out [32, 256, 4096] bf16.

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) with no intermediate rounding
and rounds once to bf16. The eager baseline is the bf16 module as served (norms in fp32, rounded to
bf16 before a bf16 GEMM with fp32 accumulation).
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
SHAPES = {"full": (32, 256, 4096, 157184), "smoke": (2, 32, 128, 1000)}  # batch, seq, hidden, vocab

_B, _S, _H, _V = SHAPES["full"]
_N = _B * _S

META = ProblemMeta(
    number=42,
    name="shifted_embedding_dual_rmsnorm_ling_mtp_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="inclusionAI/Ling-flash-2.0",
    source_config="hidden_size=4096, vocab_size=157184, rms_norm_eps=1e-6, num_nextn_predict_layers=1; "
                  "MTP input: eh_proj(cat(enorm(embed(shifted ids)), hnorm(hidden))); SOL-ExecBench workload 32 x 256 tokens",
    inputs=("input_ids", "hidden_states", "word_embeddings", "enorm_weight", "hnorm_weight", "eh_proj_weight", "eps"),
    outputs=(Output("out"),),
    flops=2.0 * _N * 2 * _H * _H + 8.0 * _N * _H,
    bytes=8.0 * _N + 2.0 * (3 * _N * _H + 2 * _H + 2 * _H * _H),  # ids, hidden, gathered rows, weights, out
    peak="bf16_tc",
    upstream=Upstream(
        source="recipe",
        path="problems/_sol_execbench/42_shifted_embedding_dual_rmsnorm_ling_mtp_bf16.json",
        matches=("outputs", "in_place", "shapes", "dtypes", "distributions", "structure_per_draw",
                 "exactness"),
        differs=(
            ("computation", "the recipe's shift is masked; mkb reads it as a roll left by one with the last position set to token 0 (Megatron's MTP roll), then enorm(embedding) and hnorm(hidden) concatenated in that order and projected by eh_proj, without intermediate rounding."),
        ),
    ),
    notes=(
        "Inputs as upstream's recipe: input_ids uniform over the vocabulary, hidden_states and word_embeddings N(0, 1), "
        "norm weights 1 + 0.1 N(0, 1), eh_proj_weight 0.02 N(0, 1), eps 1e-6 (Ling-flash-2.0's rms_norm_eps; the "
        "recipe's value is masked). The recipe's code for the shift is masked; its description ('shift and embed "
        "token IDs') and line structure read as a roll left by one with the last position set to token 0. "
        "The embedding table is read only at the gathered rows. Smoke: 2 x 32 tokens, hidden 128, vocab 1000."
    ),
)


def _shift(input_ids):
    ids = torch.roll(input_ids, shifts=-1, dims=1)
    ids[:, -1] = 0
    return ids


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


def reference(input_ids, hidden_states, word_embeddings, enorm_weight, hnorm_weight, eh_proj_weight, eps):
    ct = torch.promote_types(hidden_states.dtype, torch.float32)
    e = word_embeddings[_shift(input_ids)].to(ct)
    c = torch.cat([_rms(e, enorm_weight.to(ct), eps), _rms(hidden_states.to(ct), hnorm_weight.to(ct), eps)], dim=-1)
    return (c @ eh_proj_weight.to(ct).T).to(hidden_states.dtype)


def eager(input_ids, hidden_states, word_embeddings, enorm_weight, hnorm_weight, eh_proj_weight, eps):
    F = torch.nn.functional
    e = word_embeddings[_shift(input_ids)]
    c = torch.cat([F.rms_norm(e.float(), (e.shape[-1],), enorm_weight.float(), eps),
                   F.rms_norm(hidden_states.float(), (e.shape[-1],), hnorm_weight.float(), eps)], dim=-1)
    return F.linear(c.to(hidden_states.dtype), eh_proj_weight)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, s, h, v = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    bf = torch.bfloat16
    input_ids = torch.randint(0, v, (b, s), generator=g, device=device)
    hidden = torch.randn(b, s, h, generator=g, device=device).to(bf)
    embed = torch.randn(v, h, generator=g, device=device).to(bf)
    enorm_weight = (torch.randn(h, generator=g, device=device) * 0.1 + 1.0).to(bf)
    hnorm_weight = (torch.randn(h, generator=g, device=device) * 0.1 + 1.0).to(bf)
    eh_proj = (torch.randn(h, 2 * h, generator=g, device=device) * 0.02).to(bf)
    return input_ids, hidden, embed, enorm_weight, hnorm_weight, eh_proj, EPS
