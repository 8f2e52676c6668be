"""GroupNorm of a Stable Diffusion 1.5 UNet ResNet block (32 groups, eps 1e-5, affine), fp32.

Every ResnetBlock2D of the SD 1.5 UNet (`norm_num_groups=32`, `norm_eps=1e-5`) starts with

    y[n, c, :, :] = (x[n, c] - mean_g) * rsqrt(var_g + eps) * gamma[c] + beta[c]

where mean_g and var_g (biased) are taken over the channels of c's group (C / 32 channels) and
all spatial positions of sample n. Shape: the 320-channel blocks at 64x64 latent resolution
(512x512 images), batch 8 (classifier-free guidance doubles a batch of 4). NCHW, contiguous.
"""

from __future__ import annotations

import torch

from mkb.problems._contract import Output, ProblemMeta

SHAPES = {"full": (8, 320, 64, 64), "smoke": (2, 64, 8, 8)}
GROUPS = 32
EPS = 1e-5
_N, _C, _H, _W = SHAPES["full"]

META = ProblemMeta(
    number=31,
    name="groupnorm_sd15_fp32",
    family="mlp_norm",
    dtypes=("fp32",),
    source_model="runwayml/stable-diffusion-v1-5 (UNet2DConditionModel)",
    source_config="block_out_channels[0]=320, norm_num_groups=32, norm_eps=1e-5; 64x64 latents (512x512), batch 8",
    inputs=("x", "gamma", "beta"),
    outputs=(Output("y"),),
    flops=8.0 * _N * _C * _H * _W,
    bytes=4.0 * (2 * _N * _C * _H * _W + 2 * _C),
    peak="memory",
    notes="Biased variance, as torch.nn.GroupNorm. Smoke: 2 x 64 x 8 x 8.",
)


def reference(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    ct = torch.promote_types(x.dtype, torch.float32)
    n, c, h, w = x.shape
    xg = x.to(ct).reshape(n, GROUPS, -1)
    mean = xg.mean(dim=-1, keepdim=True)
    var = (xg - mean).pow(2).mean(dim=-1, keepdim=True)
    y = ((xg - mean) * torch.rsqrt(var + EPS)).reshape(n, c, h, w)
    return (y * gamma.to(ct).view(1, c, 1, 1) + beta.to(ct).view(1, c, 1, 1)).to(x.dtype)


def eager(x, gamma, beta):
    return torch.nn.functional.group_norm(x, GROUPS, gamma, beta, EPS)


def make_inputs(seed: int, *, device="cpu", size: str = "full"):
    n, c, h, w = SHAPES[size]
    g = torch.Generator(device="cpu" if str(device) == "meta" else device).manual_seed(seed)
    # a non-zero per-channel offset makes the mean matter (one-pass variance loses precision on it)
    offset = 2.0 * torch.randn(1, c, 1, 1, generator=g, device=device)
    x = torch.randn(n, c, h, w, generator=g, device=device) * 1.5 + offset
    gamma = 1.0 + 0.2 * torch.randn(c, generator=g, device=device)
    beta = 0.1 * torch.randn(c, generator=g, device=device)
    return x, gamma, beta
