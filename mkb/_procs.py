"""Ends or pauses a child's whole process group (each child mkb starts leads a session or group of its own).

Why one place: a grading worker, a precompile fork, a torch.compile worker, an agent's tool command and an external
agent each start their own session so that nothing they start outlives them; all are ended the same way, by
signalling the group, where the child may already have gone (or not yet have started its group).
"""

from __future__ import annotations

import os
import signal
import subprocess


def signal_group(pid: int, sig: int, *, or_process: bool = False) -> None:
    """`sig` to the group `pid` leads; gone is fine. `or_process`: where there is no such group (a child killed
    before its own setsid), `sig` to the process itself."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError):
        if not or_process:
            return
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(proc: subprocess.Popen, *, wait_s: float = 10.0) -> None:
    """SIGKILL to the group `proc` leads, then reap `proc` (within `wait_s`; a process stuck in the kernel is left).
    Once `proc` has been reaped its pid may lead someone else's new group (a fresh worker's): it is not signalled."""
    if proc.returncode is None:
        signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass
