"""DSL backends behind one protocol; the registry maps a DSL's short name to its backend."""

from mkb.dsl._backend import CompileResult, DslBackend, StaticFinding
from mkb.dsl._registry import (
    BACKENDS, backend_from_target, backend_target, baseline_file, baseline_files, dsl_names, get_backend, is_compile_error,
)

__all__ = [
    "BACKENDS", "CompileResult", "DslBackend", "StaticFinding", "backend_from_target", "backend_target", "baseline_file",
    "baseline_files", "dsl_names", "get_backend", "is_compile_error",
]
