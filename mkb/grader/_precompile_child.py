"""The two processes of a precompile (mkb.grader._precompile): the sandbox that records a kernel's device sources, and
the trusted builder that compiles them.

    python -m mkb.grader._precompile_child sources <dsl> <kernel.py> <problem> <size> <folder>
    python -m mkb.grader._precompile_child build <dsl> <sources.json> <out folder> <gpu arch>

The sandbox runs the candidate's code beside another grading's timing, so before any of it runs it confines itself:
writes only beneath its own folder (Landlock; so it cannot open the GPU, whose device files need write access, nor
write the builder's output), the grader's seccomp filter, a CPU-time limit and a low priority; without Landlock it
refuses to run at all (exit 3). It prints `MKB_PRECOMPILE {"sources": [...]}` as its last stdout line. The builder
runs no candidate code, but compiles the sources the sandbox printed, so it is confined the same way to its own
folders; it prints `MKB_PRECOMPILE {"keys": [...]}`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

SANDBOX_CPU_S = 120  # CPU seconds: a sandbox imports torch and the DSL and traces one solve
NOT_CONFINED = 3  # exit status: no Landlock here, nothing run


def _confine(writable: list[Path]) -> tuple[str | None, str]:
    """Confine this process before anything of the candidate's runs: (the reason it could not, else None; the guards)."""
    from mkb.grader._fs_guard import confine_writes
    from mkb.grader._syscall_guard import refuse_escapes

    try:
        os.nice(10)
    except OSError:
        pass
    resource.setrlimit(resource.RLIMIT_CPU, (SANDBOX_CPU_S, SANDBOX_CPU_S))
    fs = confine_writes(writable, device_ioctls=False)
    if not fs.confined:
        return f"writes not confined: {fs.note}", ""
    sc = refuse_escapes()
    if not sc.kept:
        return f"system calls not filtered: {sc.note}", ""
    return None, f"{fs.describe()}{'; device ioctls refused' if fs.abi >= 5 else ''} | {sc.describe()}"


def _emit(payload: dict) -> None:
    sys.stdout.flush()
    print("MKB_PRECOMPILE " + json.dumps(payload), flush=True)


def sources(dsl: str, kernel: Path, problem: str, size: str, folder: Path) -> int:
    why, guards = _confine([folder])
    if why is not None:
        _emit({"error": why})
        return NOT_CONFINED
    import torch

    from mkb.dsl import get_backend
    from mkb.problems import find_problem, load_problem

    backend = get_backend(dsl)
    prob = load_problem(find_problem(int(problem) if problem.isdigit() else problem))
    inputs = prob.make_inputs(0, device="cpu", size=size)
    backend.compile_only_patches()
    recorded = backend.record_device_code()
    mod = backend.load(kernel)
    with torch.no_grad():
        mod.solve(*inputs)
    _emit({"sources": list(recorded), "guards": guards})
    return 0


def build(dsl: str, sources_json: Path, out: Path, gpu_arch: str) -> int:
    tmp = Path(os.environ.get("TMPDIR") or out)
    why, _ = _confine([out, tmp] if tmp != out else [out])
    if why is not None:
        _emit({"error": why})
        return NOT_CONFINED
    from mkb.dsl import get_backend

    srcs = json.loads(sources_json.read_text())
    keys = get_backend(dsl).build_device_code(list(srcs), out, gpu_arch=gpu_arch)
    _emit({"keys": keys})
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["sources"] and len(argv) == 6:
        return sources(argv[1], Path(argv[2]), argv[3], argv[4], Path(argv[5]))
    if argv[:1] == ["build"] and len(argv) == 5:
        return build(argv[1], Path(argv[2]), Path(argv[3]), argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
