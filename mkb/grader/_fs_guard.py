"""Keeps a grading worker from writing anywhere but its own scratch folder once candidate code may run (Landlock).

Why: the worker runs the candidate as the grader's own user, so without this a kernel (its static forms caught, its
obfuscated ones not) could write the event store (a forged verdict file), the grader's source or a DSL's shared
compile cache (another candidate's kernel replaced at its next compile). pygpubench confines its kernels the same way
(Landlock, the filesystem read-only but for scratch; anchors-bench). Reads, execution and device ioctls stay as they
were: the rights restricted are only the ones that create, change or remove a file. Landlock also refuses ptrace of a
process outside the domain; with ABI 4 no TCP bind or connect is allowed (a worker needs no network), and with ABI 6
the worker is kept from signalling a process outside it (killing its parent or a spare) and from its abstract unix
sockets. The worker's inherited file descriptors (its result channel, its log) keep working: Landlock checks opens,
not writes to what is open; RLIMIT_FSIZE caps every file it writes, those included, at 1 GiB.

The restriction is for good, so it is applied once, after the trusted phase and right before the candidate is first
imported, on the thread that imports and calls it. From ABI 8 (Linux 7.0) it reaches every thread of the process
(LANDLOCK_RESTRICT_SELF_TSYNC); below, only the calling thread and what it starts (threads, nvcc, ptxas): threads
that already exist (the CUDA driver's, the profiler's; recorded as `threads_before`) stay unconfined there, and code
a candidate gets run on one of them (a host callback on the driver's thread) writes unconfined. Closing that on older
kernels means confining before the worker's first thread, at its start, under the CUDA and DSL imports: to be run on
a GPU first. Also not covered: a file's metadata (chmod, utime, xattrs) and
connecting to a named unix socket (Landlock has no right for them). Where the kernel has no Landlock (Linux < 5.13,
or it is not enabled) the grading goes on and its figures say the writes were not confined (`CompileFigures.fs_guard`).
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# the Landlock syscalls have one number on every architecture (they came after the table was unified)
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

SCRATCH_ENV = "MKB_WORKER_SCRATCH"  # the worker's own folder (made by the parent, removed when the worker is reaped)
READ_GUARD_ENV = "MKB_READ_GUARD"  # "landlock": a precompile fork confines its reads too (GraderConfig.read_guard)

# LANDLOCK_ACCESS_FS_* that create, change or remove a file, by the ABI version that introduced them
_WRITE_FILE = 1 << 1
_WRITES_V1 = _WRITE_FILE | sum(1 << b for b in range(4, 13))  # REMOVE_DIR .. MAKE_SYM
_REFER = 1 << 13  # ABI 2: link or rename across folders
_TRUNCATE = 1 << 14  # ABI 3
_RESTRICT_SELF_TSYNC = 1 << 3  # ABI 8: landlock_restrict_self applies to every thread of the process
_IOCTL_DEV = 1 << 15  # ABI 5: ioctl on a device file (every call of the GPU driver is one)
_READ_FILE = 1 << 2
_READS = _READ_FILE | (1 << 3)  # READ_FILE, READ_DIR (ABI 1): handled only where reads are confined too (`readable`)
# what a grading process reads besides its Python and its own folders: the system's programs, libraries and devices,
# and of /etc only what the loader, the C library and the toolchain read (the agent's sandbox's list, which its
# compile-only check runs in, with the user database) (GraderConfig.read_guard); left out are the users' homes, /root,
# /tmp (other workers' scratch), /run (container secrets, agent sockets), the rest of /etc (a root grader could read
# /etc/shadow, host keys), /mnt, /srv, /var and whatever else a host keeps its people's files in
SYSTEM_READABLE = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/opt", "/proc", "/sys", "/dev",
                   "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl",
                   "/etc/ca-certificates", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
                   "/etc/os-release")
_MAKE_DEVICES = (1 << 6) | (1 << 11)  # MAKE_CHAR, MAKE_BLOCK: a device node made in a writable folder reaches its driver


def _writes(abi: int) -> int:
    return _WRITES_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)


_SCOPE_ABSTRACT_UNIX = 1 << 0  # ABI 6: no connecting to an abstract unix socket outside the domain
_SCOPE_SIGNAL = 1 << 1  # ABI 6: no signal to a process outside the domain (the parent, another worker)
_NET_TCP = (1 << 0) | (1 << 1)  # ABI 4: bind and connect TCP (no rule allows any: a worker needs no network)
FSIZE_MAX = 1 << 30  # RLIMIT_FSIZE once confined: no file it writes grows past 1 GiB (its inherited log included)


class _RulesetAttr(ctypes.Structure):
    """struct landlock_ruleset_attr; a kernel reads only the fields its ABI knows, so the size passed is cut to them
    (`_ruleset_size`): handled_access_net came with ABI 4, scoped with ABI 6."""

    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def _ruleset_size(abi: int) -> int:
    return 8 * (3 if abi >= 6 else 2 if abi >= 4 else 1)


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class FsGuard:
    """What the worker's process may write from the candidate's import on (recorded on the verdict)."""

    confined: bool
    abi: int  # the kernel's Landlock ABI version (0: none)
    writable: tuple[str, ...]  # folders beneath which writes stay allowed (empty when not confined)
    note: str = ""  # why it is not confined, or what of it is missing
    threads_before: int = 0  # the process's other threads when it was confined
    all_threads: bool = False  # whether those were confined too (ABI >= 8, TSYNC); below, Landlock does not reach them
    readable: tuple[str, ...] | None = None  # where reads were confined too: the folders beneath which they stay allowed

    @property
    def signals_scoped(self) -> bool:
        """Whether signals to processes outside the worker (its parent, other workers) are refused too (ABI >= 6)."""
        return self.confined and self.abi >= 6

    def describe(self) -> str:
        if self.confined:
            return (f"landlock abi {self.abi}: the candidate's thread and what it starts write only beneath "
                    f"{', '.join(self.writable)}" + ("; no TCP" if self.abi >= 4 else "")
                    + ("; no signals or abstract sockets outside" if self.signals_scoped else "")
                    + ("; truncate not controlled (abi < 3)" if self.abi < 3 else "")
                    + (f"; reads only beneath {len(self.readable)} system, Python and own folders"
                       if self.readable is not None else "")
                    + (f"; the {self.threads_before} threads started before too" if self.all_threads
                       else f"; {self.threads_before} threads started before not confined")
                    + (f"; {self.note}" if self.note else ""))
        return f"not confined: {self.note}"


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long  # a file descriptor or -1; the default c_int would do, the type says it
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (not Linux, too old, or not enabled)."""
    try:
        libc = _libc()
        v = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(v))


def restrict_flags(abi: int) -> int:
    """landlock_restrict_self's flags for a kernel of `abi`: every thread where the kernel can (ABI >= 8)."""
    return _RESTRICT_SELF_TSYNC if abi >= 8 else 0


def default_readable(own: Sequence[Path] = ()) -> list[Path]:
    """What a grading process may read when reads are confined: SYSTEM_READABLE, this Python (its prefixes, its
    executable's folder, every folder on sys.path: the DSLs and torch, wherever installed), mkb's own checkout or
    install, the CUDA toolkit the environment names, and `own` (folders, or single files: the kernel); each that
    exists, with its real path where a link (a single file gets only its read right)."""
    import sys

    names: list[str] = [*SYSTEM_READABLE, sys.prefix, sys.base_prefix, sys.exec_prefix,
                        os.path.dirname(os.path.realpath(sys.executable)), str(Path(__file__).resolve().parents[2]),
                        *(p for p in sys.path if p), *(os.environ.get(k, "") for k in ("CUDA_PATH", "CUDA_HOME")),
                        *(str(p) for p in own)]
    out: list[Path] = []
    for n in names:
        for p in (n, os.path.realpath(n)) if n else ():
            if os.path.exists(p) and Path(p) not in out:  # a folder, or a single file (the kernel, /etc/passwd)
                out.append(Path(p))
    return out


def confine_writes(writable: list[Path] | tuple[Path, ...], *, device_ioctls: bool = True,
                   readable: Sequence[Path] | None = None) -> FsGuard:
    """Restrict this process (and what it starts) to writing beneath `writable` from now on; never raises.

    Each folder in `writable` that exists gets every write right; a missing one is skipped (named in the note).
    `device_ioctls=False` (a process that must not reach the GPU: mkb.grader._precompile's sandbox) also refuses ioctl
    on any device file where the kernel can (ABI >= 5) and making a device node even beneath `writable`; the device
    files' write access is refused at every ABI. `readable` (GraderConfig.read_guard): reads too are confined, to
    beneath those folders and `writable` (`default_readable`): a kernel cannot read a user's credentials
    (~/.aws, ~/.ssh, ~/.netrc) to print them into the events of its grading."""
    abi = landlock_abi()
    if abi < 1:
        return FsGuard(False, 0, (), "no Landlock here (Linux >= 5.13 with landlock among its LSMs; a container's "
                                     "seccomp profile may block its syscalls)")
    libc = _libc()
    handled = _writes(abi) | (_IOCTL_DEV if not device_ioctls and abi >= 5 else 0) | (_READS if readable is not None else 0)
    # what the writable folders allow: every handled right, but without device ioctls not a device node made there
    # (a node of the GPU's major number in the sandbox's own folder would reach the driver) nor ioctl beneath them
    granted = handled & ~(_MAKE_DEVICES | _IOCTL_DEV) if not device_ioctls else handled
    attr = _RulesetAttr(handled, _NET_TCP if abi >= 4 else 0, (_SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX) if abi >= 6 else 0)
    threads_before = _threads() - 1
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(_ruleset_size(abi)),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return FsGuard(False, abi, (), f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    kept: list[str] = []
    skipped: list[str] = []
    read_kept: list[str] = []
    try:
        # every folder that exists gets its rights (a single file, the kernel, its file's read right only); one that
        # does not is named (writable) or simply not readable (default_readable lists only what exists)
        for paths, rights, into, missing in ((writable, granted, kept, skipped), (readable or (), _READS, read_kept, None)):
            for folder in paths:
                is_dir = os.path.isdir(folder)
                try:
                    fd = os.open(str(folder), os.O_PATH | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir or missing is not None else 0))
                except OSError:
                    if missing is not None:
                        missing.append(str(folder))
                    continue
                try:
                    rule = _PathBeneathAttr(rights if is_dir else rights & _READ_FILE, fd)
                    if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                    ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                        return FsGuard(False, abi, (), f"landlock_add_rule({folder}) failed: {os.strerror(ctypes.get_errno())}")
                    into.append(str(folder))
                finally:
                    os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return FsGuard(False, abi, (), f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        flags = restrict_flags(abi)
        if flags and libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(flags)) < 0:
            tsync_error = os.strerror(ctypes.get_errno())  # then the calling thread alone, as below ABI 8, and said
            flags = 0
        else:
            tsync_error = ""
        if not flags and libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            return FsGuard(False, abi, (), f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    note = "; ".join(x for x in (f"missing, not writable: {', '.join(skipped)}" if skipped else "",
                                 f"all-threads restriction (TSYNC) failed: {tsync_error}" if tsync_error else "") if x)
    try:  # inherited descriptors too: a candidate may not fill the disk through its log
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_MAX, FSIZE_MAX))
    except (ValueError, OSError) as exc:
        note = "; ".join(x for x in (note, f"RLIMIT_FSIZE not set: {exc}") if x)
    return FsGuard(True, abi, tuple(kept), note, threads_before, all_threads=bool(flags),
                   readable=tuple(read_kept) if readable is not None else None)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1
