"""Plumbing every DSL backend shares: importing a kernel file, the check subprocess, hashes, the math-flag policy.

Why a subprocess for `check_compile`: the DSLs snapshot their environment (CUTE_DSL_ARCH, the
math-flag policy) when first imported, a compiler can abort the process, and the check patches
the DSL so that nothing runs; none of that may leak into the caller.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from mkb._ast import parse
from mkb._secrets import without_secrets
from mkb.dsl._backend import CompileResult

_COUNTER = itertools.count()
CHECK_TIMEOUT_S = 180.0


def load_kernel(path: Path, *, dsl: str) -> ModuleType:
    """Import `path` as a fresh module under a unique name (the DSLs re-read source via inspect)."""
    path = Path(path).resolve()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    name = f"mkb_kernel_{dsl}_{digest}_{os.getpid()}_{next(_COUNTER)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}\nhint: the kernel must be a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def decorated_functions(source: str, decorator_names: frozenset[str]) -> tuple[str, ...]:
    """Names of functions (also methods) whose decorator's last attribute is one of `decorator_names`.

    `@cute.kernel`, `@cute.kernel(...)`, `@Tx.prim_func`, `@Tx.prim_func(private=True)` all count.
    """
    try:
        tree = parse(source)
    except SyntaxError:
        return ()
    names: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for d in node.decorator_list:
            target = d.func if isinstance(d, ast.Call) else d
            last = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            if last in decorator_names and node.name not in names:
                names.append(node.name)
    return tuple(names)


def module_source(module: ModuleType) -> str:
    path = getattr(module, "__file__", None)
    if not path:
        raise ValueError(f"module {module.__name__} has no source file\nhint: load kernels with backend.load(path)")
    return Path(path).read_text()


def run_check(dsl: str, path: Path, problem: int, env: dict[str, str], *, timeout: float = CHECK_TIMEOUT_S) -> CompileResult:
    """Run `python -m mkb.dsl._check` in a fresh process with the DSL's environment."""
    path = Path(path).resolve()
    return _run_check_process([dsl, str(path), str(problem)], path.name, env, timeout=timeout)


def run_empty_kernel_check(dsl: str, env: dict[str, str], *, timeout: float = CHECK_TIMEOUT_S) -> CompileResult:
    """Compile the backend's `empty_kernel()` in the compile-only check process (`_check <dsl> --empty-kernel`)."""
    return _run_check_process([dsl, "--empty-kernel"], f"{dsl} empty kernel", env, timeout=timeout)


def _run_check_process(args: list[str], label: str, env: dict[str, str], *, timeout: float) -> CompileResult:
    full_env = {**without_secrets(os.environ), **env, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}  # it imports a kernel
    repo_root = str(Path(__file__).resolve().parents[2])
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, full_env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mkb.dsl._check", *args],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return CompileResult(ok=False, messages=(f"{label}: compile check timed out after {timeout:.0f} s",), seconds=timeout)
    seconds = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("MKB_CHECK "):
            data = json.loads(line[len("MKB_CHECK ") :])
            return CompileResult(ok=data["ok"], messages=tuple(data["messages"]), seconds=seconds)
    tail = [ln for ln in (proc.stderr or "").strip().splitlines()[-3:]]
    from mkb.dsl._errors import strip_ansi

    msg = f"{label}: compile check process died (exit {proc.returncode})"
    return CompileResult(ok=False, messages=(msg, *(strip_ansi(t)[:300] for t in tail)), seconds=seconds)


def folder_sha256(folder: Path) -> str:
    """sha256 over the relative paths and bytes of every file in `folder`, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file() and "__pycache__" not in q.parts):
        h.update(str(p.relative_to(folder)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def package_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not-installed"


# --- the math-flag policy every backend pins -------------------------------------------------------
MATH_POLICY_ID = "precise-v1"
MATH_POLICY = (
    "precise: IEEE-rounded division and square root, no flush-to-zero of denormals, the precise "
    "(libdevice) exp/log/sin/... functions; FMA contraction allowed (the default of both compilers); "
    "approximate intrinsics only where a kernel asks for one by name"
)


def cuda_path() -> str:
    """The CUDA toolkit root: $CUDA_PATH if set, else /usr/local/cuda (TVM's nvcc-shim lookup is unreliable)."""
    return os.environ.get("CUDA_PATH") or "/usr/local/cuda"


def patch_torch_cuda_for_cpu(torch) -> None:  # noqa: ANN001 - torch is passed in to keep it a lazy import
    """In a compile-only process, stream and sync queries answer as if a device existed."""

    class _Stream:
        cuda_stream = 0
        device = torch.device("cuda", 0)

        def synchronize(self) -> None:
            return None

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

    torch.cuda.current_stream = lambda device=None: _Stream()
    torch.cuda.default_stream = lambda device=None: _Stream()
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_device = lambda: 0
