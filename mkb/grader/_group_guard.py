"""Keeps every process a grading worker's candidate starts inside the worker's process group (seccomp), so that killing
the group ends them all.

Why: the pool ends a worker with `killpg` (its own session, made at spawn). A candidate's child that calls `setsid` or
`setpgid` leaves the group and outlives the grading: a process that keeps the GPU busy through the next gradings'
timing loops (slower, noisier figures for other kernels, perhaps another model's), or that holds device memory, with
nothing in the record to say so. A seccomp filter makes both calls fail with EPERM for the worker's threads (every
one of them: SECCOMP_FILTER_FLAG_TSYNC reaches threads that already exist, unlike Landlock below ABI 8) and, by
inheritance, for everything they start, including through execve. The worker's own start (`start_new_session`) is
made by the parent before the filter exists; nothing of a grading after it needs a new group or session.

Only the two calls are filtered, for the native architecture and its compat one (x86_64 with i386 and x32, aarch64
with arm): a foreign-architecture call cannot be made on any other host. Not covered: asking a service outside the
worker to start a process (a user systemd or an `at` daemon over a named socket; a GPU host's container has
neither), which Landlock's scope does not reach either.
"""

from __future__ import annotations

import ctypes
import errno
import platform
from dataclasses import dataclass

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# classic BPF opcodes: load a word of struct seccomp_data (nr at 0, arch at 4), jump if equal, return
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_NR_OFFSET, _ARCH_OFFSET = 0, 4

# per host architecture: seccomp's own syscall number, then (AUDIT_ARCH_*, [setsid, setpgid]) for each ABI a process
# there can call in
_ARCHES: dict[str, tuple[int, tuple[tuple[int, tuple[int, ...]], ...]]] = {
    "x86_64": (317, ((0xC000003E, (112, 109, _X32_BIT | 112, _X32_BIT | 109)),  # x86_64, x32 (same arch, bit 30)
                     (0x40000003, (66, 57)))),  # i386 (int 0x80)
    "aarch64": (277, ((0xC00000B7, (157, 154)),  # aarch64
                      (0x40000028, (66, 57)))),  # arm (compat)
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


@dataclass(frozen=True)
class GroupGuard:
    """Whether the worker's processes can leave its process group from the candidate's import on (recorded)."""

    kept: bool
    note: str = ""  # why not

    def describe(self) -> str:
        return ("seccomp: setsid and setpgid refused to every thread and what it starts" if self.kept
                else f"not kept: {self.note}")


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for a host of `machine` (platform.machine()): (code, jt, jf, k) rows; empty where mkb has no table.

    One block per architecture the host can run: if the arch matches, load the call's number and jump to the
    EPERM return for each filtered number, else allow; an arch none of the blocks name is allowed (none exists)."""
    if machine not in _ARCHES:
        return []
    rows: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, _ARCH_OFFSET)]
    blocks = _ARCHES[machine][1]
    deny_at: list[int] = []  # rows whose jt must reach the final EPERM return
    for arch, numbers in blocks:
        block_len = 1 + len(numbers) + 1  # load nr, one test per number, allow
        rows.append((_JEQ_K, 0, block_len, arch))  # not this arch: skip the block
        rows.append((_LD_W_ABS, 0, 0, _NR_OFFSET))
        for nr in numbers:
            deny_at.append(len(rows))
            rows.append((_JEQ_K, 0, 0, nr))
        rows.append((_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    rows.append((_RET_K, 0, 0, _SECCOMP_RET_ALLOW))  # an arch no block names
    deny = len(rows)
    rows.append((_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM))
    for i in deny_at:
        code, _, jf, k = rows[i]
        jt = deny - i - 1
        if jt > 255:  # classic BPF jumps are 8-bit: the table would have to be reshaped
            raise ValueError(f"seccomp program too long to jump from row {i} to its EPERM return")
        rows[i] = (code, jt, jf, k)
    return rows


def keep_in_group() -> GroupGuard:
    """Refuse setsid and setpgid to every thread of this process and what it starts, for good; never raises."""
    machine = platform.machine()
    rows = program(machine)
    if not rows:
        return GroupGuard(False, f"no seccomp table for {machine or 'this machine'} (x86_64 and aarch64 have one)")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return GroupGuard(False, f"no libc: {exc}")
    arr = (_SockFilter * len(rows))(*(_SockFilter(*r) for r in rows))
    prog = _SockFprog(len(rows), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return GroupGuard(False, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {errno.errorcode.get(ctypes.get_errno(), '?')}")
    rc = libc.syscall(_ARCHES[machine][0], ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if rc > 0:  # TSYNC names a thread it could not bring along (one with a filter of its own)
        return GroupGuard(False, f"seccomp TSYNC: thread {rc} has a filter this one does not")
    if rc < 0:
        e = ctypes.get_errno()
        return GroupGuard(False, f"seccomp(SET_MODE_FILTER) failed: {errno.errorcode.get(e, e)} "
                                 "(a kernel without CONFIG_SECCOMP_FILTER, or a container that blocks it)")
    return GroupGuard(True)
