"""Rotary position embedding as vLLM's cache-update kernels take it: a bf16 cos/sin table and the NeoX rotation.

Problems 19, 20 and 22 (upstream MetaKernelBench's vLLM workloads) pass the table as an input, built
from config constants (so it is the same for every seed: `ProblemMeta.fixed_inputs`), and index it by
each token's position.
"""

from __future__ import annotations

import torch

__all__ = ["cos_sin_cache", "neox_rotate"]


def cos_sin_cache(max_position: int, rot: int, base: float) -> torch.Tensor:
    """bf16 [max_position, rot]: cos of position x inverse frequency (rot / 2 columns), then sin.

    Angles are computed in float32 and the table rounded to bf16 once, as vLLM's tests build it.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freq = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat((freq.cos(), freq.sin()), dim=-1).to(torch.bfloat16)


def neox_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX (rotate-half) RoPE over x's last dim: [x1 cos - x2 sin | x2 cos + x1 sin], x1, x2 its two halves.

    Computes in the dtype of its arguments (the caller promotes); cos and sin broadcast against x1.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
