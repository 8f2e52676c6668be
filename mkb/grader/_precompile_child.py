"""The processes of a precompile (mkb.grader._precompile): the sandbox that records a kernel's device sources, the
trusted builder that compiles them, and the fork server both are forked from.

    python -m mkb.grader._precompile_child serve <dsl>
    python -m mkb.grader._precompile_child sources <dsl> <kernel.py> <problem> <size> <folder>
    python -m mkb.grader._precompile_child build <dsl> <sources.json> <out folder> <gpu arch>

A precompiler runs one fork server per DSL (`serve`): it imports torch, the DSL and the problems once, with no GPU
visible, runs no candidate code, and forks a sandbox or builder per request. Each fork starts its own session and is
confined exactly as the one-shot `sources` and `build` (kept for running one by hand) confine themselves, before any
candidate code runs; since a fork has one thread, the confinement reaches every thread it will have. Importing first
is what the server saves: 10-15 s of torch and TVM per sandbox on the slower H200 hosts.

The sandbox runs the candidate's code beside another grading's timing, so before any of it runs it confines itself:
the lowest priority and first in line for the OOM killer, CPU-time and address-space limits, no capabilities (a
grader run as root would hand it CAP_SYS_NICE, CAP_MKNOD, CAP_BPF), writes only beneath its own folder with no device
node made there and no device ioctl anywhere (Landlock >= 6; so it cannot reach the GPU, nor write the builder's
output), the grader's seccomp filter with the sandbox's extra calls (device nodes, bpf, perf, scheduling, file
metadata). Where it cannot, it runs nothing (exit 3). It reports its guards on the fork server's pipe and closes it
before the candidate's import (run by hand, it reports them nowhere); it prints `MKB_PRECOMPILE {"sources": [...]}` as its last stdout line. The builder
runs no candidate code but compiles the sources the sandbox printed, so it is confined the same way to its own
folders (with the worker's seccomp filter: nvcc's toolchain may set a file's mode); it prints
`MKB_PRECOMPILE {"keys": [...]}`.

The server's protocol, one JSON object per line: it prints `{"ready": ...}` once imported; it reads
`{"id", "mode", "args", "env", "stdout", "stderr"}` requests; for each it answers `{"id", "pid", "guards"}` once the
fork has confined itself (or failed to) and `{"id", "exit"}` when it has ended. At the end of its input it kills every
fork's session and exits.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import platform
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from mkb._procs import signal_group

SANDBOX_CPU_S = 120  # CPU seconds: a sandbox imports torch and the DSL and traces one solve
SANDBOX_MEMORY = 32 << 30  # address space: torch and the DSL imported, one solve traced on CPU inputs
BUILDER_MEMORY = 16 << 30  # address space of the builder and the nvcc it runs (a hostile source cannot grow it past)
NOT_CONFINED = 3  # exit status: no Landlock here (or too old a one), nothing run
MIN_LANDLOCK_ABI = 6  # truncate (3), device ioctls (5), signals and abstract sockets outside the domain (6)

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


def _lowest_priority() -> None:
    """Its own session's scheduling group the least share, itself the lowest priority and the first the OOM killer
    takes: what runs here waits for a grading's own CPU work (before Landlock, which would refuse the writes)."""
    for path, value in (("/proc/self/autogroup", "19"), ("/proc/self/oom_score_adj", "1000")):
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError:
            pass
    try:
        os.nice(19 - os.nice(0))
    except OSError:
        pass


def _confine(writable: list[Path], *, memory: int, sandbox: bool, reads: tuple[Path, ...] = ()) -> tuple[str | None, str]:
    """Confine this process before anything of the candidate's runs: (the reason it could not, else None; the guards)."""
    from mkb.grader._fs_guard import READ_GUARD_ENV, confine_writes, default_readable, landlock_abi
    from mkb.grader._syscall_guard import refuse_escapes

    abi = landlock_abi()
    if abi < MIN_LANDLOCK_ABI:
        return f"Landlock ABI {abi} here, {MIN_LANDLOCK_ABI} needed (truncate, device ioctls, signals outside)", ""
    _lowest_priority()
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
    readable = default_readable([*writable, *reads]) if os.environ.get(READ_GUARD_ENV) == "landlock" else None
    fs = confine_writes(writable, device_ioctls=False, readable=readable)
    if not fs.confined:
        return f"writes not confined: {fs.note}", ""
    sc = refuse_escapes(sandbox=sandbox)
    if not sc.kept:
        return f"system calls not filtered: {sc.note}", ""
    return None, f"{fs.describe()}; device nodes and ioctls refused; no capabilities | {sc.describe()}"


def _report_guards(guards: str, fd: int) -> None:
    """The guards line on the parent's own pipe, closed before the candidate's code runs (stdout it could forge)."""
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


def sources(dsl: str, kernel: Path, problem: str, size: str, folder: Path, *, guards_fd: int) -> int:
    why, guards = _confine([folder], memory=SANDBOX_MEMORY, sandbox=True, reads=(kernel.resolve(),))
    _report_guards(guards, guards_fd)
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


def build(dsl: str, sources_json: Path, out: Path, gpu_arch: str, *, guards_fd: int) -> int:
    tmp = Path(os.environ.get("TMPDIR") or out)
    why, guards = _confine([out, tmp] if tmp != out else [out], memory=BUILDER_MEMORY, sandbox=False,
                           reads=(sources_json.resolve(),))
    _report_guards(guards, guards_fd)
    if why is not None:
        _emit({"error": why})
        return NOT_CONFINED
    from mkb.dsl import get_backend

    srcs = json.loads(sources_json.read_text())
    keys = get_backend(dsl).build_device_code(list(srcs), out, gpu_arch=gpu_arch)
    _emit({"keys": keys})
    return 0


# ---------------- the fork server ----------------

GUARDS_WAIT_S = 30.0  # a fork that has not confined itself (nor failed to) by then is killed


def _run_mode(mode: str, args: list[str], guards_fd: int) -> int:
    if mode == "sources" and len(args) == 5:
        return sources(args[0], Path(args[1]), args[2], args[3], Path(args[4]), guards_fd=guards_fd)
    if mode == "build" and len(args) == 4:
        return build(args[0], Path(args[1]), Path(args[2]), args[3], guards_fd=guards_fd)
    print(f"no such request: {mode} {args}", file=sys.stderr)
    return 2


def _send(message: dict) -> None:
    """One line to the precompiler (fd 1; one write below PIPE_BUF for a line this short, so never torn)."""
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def _fork(req: dict) -> tuple[int, str]:
    """Fork one sandbox or builder for `req`: (its pid, the guards line it reported once confined)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: never returns
        rc = 1
        try:
            os.close(r)
            os.setsid()  # its own session, which the precompiler kills whole (and a new autogroup for _confine)
            _PR_SET_PDEATHSIG = 1
            from mkb.grader._fs_guard import _libc

            _libc().prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                          ctypes.c_ulong(0), ctypes.c_ulong(0))  # gone with the server
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            for fd, target in ((null, 0), (out, 1), (err, 2)):  # the server's own pipes are 0 and 1: none left here
                os.dup2(fd, target)
                os.close(fd)
            for k, v in dict(req.get("env") or {}).items():
                os.environ[str(k)] = str(v)
            tempfile.tempdir = None  # TMPDIR is the job's folder now
            rc = _run_mode(str(req["mode"]), [str(a) for a in req["args"]], w)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - the candidate's error, on the fork's own stderr
            traceback.print_exc()
            rc = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc)
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + GUARDS_WAIT_S
    closed = False  # the fork closed its end: confined (or failed to be, and runs nothing)
    try:
        while not closed and sum(map(len, chunks)) <= 4000:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                break
            b = os.read(r, 4096)
            closed = not b
            chunks.append(b)
    finally:
        os.close(r)
    if not closed:
        _kill(pid)
    return pid, b"".join(chunks).decode(errors="replace")[:2000]


def _kill(pid: int) -> None:
    """A fork's session, or the fork itself where it has not started its session yet."""
    signal_group(pid, signal.SIGKILL, or_process=True)


def serve(dsl: str) -> int:
    """Import once, then fork a confined sandbox or builder per request (module docstring: the protocol)."""
    t0 = time.monotonic()
    _lowest_priority()  # its imports are background work too
    from mkb.dsl import get_backend
    import mkb.problems  # noqa: F401 - each sandbox loads its problem from here

    backend = get_backend(dsl)
    for name in backend.import_modules:
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    _send({"ready": True, "seconds": round(time.monotonic() - t0, 3), "threads": threads, "pid": os.getpid()})
    children: dict[int, object] = {}
    buf = b""
    while True:
        while children:  # reap what has ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send({"id": children.pop(pid, None), "exit": os.waitstatus_to_exitcode(status)})
        ready, _, _ = select.select([0], [], [], 0.02 if children else 1.0)
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:  # the precompiler has gone: nothing of ours outlives it
            for pid in children:
                _kill(pid)
            return 0
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = None
            try:
                req = json.loads(line)
                pid, guards = _fork(req)
            except Exception as exc:  # noqa: BLE001 - a bad request fails that request, never the server
                _send({"id": req.get("id") if isinstance(req, dict) else None, "error": f"{type(exc).__name__}: {exc}"})
                continue
            children[pid] = req.get("id")
            _send({"id": req.get("id"), "pid": pid, "guards": guards})


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 2:
        return serve(argv[1])
    if argv[:1] in (["sources"], ["build"]):
        return _run_mode(argv[0], argv[1:], -1)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
