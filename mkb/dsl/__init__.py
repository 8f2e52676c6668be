"""DSL backends behind one protocol; the registry maps a DSL's short name to its backend."""

from mkb.dsl._backend import CompileResult, DslBackend, StaticFinding

__all__ = ["CompileResult", "DslBackend", "StaticFinding"]
