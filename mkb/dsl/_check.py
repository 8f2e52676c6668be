"""The free CPU `check`: import a kernel and run its `solve` on smoke inputs with the DSL patched to compile only.

Run as `python -m mkb.dsl._check <dsl> <kernel.py> <problem>` by `DslBackend.check_compile`, in a
fresh process whose environment the backend set. Nothing is launched: the DSL's compile entry
point really compiles, for the real GPU arch, and returns a stand-in whose calls do nothing (each
backend's `compile_only_patches()` says how for its DSL). The last stdout line is `MKB_CHECK {"ok": ..., "messages": [...]}`.
`python -m mkb.dsl._check <dsl> --empty-kernel` builds the backend's `empty_kernel()` the same way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _emit(ok: bool, messages: list[str] | tuple[str, ...]) -> None:
    sys.stdout.flush()
    print("MKB_CHECK " + json.dumps({"ok": ok, "messages": list(messages)}), flush=True)


def _backend(dsl: str):
    """The registered backend, or None (the caller reports the unknown DSL as a check message)."""
    from mkb.dsl import BACKENDS, get_backend

    return get_backend(dsl) if dsl in BACKENDS else None


def check_empty_kernel(dsl: str) -> int:
    """Build `empty_kernel()` with launching stubbed: it must compile exactly one kernel, once."""
    from mkb.dsl._errors import format_exception

    label = Path(f"{dsl}_empty_kernel.py")
    try:
        backend = _backend(dsl)
        if backend is None:
            _emit(False, [f"unknown DSL {dsl!r}"])
            return 0
        stats = backend.compile_only_patches()
        launch = backend.empty_kernel()
        launch()
        again = backend.empty_kernel()
        again()
    except BaseException as e:  # noqa: BLE001 - every failure becomes a message
        _emit(False, format_exception(e, label))
        return 0
    if again is not launch or stats["compiled"] != 1:
        _emit(False, [f"{dsl} empty kernel: {stats['compiled']} builds for two empty_kernel() calls (want 1, cached)"])
        return 0
    kernels = stats.get("kernels")
    extra = f"; kernels: {', '.join(kernels)}" if kernels else ""
    _emit(True, [f"{dsl} empty kernel: 1 kernel build compiled for {stats['arch']}{extra}"])
    return 0


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--empty-kernel"]:
        return check_empty_kernel(argv[0])
    dsl, kernel_path, problem = argv[0], Path(argv[1]), int(argv[2])
    from mkb.dsl._errors import format_exception

    try:
        import torch

        from mkb.problems import load_problem_module

        backend = _backend(dsl)
        if backend is None:
            _emit(False, [f"unknown DSL {dsl!r}"])
            return 0
        prob = load_problem_module(problem)
        inputs = prob.make_inputs(0, device="cpu", size="smoke")
        if not isinstance(inputs, tuple):
            inputs = (inputs,)
        stats = backend.compile_only_patches()
        mod = backend.load(kernel_path)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a message
        _emit(False, format_exception(e, kernel_path))
        return 0
    solve = getattr(mod, "solve", None)
    if not callable(solve):
        _emit(False, [f"{kernel_path.name}: no callable `solve` defined"])
        return 0
    try:
        with torch.no_grad():
            solve(*inputs)
    except BaseException as e:  # noqa: BLE001
        _emit(False, format_exception(e, kernel_path))
        return 0
    if stats["compiled"] == 0:
        _emit(False, [f"{kernel_path.name}: solve() compiled no {dsl} kernel ({stats['entry']} was never called)"])
        return 0
    _emit(True, [f"{kernel_path.name}: {stats['compiled']} kernel build(s) compiled for {stats['arch']}"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
