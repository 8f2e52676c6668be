"""The input stage of the multi-token-prediction (MTP) layer of Ling-flash-2.0: shifted token
embedding, two RMSNorms (enorm, hnorm) and their concatenation, bf16.

The MTP layer (DeepSeek-V3 style, as in Ling 2.0) predicts token i+2 from the main model's hidden
state at position i and the embedding of token i+1. Its input is

    ids_next[b, i] = input_ids[b, i + 1]  for i < S - 1;   ids_next[b, S - 1] = next_token[b]
    e = embed[ids_next]                                                   ([B, S, 4096], shared table)
    out = concat( e * rsqrt(mean(e**2) + 1e-6) * enorm_weight,
                  h * rsqrt(mean(h**2) + 1e-6) * hnorm_weight,  dim=-1)  ([B, S, 8192])

(the concatenation order is [embedding, hidden], as eh_proj expects it). RMSNorms are over the
hidden size 4096 with plain weights (Llama-style, not 1 + w).

Inputs: input_ids [4, 4096] int64 (4 training sequences), next_token [4] int64 (the token after
each sequence, i.e. its last label), hidden [4, 4096, 4096] bf16 (main-model hidden states),
embed [157184, 4096] bf16 (the word-embedding table), enorm_weight [4096] bf16, hnorm_weight
[4096] bf16. Output out [4, 4096, 8192] bf16.

Numerics: the reference computes in fp32 (the promotion of bf16 and fp32) and rounds once to bf16
(HF rounds the normalised value to bf16 before the weight multiply; the reference does not). The
gather is exact; only the two normalisations round.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta, Upstream

EPS = 1e-6
SHAPES = {"full": (4, 4096, 4096, 157184), "smoke": (2, 32, 128, 1000)}  # batch, seq, hidden, vocab

_B, _S, _H, _V = SHAPES["full"]
_N = _B * _S

META = ProblemMeta(
    number=42,
    name="shifted_embedding_dual_rmsnorm_ling_mtp_bf16",
    family="mlp_norm",
    dtypes=("bf16",),
    source_model="inclusionAI/Ling-flash-2.0",
    source_config="hidden_size=4096, vocab_size=157184, rms_norm_eps=1e-6, num_nextn_predict_layers=1; "
                  "MTP input: enorm(embed(shifted ids)), hnorm(hidden), concatenated [e, h] for eh_proj; 4 x 4096 tokens",
    inputs=("input_ids", "next_token", "hidden", "embed", "enorm_weight", "hnorm_weight"),
    outputs=(Output("out"),),
    flops=2.0 * 4.0 * _N * _H,
    bytes=8.0 * (_N + _B) + 2.0 * (_N * _H + _N * _H + 2 * _H + 2 * _N * _H),  # ids, hidden, gathered rows, out
    peak="memory",
    upstream=Upstream(
        source='recipe',
        path='problems/_sol_execbench/42_shifted_embedding_dual_rmsnorm_ling_mtp_bf16.json',
        matches=('in_place', 'dtypes', 'structure_per_draw', "exactness"),
        differs=(
            ('computation', 'upstream also projects the concatenation with eh_proj_weight [4096, 8192] (eps an input) and takes no next_token (it shifts input_ids itself); mkb stops at the concatenated, normalised pair and takes the token that enters at the shift as an input - not yet converted (issue #15 follow-up)'),
            ('outputs', 'upstream returns the projected [B, S, 4096]; mkb the [B, S, 8192] concatenation - not yet converted (issue #15 follow-up)'),
            ('shapes', 'upstream: batch 32 x 256 tokens (vocab 157184, hidden 4096); mkb: 4 x 4096 tokens - not yet converted (issue #15 follow-up)'),
            ('distributions', "upstream: hidden and embeddings N(0, 1), norm weights 1 + 0.1 N; mkb's scales differ - not yet converted (issue #15 follow-up)"),
        ),
    ),
    notes="Training-style shift (the last position takes the next token of the sequence); vLLM's inference-time "
          "zeroing of position-0 embeddings is not part of this problem. The embedding table is read only at the "
          "gathered rows. Smoke: 2 x 32 tokens, hidden 128, vocab 1000.",
)


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * w


def reference(input_ids, next_token, hidden, embed, enorm_weight, hnorm_weight):
    ct = torch.promote_types(hidden.dtype, torch.float32)
    ids_next = torch.cat([input_ids[:, 1:], next_token[:, None]], dim=1)
    e = embed[ids_next].to(ct)
    out = torch.cat([_rms(e, enorm_weight.to(ct)), _rms(hidden.to(ct), hnorm_weight.to(ct))], dim=-1)
    return out.to(hidden.dtype)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    b, s, h, v = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    input_ids = torch.randint(0, v, (b, s), generator=g, device=device)
    next_token = torch.randint(0, v, (b,), generator=g, device=device)
    hidden = torch.randn(b, s, h, generator=g, device=device) * torch.exp(0.5 * torch.randn(b, s, 1, generator=g, device=device))
    hidden[..., :: max(1, h // 16)] *= 10.0
    # embedding rows have very different norms (frequent vs rare tokens)
    embed = 0.02 * torch.randn(v, h, generator=g, device=device) * torch.exp(0.5 * torch.randn(v, 1, generator=g, device=device))
    enorm_weight = 1.0 + 0.3 * torch.randn(h, generator=g, device=device)
    hnorm_weight = 1.0 + 0.3 * torch.randn(h, generator=g, device=device)
    out = tuple(t.to(torch.bfloat16) for t in (hidden, embed, enorm_weight, hnorm_weight))
    return (input_ids, next_token) + out
