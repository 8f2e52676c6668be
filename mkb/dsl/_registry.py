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


def backend_target(name: str) -> str:
    """The registry's "module:Class" for `name` (a worker process imports the backend from it)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown DSL {name!r}\nhint: known DSLs are {', '.join(BACKENDS)}") from None


@cache
def backend_from_target(target: str) -> DslBackend:
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


def get_backend(name: str) -> DslBackend:
    """The backend called `name`, read from the registry at call time (tests register CPU-only backends).
    Constructing a backend must not import its DSL package."""
    return backend_from_target(backend_target(name))


def dsl_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def baseline_file(name: str) -> str:
    """The file name of `name`'s baseline solution in a problem folder (`<name>.py` unless the backend says otherwise)."""
    return getattr(get_backend(name), "baseline_file", f"{name}.py")


def baseline_files() -> dict[str, str]:
    """Baseline file name -> DSL name for every registered backend, in registry order."""
    return {baseline_file(n): n for n in BACKENDS}


def is_compile_error(name: str, exc: BaseException) -> bool:
    """Whether `exc`, raised while a `name` kernel was imported or first called, is the DSL compiler's refusal
    (reason `compile_error`) rather than the candidate's own Python failing (`import_error`, `runtime_error`)."""
    check = getattr(get_backend(name), "is_compile_error", None)
    if check is not None:
        return bool(check(exc))
    return "ompil" in type(exc).__name__
