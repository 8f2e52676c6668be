"""MoE routing numerics (DeepSeek-style grouped top-k) and tie-free router-logit inputs for the moe problems.

The routing problems compare expert indices with `compare="topk"`, but their weights and outputs are
compared positionally, so a near-tie between the k-th and (k+1)-th expert (or between the last
selected and first dropped group) would make a correct kernel fail on rounding alone.
`separate_topk` nudges drawn router logits (raising the selected ones a little at a time) until
every token's selection has a clear margin, so the selection is a property of the inputs and not of
summation order. Routing results are returned with indices in ascending expert order (the set is
what matters; an ascending order makes the positional comparison of weights well defined).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def group_mask(scores: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """Bool [T, E]: experts in the `topk_group` groups with the largest sum of their top-2 scores."""
    t, e = scores.shape
    gs = scores.view(t, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    gidx = gs.topk(topk_group, dim=-1).indices
    gmask = torch.zeros(t, n_group, dtype=torch.bool, device=scores.device).scatter_(1, gidx, True)
    return gmask.repeat_interleave(e // n_group, dim=1)


def select_topk(scores: torch.Tensor, top_k: int, *, n_group: int = 1, topk_group: int = 1) -> torch.Tensor:
    """Indices [T, top_k] of the selected experts in ascending expert order (group-limited if n_group > 1)."""
    s = scores
    if n_group > 1:
        s = s.masked_fill(~group_mask(scores, n_group, topk_group), float("-inf"))
    return s.topk(top_k, dim=-1).indices.sort(dim=-1).values


def topk_margins(scores: torch.Tensor, top_k: int, *, n_group: int = 1, topk_group: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, (gap between the last kept and first dropped group score, gap between the k-th and (k+1)-th
    kept expert score): a selection whose gaps exceed the rounding of the scores is a property of the inputs.
    Without groups the group gap is +inf."""
    t, e = scores.shape
    s = scores
    group_gap = torch.full((t,), float("inf"), dtype=scores.dtype, device=scores.device)
    if n_group > 1:
        gs = scores.view(t, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
        gsv = gs.sort(dim=-1, descending=True).values
        group_gap = gsv[:, topk_group - 1] - gsv[:, topk_group]
        s = scores.masked_fill(~group_mask(scores, n_group, topk_group), float("-inf"))
    sv = s.sort(dim=-1, descending=True).values
    return group_gap, sv[:, top_k - 1] - sv[:, top_k]


def separate_topk(
    logits: torch.Tensor,
    score_fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    top_k: int,
    margin: float,
    n_group: int = 1,
    topk_group: int = 1,
    step: float = 0.05,
    max_iter: int = 400,
    lower: bool = False,
) -> torch.Tensor:
    """Raise selected router logits until the selection has a margin >= `margin` in score units.

    `score_fn` maps float64 logits [T, E] to the selection scores (softmax, sigmoid + bias, ...),
    which must be monotone in each logit. Returns float64 logits; the caller casts them.

    Raising alone cannot separate a saturating score (sigmoid + bias): once the selected logits are
    large, their scores stop growing and a dropped competitor with a larger bias stays within the
    margin for ever. With `lower=True` the competitors are also pushed down: every expert of a
    dropped group (which cannot change the expert selection, those experts are masked) and every
    unselected expert of a kept group whose score is within the margin of the k-th. Only rows that
    still tie are touched, so a row's logits change only as much as its separation needs.
    """
    x = logits.to(torch.float64).clone()
    t, e = x.shape
    rows = torch.arange(t, device=x.device)  # rows that may still tie (a separated row is never touched again)
    for _ in range(max_iter):
        s = score_fn(x[rows])  # score_fn is row-wise, so only the rows that may still tie are scored
        n = rows.numel()
        bad_rows = torch.zeros(n, dtype=torch.bool, device=x.device)
        raise_mask = torch.zeros(n, e, dtype=torch.bool, device=x.device)
        lower_mask = torch.zeros(n, e, dtype=torch.bool, device=x.device)
        if n_group > 1:
            gs = s.view(n, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
            gsv, gsi = gs.sort(dim=-1, descending=True)
            gbad = (gsv[:, topk_group - 1] - gsv[:, topk_group]) < margin
            gsel = torch.zeros(n, n_group, dtype=torch.bool, device=x.device).scatter_(1, gsi[:, :topk_group], True)
            emask = gsel.repeat_interleave(e // n_group, dim=1)
            raise_mask |= emask & gbad[:, None]
            lower_mask |= ~emask & gbad[:, None]
            bad_rows |= gbad
            s = s.masked_fill(~emask, float("-inf"))
        sv, si = s.sort(dim=-1, descending=True)
        ebad = (sv[:, top_k - 1] - sv[:, top_k]) < margin
        sel = torch.zeros(n, e, dtype=torch.bool, device=x.device).scatter_(1, si[:, :top_k], True)
        raise_mask |= sel & ebad[:, None]
        close = ~sel & (s > (sv[:, top_k - 1] - margin)[:, None])  # unselected kept experts within the margin
        lower_mask |= close & ebad[:, None]
        bad_rows |= ebad
        if not bool(bad_rows.any()):
            return x
        delta = step * raise_mask.to(x.dtype)
        if lower:
            delta = delta - step * lower_mask.to(x.dtype)
        x[rows] += delta
        rows = rows[bad_rows]
    raise RuntimeError(
        f"separate_topk: {rows.numel()} rows still tie after {max_iter} steps; "
        "hint: raise step or max_iter, or pass lower=True for a saturating score"
    )


def skewed_logits(t: int, e: int, *, gen: torch.Generator, popularity: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """Gaussian router logits plus a per-expert popularity offset (load skew), float64 on popularity's device."""
    z = torch.randn(t, e, generator=gen, device=popularity.device, dtype=torch.float64) * std
    return z + popularity.to(torch.float64)[None, :]


def expert_popularity(e: int, *, seed: int, spread: float = 1.0) -> torch.Tensor:
    """A fixed (size-determined) per-expert logit offset so loads are uneven the way real routers' are."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(e, generator=g, dtype=torch.float64) * spread


def routed_swiglu(x, idx, wts, w_gate_up, w_down, *, cdt, mdt) -> torch.Tensor:
    """sum_k wts[t,k] * down(silu(gate(x[t])) * up(x[t])) over each token's selected experts, in `cdt`.

    w_gate_up [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up), w_down [E, H, I]. The GEMMs run in `mdt`
    (the compute dtype for a reference, bfloat16 for an eager baseline, whose hidden activation is
    then rounded to bfloat16 as a bf16 model's would be); everything else in `cdt`.
    """
    t, h = x.shape
    k = idx.shape[1]
    e_count, inter = w_down.shape[0], w_down.shape[-1]
    out = torch.zeros(t, h, dtype=cdt, device=x.device)
    flat = idx.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=e_count).tolist()
    tok_all, w_all = order // k, wts.flatten()[order].to(cdt)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        tok, w = tok_all[start : start + n], w_all[start : start + n]
        start += n
        gu = x[tok].to(mdt) @ w_gate_up[e].to(mdt).T
        a = torch.nn.functional.silu(gu[:, :inter].to(cdt)) * gu[:, inter:].to(cdt)
        y = (a.to(mdt) @ w_down[e].to(mdt).T).to(cdt)
        out.index_add_(0, tok, y * w[:, None])
    return out


def routed_swiglu_padded(x, idx, wts, w_gate_up, w_down, *, cdt) -> torch.Tensor:
    """`routed_swiglu` as an eager baseline writes it: tokens sorted by expert into padded groups, two bmm's.

    A per-expert Python loop costs ~10 launches per expert, far too slow for hundreds of experts; here
    the launch count is fixed. Each expert's tokens are gathered into a zero-padded [E, C, H] block
    (C = the busiest expert's count, one host sync), the GEMMs run as batched bf16 matmuls with fp32
    accumulation (padding rows cost FLOPs but not weight bytes, which dominate), and the hidden
    activation is rounded to bfloat16 exactly where `routed_swiglu(..., mdt=bfloat16)` rounds it.
    """
    t, h = x.shape
    k = idx.shape[1]
    e_count, inter = w_down.shape[0], w_down.shape[-1]
    mdt = w_down.dtype
    flat = idx.flatten()
    order = flat.argsort(stable=True)
    exp_sorted = flat[order]
    counts = torch.bincount(flat, minlength=e_count)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(flat.numel(), device=x.device) - starts[exp_sorted]
    cap = int(counts.max())
    tok = order // k
    xg = torch.zeros(e_count, cap, h, dtype=mdt, device=x.device)
    xg[exp_sorted, pos] = x[tok].to(mdt)
    gu = torch.bmm(xg, w_gate_up.transpose(1, 2))  # [E, C, 2I]
    a = (torch.nn.functional.silu(gu[..., :inter].to(cdt)) * gu[..., inter:].to(cdt)).to(mdt)
    y = torch.bmm(a, w_down.transpose(1, 2))  # [E, C, H]
    out = torch.zeros(t, h, dtype=cdt, device=x.device)
    out.index_add_(0, tok, y[exp_sorted, pos].to(cdt) * wts.flatten()[order].to(cdt)[:, None])
    return out


__all__ = ["expert_popularity", "group_mask", "routed_swiglu", "routed_swiglu_padded", "select_topk", "separate_topk", "skewed_logits", "topk_margins"]
