"""A grader actor's kernel files (mkb.experiment._ray.GraderActorImpl._local): the actor grades up to 64 submissions
at once, and the same kernel written again must never be read half-written by a grading of it."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from mkb.experiment._ray import GraderActorImpl


@dataclass(frozen=True)
class _Job:
    kernel_path: Path | None = None


def test_the_same_kernel_written_again_is_never_read_truncated(tmp_path) -> None:
    actor = GraderActorImpl.__new__(GraderActorImpl)  # its files only: no grader is started
    actor.dir = tmp_path
    source = b"def solve(*inputs):\n    return inputs[0]\n" * 2000
    job = _Job()
    stop, seen = threading.Event(), []
    path = actor._local(job, source).kernel_path

    def writer() -> None:
        while not stop.is_set():
            assert actor._local(job, source).kernel_path == path  # named by its content: the same file each time

    def reader() -> None:
        for _ in range(3000):
            seen.append(len(path.read_bytes()))

    writers = [threading.Thread(target=writer) for _ in range(4)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in writers + readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    for t in writers:
        t.join()
    assert set(seen) == {len(source)}, f"{sum(n != len(source) for n in seen)} of {len(seen)} reads saw a partial kernel"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
