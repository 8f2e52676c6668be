"""Refuses a grading worker's candidate the system calls that would let it outlive, leave or reach past its worker
(seccomp): a new session or process group, sockets, ptrace and its relatives, io_uring, any non-native ABI.

Why: the pool ends a worker with `killpg` on the session it was spawned in, and Landlock (mkb.grader._fs_guard) keeps
its writes in its scratch folder; each has a way around it that only a syscall filter closes.
- `setsid` / `setpgid`: a child that leaves the group outlives the grading's killpg, free to load the GPU through the
  next gradings' timing loops (slower, noisier figures for other kernels) or to hold device memory.
- `socket`: a service of the same user started on request over a named unix socket (a tmux or screen server, a user
  systemd, D-Bus activation, docker.sock) runs what the candidate asks outside the worker, unconfined and outside its
  group; below Landlock ABI 4 TCP reaches a Ray head or any local service the same way. A grading needs no socket
  (the result channel is a pipe; glibc's nscd lookups fall back when refused).
- `ptrace`, `process_vm_readv`/`writev`, `pidfd_getfd`: reaching into the grader or a spare worker (same user,
  unconfined) to run code there. Landlock refuses ptrace outside the domain only to the threads it confines.
- `io_uring_*`: its operations (IORING_OP_SOCKET among them) are not seen by a seccomp filter.
- A call through another ABI (i386's `int 0x80`, x32, arm compat): its numbers are another table; no code of a
  64-bit worker makes one.

The filter is installed with SECCOMP_FILTER_FLAG_TSYNC, so it holds for every thread of the worker, those started
before it included (unlike Landlock below ABI 8), and, inherited through fork and execve, for all they start. It is
installed right before the candidate's import: the worker's own start (`start_new_session`, made by the parent) and
its trusted phase come before it. Refused calls fail with EPERM. Not covered: signals to processes outside the worker
below Landlock ABI 6 (`kill` cannot be filtered by target), and a kernel without seccomp filters (recorded).
"""

from __future__ import annotations

import ctypes
import errno
import platform
from dataclasses import dataclass

from mkb.grader._fs_guard import _libc

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# classic BPF opcodes: load a word of struct seccomp_data (nr at 0, arch at 4), jump if equal / greater or equal, return
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_NR_OFFSET, _ARCH_OFFSET = 0, 4

# what is refused, by name (the record and the tests read the names)
REFUSED = ("setsid", "setpgid", "socket", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
           "io_uring_setup", "io_uring_enter", "io_uring_register")


# refused too where candidate code runs beside another grading's timing (mkb.grader._precompile's sandbox): making
# device nodes, privileged kernel programs and counters, priority and scheduling, and a file's metadata outside the
# write rights Landlock has (chmod, chown, utime, xattrs); by name, each where the arch has it
SANDBOX_REFUSED = ("mknod", "mknodat", "bpf", "perf_event_open", "sched_setscheduler", "sched_setattr", "setpriority",
                   "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime", "utimes",
                   "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
                   "fremovexattr", "setxattrat", "removexattrat")


@dataclass(frozen=True)
class _Arch:
    seccomp_nr: int  # the seccomp syscall's own number
    audit_arch: int  # AUDIT_ARCH_* of the native ABI
    numbers: dict[str, int]  # REFUSED's numbers in the native table
    refuse_at_or_above: int | None = None  # a numbering of another ABI inside the native arch (x32: bit 30)
    sandbox: dict[str, int] | None = None  # SANDBOX_REFUSED's numbers (the arch's own subset of them)


_ARCHES: dict[str, _Arch] = {
    "x86_64": _Arch(317, 0xC000003E, {"setsid": 112, "setpgid": 109, "socket": 41, "ptrace": 101,
                                      "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
                                      "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
                    refuse_at_or_above=_X32_BIT,
                    sandbox={"mknod": 133, "mknodat": 259, "bpf": 321, "perf_event_open": 298, "sched_setscheduler": 144,
                             "sched_setattr": 314, "setpriority": 141, "chmod": 90, "fchmod": 91, "fchmodat": 268,
                             "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260, "utime": 132,
                             "utimes": 235, "futimesat": 261, "utimensat": 280, "setxattr": 188, "lsetxattr": 189,
                             "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
                             "setxattrat": 463, "removexattrat": 466}),
    "aarch64": _Arch(277, 0xC00000B7, {"setsid": 157, "setpgid": 154, "socket": 198, "ptrace": 117,
                                       "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
                                       "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
                     sandbox={"mknodat": 33, "bpf": 280, "perf_event_open": 241, "sched_setscheduler": 119,
                              "sched_setattr": 274, "setpriority": 140, "fchmod": 52, "fchmodat": 53, "fchmodat2": 452,
                              "fchown": 55, "fchownat": 54, "utimensat": 88, "setxattr": 5, "lsetxattr": 6,
                              "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16,
                              "setxattrat": 463, "removexattrat": 466}),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


@dataclass(frozen=True)
class SyscallGuard:
    """Whether the calls in REFUSED were refused to the worker from the candidate's import on (recorded)."""

    kept: bool
    note: str = ""  # why not
    sandbox: bool = False  # SANDBOX_REFUSED refused too

    def describe(self) -> str:
        extra = " and the sandbox's (device nodes, bpf, perf, priority, file metadata)" if self.sandbox else ""
        return (f"seccomp: {', '.join(REFUSED)}{extra} and non-native ABIs refused to every thread and what it starts"
                if self.kept else f"not kept: {self.note}")


def program(machine: str, *, sandbox: bool = False) -> list[tuple[int, int, int, int]]:
    """The filter for a host of `machine` (platform.machine()): (code, jt, jf, k) rows; empty where mkb has no table.

    A call of another ABI than the native one is refused outright; a native call is refused if its number is one of
    REFUSED's (or, with `sandbox`, SANDBOX_REFUSED's; or in the x32 range), else allowed."""
    arch = _ARCHES.get(machine)
    if arch is None:
        return []
    numbers = {**arch.numbers, **((arch.sandbox or {}) if sandbox else {})}
    rows: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, _ARCH_OFFSET)]
    deny_at = [len(rows)]
    rows.append((_JEQ_K, 0, 0, arch.audit_arch))  # jf -> deny, jt -> on (0)
    rows.append((_LD_W_ABS, 0, 0, _NR_OFFSET))
    if arch.refuse_at_or_above is not None:
        deny_at.append(len(rows))
        rows.append((_JGE_K, 0, 0, arch.refuse_at_or_above))
    for nr in numbers.values():
        deny_at.append(len(rows))
        rows.append((_JEQ_K, 0, 0, nr))
    rows.append((_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    deny = len(rows)
    rows.append((_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM))
    for i in deny_at:
        code, _, _, k = rows[i]
        off = deny - i - 1
        if off > 255:  # classic BPF jumps are 8-bit
            raise ValueError(f"seccomp program too long to jump from row {i} to its EPERM return")
        # the arch test denies when it does NOT match; the others when they do
        rows[i] = (code, 0, off, k) if i == deny_at[0] else (code, off, 0, k)
    return rows


_SECCOMP_GET_ACTION_AVAIL = 2


def seccomp_unavailable() -> str | None:
    """Why the filter could not be installed on this host (None: it could), asked without installing anything."""
    machine = platform.machine()
    if machine not in _ARCHES:
        return f"no seccomp table for {machine or 'this machine'} (x86_64 and aarch64 have one)"
    try:
        libc = _libc()
    except OSError as exc:
        return f"no libc: {exc}"
    action = ctypes.c_uint32(_SECCOMP_RET_ERRNO)
    if libc.syscall(ctypes.c_long(_ARCHES[machine].seccomp_nr), ctypes.c_uint(_SECCOMP_GET_ACTION_AVAIL),
                    ctypes.c_uint(0), ctypes.byref(action)) != 0:
        e = ctypes.get_errno()
        return (f"seccomp filters unavailable: {errno.errorcode.get(e, e)} (a kernel without CONFIG_SECCOMP_FILTER, "
                "or a container that blocks seccomp)")
    return None


def refuse_escapes(*, sandbox: bool = False) -> SyscallGuard:
    """Install the filter on every thread of this process, for good; never raises. `sandbox`: SANDBOX_REFUSED too."""
    machine = platform.machine()
    rows = program(machine, sandbox=sandbox)
    if not rows:
        return SyscallGuard(False, f"no seccomp table for {machine or 'this machine'} (x86_64 and aarch64 have one)")
    try:
        libc = _libc()
    except OSError as exc:
        return SyscallGuard(False, f"no libc: {exc}")
    libc.prctl.restype = ctypes.c_int
    arr = (_SockFilter * len(rows))(*(_SockFilter(*r) for r in rows))
    prog = _SockFprog(len(rows), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))
    if libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        return SyscallGuard(False, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {errno.errorcode.get(ctypes.get_errno(), '?')}")
    rc = libc.syscall(ctypes.c_long(_ARCHES[machine].seccomp_nr), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if rc > 0:  # TSYNC names a thread it could not bring along (one with a filter of its own)
        return SyscallGuard(False, f"seccomp TSYNC: thread {rc} has a filter this one does not")
    if rc < 0:
        e = ctypes.get_errno()
        return SyscallGuard(False, f"seccomp(SET_MODE_FILTER) failed: {errno.errorcode.get(e, e)} "
                                   "(a kernel without CONFIG_SECCOMP_FILTER, or a container that blocks it)")
    return SyscallGuard(True, sandbox=sandbox)
