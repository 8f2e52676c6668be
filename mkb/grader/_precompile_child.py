"""The two processes of a precompile (mkb.grader._precompile): the sandbox that records a kernel's device sources, and
the trusted builder that compiles them.

    python -m mkb.grader._precompile_child sources <dsl> <kernel.py> <problem> <size> <folder>
    python -m mkb.grader._precompile_child build <dsl> <sources.json> <out folder> <gpu arch>

The sandbox runs the candidate's code beside another grading's timing, so before any of it runs it confines itself:
the lowest priority and first in line for the OOM killer, CPU-time and address-space limits, no capabilities (a
grader run as root would hand it CAP_SYS_NICE, CAP_MKNOD, CAP_BPF), writes only beneath its own folder with no device
node made there and no device ioctl anywhere (Landlock >= 6; so it cannot reach the GPU, nor write the builder's
output), the grader's seccomp filter with the sandbox's extra calls (device nodes, bpf, perf, scheduling, file
metadata). Where it cannot, it runs nothing (exit 3). It reports its guards on the parent's pipe (`MKB_GUARDS_FD`) and
closes it before the candidate's import; it prints `MKB_PRECOMPILE {"sources": [...]}` as its last stdout line. The builder
runs no candidate code but compiles the sources the sandbox printed, so it is confined the same way to its own
folders (with the worker's seccomp filter: nvcc's toolchain may set a file's mode); it prints
`MKB_PRECOMPILE {"keys": [...]}`.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import sys
from pathlib import Path

SANDBOX_CPU_S = 120  # CPU seconds: a sandbox imports torch and the DSL and traces one solve
SANDBOX_MEMORY = 32 << 30  # address space: torch and the DSL imported, one solve traced on CPU inputs
BUILDER_MEMORY = 16 << 30  # address space of the builder and the nvcc it runs (a hostile source cannot grow it past)
NOT_CONFINED = 3  # exit status: no Landlock here (or too old a one), nothing run
MIN_LANDLOCK_ABI = 6  # truncate (3), device ioctls (5), signals and abstract sockets outside the domain (6)
GUARDS_FD_ENV = "MKB_GUARDS_FD"  # the parent's pipe for the guards line, closed before any code of the candidate's runs

_PR_SET_SECUREBITS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 28, 24, 47, 4
_CAPSET_NR = {"x86_64": 126, "aarch64": 91}


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> str:
    """Give up every capability for good, what this process starts included (a grader run as root would otherwise
    hand the sandbox CAP_SYS_NICE, CAP_MKNOD, CAP_BPF and the rest); '' when done, else what was left."""
    from mkb.grader._fs_guard import _libc

    libc = _libc()
    libc.prctl(ctypes.c_int(_PR_SET_SECUREBITS), ctypes.c_ulong(0x2F), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, all locked (fails without CAP_SETPCAP)
    for cap in range(64):
        libc.prctl(ctypes.c_int(_PR_CAPBSET_DROP), ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0))  # an execve (of nvcc, say) gains nothing back, root or not
    libc.prctl(ctypes.c_int(_PR_CAP_AMBIENT), ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), ctypes.c_ulong(0),
               ctypes.c_ulong(0), ctypes.c_ulong(0))
    nr = _CAPSET_NR.get(platform.machine())
    if nr is None:
        return f"no capset number for {platform.machine()}"
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    data = (_CapData * 2)()
    if libc.syscall(ctypes.c_long(nr), ctypes.byref(header), ctypes.byref(data)) != 0:
        return f"capset failed: {os.strerror(ctypes.get_errno())}"
    with open("/proc/self/status") as f:
        eff = next((line.split()[1] for line in f if line.startswith("CapEff:")), "?")
    return "" if eff.strip("0") == "" else f"capabilities left: CapEff {eff}"


def _confine(writable: list[Path], *, memory: int, sandbox: bool) -> tuple[str | None, str]:
    """Confine this process before anything of the candidate's runs: (the reason it could not, else None; the guards)."""
    from mkb.grader._fs_guard import confine_writes, landlock_abi
    from mkb.grader._syscall_guard import refuse_escapes

    abi = landlock_abi()
    if abi < MIN_LANDLOCK_ABI:
        return f"Landlock ABI {abi} here, {MIN_LANDLOCK_ABI} needed (truncate, device ioctls, signals outside)", ""
    for path, value in (("/proc/self/autogroup", "19"), ("/proc/self/oom_score_adj", "1000")):
        try:  # its own session's scheduling group the least share, and the first the OOM killer takes (before Landlock)
            with open(path, "w") as f:
                f.write(value)
        except OSError:
            pass
    try:
        os.nice(19)
    except OSError:
        pass
    for lim, value in ((resource.RLIMIT_CPU, SANDBOX_CPU_S), (resource.RLIMIT_AS, memory)):
        hard = resource.getrlimit(lim)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)  # never above a limit set from outside
        try:
            resource.setrlimit(lim, (value, value))
        except (ValueError, OSError) as exc:
            return f"limit {lim} not set: {exc}", ""
    left = _drop_capabilities()
    if left:
        return f"capabilities not dropped: {left}", ""
    fs = confine_writes(writable, device_ioctls=False)
    if not fs.confined:
        return f"writes not confined: {fs.note}", ""
    sc = refuse_escapes(sandbox=sandbox)
    if not sc.kept:
        return f"system calls not filtered: {sc.note}", ""
    return None, f"{fs.describe()}; device nodes and ioctls refused; no capabilities | {sc.describe()}"


def _report_guards(guards: str) -> None:
    """The guards line on the parent's own pipe, closed before the candidate's code runs (stdout it could forge)."""
    try:
        fd = int(os.environ.pop(GUARDS_FD_ENV, "-1"))
    except ValueError:
        return
    if fd < 0:
        return
    try:
        os.write(fd, guards.encode()[:2000])
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def _emit(payload: dict) -> None:
    sys.stdout.flush()
    print("MKB_PRECOMPILE " + json.dumps(payload), flush=True)


def sources(dsl: str, kernel: Path, problem: str, size: str, folder: Path) -> int:
    why, guards = _confine([folder], memory=SANDBOX_MEMORY, sandbox=True)
    _report_guards(guards)
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
    _emit({"sources": list(recorded)})
    return 0


def build(dsl: str, sources_json: Path, out: Path, gpu_arch: str) -> int:
    tmp = Path(os.environ.get("TMPDIR") or out)
    why, _ = _confine([out, tmp] if tmp != out else [out], memory=BUILDER_MEMORY, sandbox=False)
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
