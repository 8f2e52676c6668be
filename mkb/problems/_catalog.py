"""The catalog view of problems: one row of figures per problem, and input shapes without running anything big."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from mkb.measure import speed_of_light
from mkb.problems._loader import Problem


@dataclass(frozen=True)
class InputShape:
    name: str
    shape: tuple[int, ...] | None  # None for a Python scalar
    dtype: str  # torch dtype name, or the Python type of a scalar
    value: Any = None  # the scalar itself (scalars never change with the seed)


def describe_inputs(problem: Problem, *, size: str = "full") -> tuple[InputShape, ...]:
    return _describe(problem.path, problem.hash, problem, size)


@lru_cache(maxsize=512)
def _describe(path, hash_, problem: Problem, size: str) -> tuple[InputShape, ...]:
    """Names, shapes and dtypes of `make_inputs(size=...)`.

    Tried on the meta device first (no memory, no time); a problem whose structure needs real
    values (a page table built with .tolist()) is made on the CPU instead.
    """
    try:
        values = problem.make_inputs(0, device="meta", size=size)
    except Exception:
        values = problem.make_inputs(0, device="cpu", size=size)
    out = []
    for name, v in zip(problem.meta.inputs, values):
        if isinstance(v, torch.Tensor):
            out.append(InputShape(name, tuple(v.shape), str(v.dtype).removeprefix("torch.")))
        else:
            out.append(InputShape(name, None, type(v).__name__, v))
    return tuple(out)


def format_shape(s: InputShape) -> str:
    if s.shape is None:
        return f"{s.name}: {s.dtype} = {s.value!r}"
    return f"{s.name}: {s.dtype}[{', '.join(map(str, s.shape))}]"


@dataclass(frozen=True)
class CatalogRow:
    number: int
    family: str
    name: str
    dtypes: str
    flops: float
    bytes: float
    peak: str
    sol_us: float
    bound: str


def catalog_row(problem: Problem, *, gpu: str = "H200") -> CatalogRow:
    m = problem.meta
    sol = speed_of_light(flops=m.flops, bytes=m.bytes, peak=m.peak, gpu=gpu)
    return CatalogRow(m.number, m.family, m.name, ",".join(m.dtypes), m.flops, m.bytes, m.peak, sol.us, sol.bound)


def si(x: float, unit: str = "") -> str:
    """1.2e12 -> '1.20 T' (for FLOPs and bytes in tables)."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()
