"""Ending a child's whole group (mkb._procs): what every worker, fork, tool command and external agent is ended by."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from mkb._procs import kill_group, signal_group


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _group_with_a_grandchild() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                             "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    return proc, int(proc.stdout.readline())


def test_kill_group_ends_the_leader_and_what_it_started_and_reaps_the_leader() -> None:
    proc, grandchild = _group_with_a_grandchild()
    assert _alive(grandchild)
    kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(grandchild)
    kill_group(proc)  # gone is fine
    proc.stdout.close()


def test_signal_group_pauses_and_resumes_the_group_and_falls_back_to_the_process_only_when_asked() -> None:
    proc, grandchild = _group_with_a_grandchild()
    try:
        signal_group(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and open(f"/proc/{grandchild}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.02)
        assert open(f"/proc/{grandchild}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
        signal_group(proc.pid, signal.SIGCONT)
    finally:
        kill_group(proc)
        proc.stdout.close()
    # a child in our own group leads none: only or_process reaches it (a fork killed before its own setsid)
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.getpgid(lone.pid) != lone.pid
        signal_group(lone.pid, signal.SIGKILL)
        time.sleep(0.3)
        assert lone.poll() is None
        signal_group(lone.pid, signal.SIGKILL, or_process=True)
        assert lone.wait(timeout=10) == -signal.SIGKILL
    finally:
        lone.kill()
        lone.wait()
