"""Resolves a DSL name to its backend through the registry, as a "module:Class" target a worker can import too."""

from __future__ import annotations

import importlib
from functools import cache

from mkb.dsl._backend import DslBackend


def backend_target(dsl: str) -> str:
    """The registry's "module:Class" for `dsl`, read at call time (so tests can register a CPU-only backend)."""
    from mkb.dsl._registry import BACKENDS

    try:
        return BACKENDS[dsl]
    except KeyError:
        raise ValueError(f"unknown DSL {dsl!r}\nhint: known DSLs are {', '.join(BACKENDS)}") from None


@cache
def backend_from_target(target: str | None, dsl: str) -> DslBackend:
    if target is None:
        target = backend_target(dsl)
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()
