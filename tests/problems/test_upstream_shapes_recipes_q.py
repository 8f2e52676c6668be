"""Problems 54-67 following from their SOL-ExecBench recipes produce the recipes' shapes at size="full" (meta device, no memory).

The expected shapes are the constants of upstream MetaKernelBench's recipes (d90ba28,
`problems/_sol_execbench/NN_*.json`). A problem whose full size drifts from its recipe fails here and
must instead carry a `differs` row for "shapes" in its META.upstream; one that records such a row is
checked for the shapes it does keep.
"""

from __future__ import annotations

import pytest
import torch

from mkb.problems import get_problem

from shape_check import assert_full_shapes

BF16, F32, U8, FP8 = torch.bfloat16, torch.float32, torch.uint8, torch.float8_e4m3fn
RECIPE_FULL = {
    54: [((64, 256, 7680), BF16), ((7680, 7680), BF16), ((1024, 7680), BF16), ((1024, 7680), BF16), ((7680,), BF16),
         ((1024,), BF16), ((1024,), BF16), ((128,), BF16), ((128,), BF16), 1e-5],
    55: [((32, 1024), torch.int64), ((151936, 8192), BF16), ((32, 384, 3584), BF16), ((8192, 1792), U8),
         ((8192, 224), FP8), ((), F32), ((8192,), BF16), ((32, 1024), torch.bool)],
    56: [((64, 256, 7168), BF16), ((640, 7168), BF16), ((512,), BF16), ((32768, 512), BF16), 1e-6],
    57: [((64, 128, 8192), BF16), ((64, 128, 128), BF16), ((64, 128, 128), BF16),
         ((8192, 4096), U8), ((8192, 512), FP8), ((), F32), ((1024, 4096), U8), ((1024, 512), FP8), ((), F32),
         ((1024, 4096), U8), ((1024, 512), FP8), ((), F32), ((8192, 4096), U8), ((8192, 512), FP8), ((), F32)],
    58: [((64, 40, 256, 128), BF16), ((64, 8, 256, 128), BF16), ((64, 8, 256, 128), BF16), ((64, 1, 256, 256), BF16)],
    61: [((32, 512, 4096), BF16), ((12288, 2048), U8), ((12288, 256), FP8), ((), F32), ((12288, 2048), U8),
         ((12288, 256), FP8), ((), F32), ((4096, 6144), U8), ((4096, 768), FP8), ((), F32)],
    63: [((8, 512, 8192), BF16), ((37120, 8192), BF16), ((20480, 1, 4), BF16), ((20480,), BF16), ((256,), BF16),
         ((256,), BF16), ((256,), BF16), ((16384,), BF16), ((8192, 16384), BF16), 0.0, 1e6, 1e-5],
    64: [((8, 1024, 16, 64), BF16), ((8, 16, 1024), BF16), ((8, 1024, 1, 256), BF16), ((8, 1024, 1, 256), BF16),
         ((16,), BF16), ((8, 16, 64, 256), BF16)],
    65: [((16, 1, 128, 128, 128), BF16), ((16, 128, 1, 128), BF16), ((16, 1, 128, 8, 128), BF16),
         ((16, 1, 128, 8, 128), BF16)],
    66: [((2048,), F32), ((64, 1721, 2048), F32), ((2048,), F32), ((64, 1721, 2048), F32), ((64, 2048), F32),
         ((64, 2048), F32), ((64, 2048), F32)],
    67: [((32, 256, 256), F32)] + [((256,), F32)] * 4 + [((768, 256), F32), ((768,), F32), ((768, 1, 3), F32),
         ((768,), F32), ((64, 5), F32), ((64,), F32), ((1, 64), F32), ((64, 64), F32), ((64,), F32),
         ((64, 64), F32), ((64,), F32), ((256, 64), F32), ((256,), F32), ((256,), F32), ((256, 256), F32),
         ((256,), F32), ((1024, 256), F32), ((1024,), F32), ((256, 1024), F32), ((256,), F32), 1e-5, 0.0],
}
# the recipe hides some axes of these (a `differs` row says which); the visible ones are checked above
SHAPES_DIFFER: set[int] = {65}
# kept at mkb's own size for a stated reason (a `differs` row for "shapes"), so not listed above
SIZE_KEPT: set[int] = set()



@pytest.mark.parametrize("number", sorted(RECIPE_FULL))
def test_full_size_inputs_have_the_recipes_shapes(number):
    problem = assert_full_shapes(number, RECIPE_FULL[number], source="recipe")
    u = problem.meta.upstream
    assert u is not None and u.source == "recipe"
    assert ("shapes" in u.matches) == (number not in SHAPES_DIFFER)


@pytest.mark.parametrize("number", sorted(RECIPE_FULL.keys() | SIZE_KEPT))
def test_every_difference_says_what_and_why(number):
    u = get_problem(number).meta.upstream
    assert u is not None and u.source == "recipe"
    assert not any("not yet converted" in reason for _, reason in u.differs)
    assert ("shapes" in dict(u.differs)) == (number in SHAPES_DIFFER | SIZE_KEPT)
