"""The local executor's grader: one grading queue per GPU of the host, submissions spread across them, a pair batch on one."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future
from typing import Any


def _as_grader_job(job: Any) -> Any:
    """mkb.grader's GradeJob for any job with its fields (the agent may still submit its mirror class)."""
    from mkb.grader import GradeJob

    if isinstance(job, GradeJob):
        return job
    names = {f.name for f in dataclasses.fields(GradeJob)}
    return GradeJob(**{k: getattr(job, k) for k in names if hasattr(job, k)})


class LocalGpuGrader:
    """`GradingQueue`s on `devices` (default: every visible GPU). Submissions go to the least-loaded queue."""

    def __init__(self, *, store: Any = None, writer: Any = None, devices: list[str] | None = None, config: Any = None) -> None:
        from mkb.grader import GRADER_VERSION, GradingQueue

        if devices is None:
            import torch

            n = torch.cuda.device_count()
            if n == 0:
                raise RuntimeError("no GPU is visible to grade on\nhint: use --grader replay:events/replay-demo on a machine without one")
            devices = [f"cuda:{i}" for i in range(n)]
        self.queues = []
        try:
            for d in devices:  # two names of one GPU (cuda, cuda:0) are refused by the second queue, naming it
                self.queues.append(GradingQueue(device=d, store=store, writer=writer, config=config))
        except BaseException:
            for q in self.queues:  # the queues already open go with their workers, each whatever another's close raises
                try:
                    q.close()
                except Exception:  # noqa: BLE001 - the error that stopped the start is the one to raise
                    pass
            raise
        self.version = GRADER_VERSION
        self._load = [0] * len(self.queues)
        self._lock = threading.Lock()

    def _pick(self, n: int) -> int:
        with self._lock:
            i = min(range(len(self.queues)), key=lambda k: self._load[k])
            self._load[i] += n
        return i

    def _done(self, i: int, f: Future) -> None:
        with self._lock:
            self._load[i] -= 1

    def submit(self, job: Any) -> Future:
        i = self._pick(1)
        f = self.queues[i].submit(_as_grader_job(job))
        f.add_done_callback(lambda _f, i=i: self._done(i, _f))
        return f

    def submit_batch(self, jobs: list[Any]) -> list[Future]:
        i = self._pick(len(jobs))
        futs = self.queues[i].submit_batch([_as_grader_job(j) for j in jobs])
        for f in futs:
            f.add_done_callback(lambda _f, i=i: self._done(i, _f))
        return futs

    def close(self) -> None:
        for q in self.queues:
            q.close()
