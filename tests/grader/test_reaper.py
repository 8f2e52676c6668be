"""Workers killed without waiting are reaped by the one reaper thread: their folders go once they are gone, a worker
killed twice is reaped once, and one still alive past the limit loses its folder without being recorded as reaped."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from mkb.grader import _pool
from mkb.grader._pool import Worker


class _Quiet:
    """The quiet rule's recorder, as a list (what kill and reap note)."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def forget(self, w: Worker) -> None:
        pass

    def note(self, event: str, pid: int) -> None:
        self.notes.append(event)


def _worker(tmp_path: Path, *, own_group: bool = True, name: str = "w") -> Worker:
    """A Worker around `sleep 30` (no worker process): the kill and reap paths only."""
    w = Worker.__new__(Worker)
    w.proc = subprocess.Popen(["sleep", "30"], start_new_session=own_group)
    w.scratch = str(tmp_path / name)
    os.mkdir(w.scratch)
    w.go_at, w.quiet, w._reaped, w._reaped_in_background = 1.0, _Quiet(), False, False
    w._state_lock, w._reap_done = threading.Lock(), threading.Event()
    w._watcher = threading.Thread(target=lambda: None)
    w._watcher.start()
    w._watcher.join()
    w._job_w, w._res_r = os.pipe()
    return w


def test_a_worker_killed_without_waiting_then_with_is_reaped_once(tmp_path):
    w = _worker(tmp_path)
    assert w.kill(wait=False) is None
    assert w.kill() == -9 and not Path(w.scratch).exists()
    assert _pool._REAPER.join(10)
    assert w.quiet.notes.count("reaped") == 1 and w.quiet.notes[0] == "teardown"


def test_a_worker_alive_past_the_limit_loses_its_folder_and_is_not_recorded_reaped(tmp_path, monkeypatch):
    monkeypatch.setattr(_pool, "REAP_LIMIT_S", 0.3)
    w = _worker(tmp_path, own_group=False, name="stuck")  # killpg finds no group of its own: it outlives the kill
    try:
        w.kill(wait=False)
        assert _pool._REAPER.join(10)
        assert w.proc.poll() is None and not Path(w.scratch).exists()
        assert w.quiet.notes == ["teardown"]  # its teardown stays in the record
    finally:
        w.proc.kill()
        w.proc.wait()


def test_a_reaped_worker_is_not_signalled_again(tmp_path, monkeypatch):
    w = _worker(tmp_path)
    assert w.kill() == -9
    sent: list[int] = []
    monkeypatch.setattr(_pool, "signal_group", lambda pid, sig, **k: sent.append(pid))
    assert w.kill() == -9 and sent == []  # its pid may lead another worker's group by now
