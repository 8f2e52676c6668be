"""Problems 27-74 that follow upstream's shapes produce exactly those shapes at size="full" (on the meta device, no memory).

The expected shapes are upstream MetaKernelBench's (d90ba28): the shipped problems' make_inputs and the
SOL-ExecBench recipes' constants. A change of a problem's full size that drifts from upstream fails here
and must come with a `differs` row in its META.upstream instead.
"""

from __future__ import annotations

import pytest
import torch

from mkb.problems import get_problem

E, L, FP8, F32, BF16, I32, I64 = 256, 32, torch.float8_e4m3fn, torch.float32, torch.bfloat16, torch.int32, torch.int64
UPSTREAM_FULL = {
    28: [((14509, 4096), BF16), ((14509, 4096), BF16), ((4096,), BF16)],
    30: [((64, 56, 56, 128), F32), ((512, 128), F32), ((512,), F32), ((512,), F32), ((512,), F32), ((128, 512), F32), ((128,), F32)],
    32: [((64, 128, 1024), F32), ((8192, 1024), F32), ((1024, 4096), F32)],
    35: [((64, 1087, 512), F32)] * 2 + [((2048, 512), F32)] + [((64, 1087, 2048), F32)] * 2
        + [((512, 2048), F32), ((64, 1087, 512), F32), ((64, 1087, 1), F32), ((512,), F32), 1e-5],
    36: [((520128, 128), BF16), ((128,), BF16)],
    37: [((64, 128, 2048), F32), ((64, 128, 2048), F32), ((8192, 2048), F32), ((2048, 8192), F32),
         ((64, 128, 8192), F32), ((64, 128, 8192), F32)],
    38: [((64, 8192, 2560), BF16), ((64, 8192, 2560), BF16), ((64, 8192, 1), BF16), ((2560,), BF16)],
    39: [((32, 256, 3072), F32), ((32, 3072), F32), ((6144, 3072), F32), ((6144,), F32), ((64, 3072), F32), ((64,), F32)],
    40: [((3, 64, 256, 3072), BF16), ((3072, 3072), BF16), ((3072, 3072), BF16), 1e-5],
    41: [((64, 128, 1024), F32)] + [((1024, 1024), F32)] * 3 + [((128,), F32)] * 2 + [1e-6],
    42: [((32, 256), I64), ((32, 256, 4096), BF16), ((157184, 4096), BF16), ((4096,), BF16), ((4096,), BF16),
         ((4096, 8192), BF16), 1e-6],
    43: [((64, 256, 4096), BF16), ((64, 256), I64), ((64, 256, 4096), F32), ((64, 256, 1), F32), ((4096,), BF16)],
    44: [((14107, E), F32), ((E,), BF16), ((14107, 7168), FP8), ((56, 14107), F32), ((L, 4096, 7168), FP8),
         ((L, 32, 56), F32), ((L, 7168, 2048), FP8), ((L, 56, 16), F32), 32, 2.5],
    47: [((64, 128, 8192), BF16), ((64, 8192), F32), ((1, 64), F32), ((64, 3584, 8192), BF16), ((64, 3584, 8192), BF16),
         ((64, 8192, 3584), BF16), ((7168, 8192), BF16), ((7168, 8192), BF16), ((8192, 7168), BF16), 1e-10],
    49: [((16384, 4096), BF16), ((E, 4096), BF16), ((E,), BF16), 2.5],
    52: [((16384, 7680), BF16), ((7680, 7680), BF16), ((7680,), BF16)],
    53: [((8704, 3584), FP8), ((8704, 28), F32), ((18944, 3584), FP8), ((148, 28), F32), ((18944, 3584), FP8),
         ((148, 28), F32)],
    59: [((32768, 4096), BF16), ((2816, 2048), torch.uint8), ((2816, 256), FP8), ((), F32)],
    60: [((1, 8192, 960), torch.uint8), ((1, 1920, 960), torch.uint8), ((1, 8192, 120), FP8), ((), F32),
         ((1, 1920, 120), FP8), ((), F32)],
    62: [((16, 4, 256, 128), BF16), ((16, 4, 256, 128), BF16), ((16, 16, 256, 128), BF16), ((16, 16, 256), BF16),
         ((16, 16, 256), BF16), 128**-0.5],
    68: [((8, 1024, 16, 128), BF16)] * 4 + [((8, 1024, 16), BF16)],
    69: [((8, 1024, 4, 256), BF16), ((8, 1024, 4, 256), BF16), ((8, 1024, 4, 512), BF16), ((8, 1024, 4, 256), BF16)],
    70: [((8, 8, 1024, 256), BF16), ((8, 8, 1024, 256), BF16), ((8, 8, 1024, 512), BF16)],
    71: [((959, 8, 128), BF16), ((959, 8, 128), BF16), ((959, 16, 128), BF16), ((4, 16, 128, 128), F32), ((16,), F32),
         ((959, 16), BF16), ((16,), F32), ((959, 16), BF16), ((5,), I64), 128**-0.5],
    72: [((64, 1, 8, 128), BF16), ((64, 1, 8, 128), BF16), ((64, 1, 16, 128), BF16), ((64, 16, 128, 128), F32),
         ((16,), F32), ((64, 1, 16), BF16), ((16,), F32), ((64, 1, 16), BF16), 128**-0.5],
    73: [((32, 4, 8, 128), BF16), ((32, 4, 8, 128), BF16), ((32, 4, 16, 128), BF16), ((49, 16, 128, 128), F32),
         ((32,), I32), ((16,), F32), ((32, 4, 16), BF16), ((16,), F32), ((32, 4, 16), BF16), 128**-0.5],
    74: [((8, 16, 1024, 128), BF16)] * 3 + [((8, 16, 1024), BF16), ((8, 16, 128, 128), F32)],
}


def _describe(v):
    return (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v


@pytest.mark.parametrize("number", sorted(UPSTREAM_FULL))
def test_full_size_inputs_have_upstreams_shapes_and_dtypes(number):
    problem = get_problem(number)
    got = [_describe(v) for v in problem.make_inputs(0, device="meta", size="full")]
    want = UPSTREAM_FULL[number]
    assert len(got) == len(want) == len(problem.meta.inputs)
    for name, g, w in zip(problem.meta.inputs, got, want):
        assert g == pytest.approx(w) if isinstance(w, float) else g == w, f"{number} {name}: {g} != upstream {w}"
    u = problem.meta.upstream
    assert u is not None and "shapes" in u.matches
