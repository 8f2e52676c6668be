"""One check that a problem's full-size inputs have the stated shapes and dtypes (on the meta device: no memory)."""

from __future__ import annotations

import pytest
import torch

from mkb.problems import Problem, get_problem


def describe(v):
    return (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v


def assert_full_shapes(number: int, want: list, *, source: str) -> Problem:
    """Every input of `number` at size="full" equals `want` (shape and dtype, or the scalar); `source` names the table."""
    problem = get_problem(number)
    got = [describe(v) for v in problem.make_inputs(0, device="meta", size="full")]
    assert len(got) == len(want) == len(problem.meta.inputs)
    for name, g, w in zip(problem.meta.inputs, got, want):
        assert g == pytest.approx(w) if isinstance(w, float) else g == w, f"{number} {name}: {g} != {source} {w}"
    return problem
