"""A one-GPU grading queue for a local attempt: mkb.grader.grade on a warm worker pool, one kernel at a time.

The experiment uses mkb.grader's GradingQueue; this adapter lets `mkb-run attempt` and the GPU demo
grade through the same `Grader` protocol where that queue is not available.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mkb.agent._types import GradeJob
from mkb.grader import Verdict


@dataclass(frozen=True)
class QueuedVerdict(Verdict):
    """A Verdict with the time it waited in this queue (mkb.grader's Verdict gains the same field)."""

    queue_wait_s: float = 0.0


def queue_class():
    """mkb.grader.GradingQueue when it exists (the experiment's queue), else None."""
    try:
        from mkb.grader import GradingQueue  # type: ignore[attr-defined]
    except ImportError:
        return None
    return GradingQueue


class LocalGrader:
    """Grades jobs in submission order on one warm WorkerPool; `submit` returns at once with a Future."""

    def __init__(self, *, writer: Any = None, config: Any = None, dsls: tuple[str, ...] = ("cute", "tirx"), device: str = "cuda") -> None:
        self.writer = writer
        self.config = config
        self.dsls = dsls
        self.device = device
        self.pool = None  # started at the first submission: an attempt that never submits never starts GPU workers
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mkb-grade")

    def submit(self, job: GradeJob) -> "Future[Verdict]":
        queued = time.monotonic()
        return self._exec.submit(self._grade, job, queued)

    def _grade(self, job: GradeJob, queued: float) -> Verdict:
        from dataclasses import asdict

        from mkb.grader import StageResult, grade

        wait = time.monotonic() - queued
        if self.pool is None:
            from mkb.grader import WorkerPool

            self.pool = WorkerPool(self.dsls, device=self.device)
        v = grade(job.problem, job.dsl, job.kernel_path, writer=self.writer, config=self.config, pool=self.pool, scope=job.scope,
                  attempt_id=job.attempt_id)
        d = {k: getattr(v, k) for k in Verdict.__dataclass_fields__}
        d["stages"] = tuple(s if isinstance(s, StageResult) else StageResult(**asdict(s)) for s in v.stages)
        return QueuedVerdict(**d, queue_wait_s=wait)

    def close(self) -> None:
        self._exec.shutdown(wait=True)
        if self.pool is not None:
            self.pool.close()
