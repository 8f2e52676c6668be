"""The DSL registry: short name -> backend, imported lazily so no DSL package loads until asked for."""

from __future__ import annotations

import importlib
from functools import cache

from mkb.dsl._backend import DslBackend

# name -> "module:Class". A new DSL is one module under mkb/dsl/ and one line here.
BACKENDS: dict[str, str] = {
    "cute": "mkb.dsl.cute:CuteBackend",
    "tirx": "mkb.dsl.tirx:TirxBackend",
}


@cache
def get_backend(name: str) -> DslBackend:
    """The backend called `name`. Constructing a backend must not import its DSL package."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown DSL {name!r}\nhint: known DSLs are {', '.join(BACKENDS)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


def dsl_names() -> tuple[str, ...]:
    return tuple(BACKENDS)
