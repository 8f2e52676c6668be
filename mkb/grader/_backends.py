"""The grader's view of the DSL registry: a DSL name as the "module:Class" target a worker imports its backend from."""

from __future__ import annotations

from functools import cache

from mkb.dsl import DslBackend
from mkb.dsl import backend_from_target as _from_target
from mkb.dsl import backend_target


@cache
def backend_from_target(target: str | None, dsl: str) -> DslBackend:
    """The backend a worker was started with (`--backend`), else the registry's entry for `dsl`."""
    return _from_target(target if target is not None else backend_target(dsl))


__all__ = ["backend_from_target", "backend_target"]
