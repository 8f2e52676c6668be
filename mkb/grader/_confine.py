"""Says, before any worker starts, whether this host can confine a grading worker the way its config requires."""

from __future__ import annotations

import platform

from mkb.grader._config import GraderConfig
from mkb.grader._fs_guard import landlock_abi
from mkb.grader._syscall_guard import seccomp_unavailable


class ConfinementUnavailable(RuntimeError):
    """A config that requires a guard (`fs_guard` or `syscall_guard` "required") on a host that cannot give it: raised
    before any worker starts, so no grading (and no model submission) is spent on a host that cannot confine one."""


def require_confinement(cfg: GraderConfig) -> None:
    """Raise ConfinementUnavailable, naming every guard the config requires and this host lacks; else nothing."""
    missing = []
    if cfg.fs_guard == "required" and landlock_abi() < 1:
        missing.append(f"this kernel ({platform.release()}) has no Landlock, so a worker's writes cannot be confined")
    if cfg.syscall_guard == "required":
        why = seccomp_unavailable()
        if why:
            missing.append(f"the calls a candidate must not make cannot be refused ({why})")
    if missing:
        raise ConfinementUnavailable(
            "the grader's config requires confinement: " + "; ".join(missing) + "\nhint: grade on Linux >= 5.13 with "
            "landlock among its LSMs (lsm= on the kernel command line) and seccomp filters (x86_64 or aarch64), outside "
            "a container profile that blocks their syscalls; or grade without --confined (gpu rather than gpu:confined) "
            "and have each verdict say what was confined")
