"""DSL backends behind one protocol; the registry maps a DSL's short name to its backend."""

from mkb.dsl._backend import CompileResult, DslBackend, StaticFinding
from mkb.dsl._registry import BACKENDS, dsl_names, get_backend

__all__ = ["BACKENDS", "CompileResult", "DslBackend", "StaticFinding", "dsl_names", "get_backend"]
