"""The local executor's grader: one grading queue per GPU of the host, submissions spread across them, a pair batch on one;
and the one reading of a `--grader` spec."""

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


GRADER_SPECS = ("gpu (this host's GPUs), gpu:confined (the same, refusing to grade where a worker cannot be confined: "
                "no Landlock or no seccomp), replay:DATASET (recorded verdicts) or none")


def grader_from_spec(spec: str, store: str | None) -> Any:
    """The grader a `--grader` spec names, built inside whatever process needs one (the local executor, a Ray actor).

    Raises ValueError for an unknown spec, ReplayError for a dataset that cannot be replayed, RuntimeError where this
    host cannot grade (no GPU; `gpu:confined` on a kernel without Landlock)."""
    if spec == "none":
        return None
    if spec.startswith("replay:"):
        from mkb.experiment._replay import ReplayGrader

        return ReplayGrader.load(spec.split(":", 1)[1], store=store)
    if spec in ("gpu", "gpu:confined"):
        config = None
        if spec == "gpu:confined":
            from mkb.grader import GraderConfig

            config = GraderConfig(fs_guard="required", syscall_guard="required")
        return LocalGpuGrader(store=store, config=config)
    raise ValueError(f"--grader {spec!r}: expected {GRADER_SPECS}")


class LocalGpuGrader:
    """`GradingQueue`s on `devices` (default: every visible GPU). Submissions go to the least-loaded queue."""

    def __init__(self, *, store: Any = None, writer: Any = None, devices: list[str] | None = None, config: Any = None) -> None:
        from mkb.grader import GRADER_VERSION, GradingQueue

        if config is not None:  # a host that cannot confine as required is refused here, before a GPU or a queue
            from mkb.grader._confine import require_confinement

            require_confinement(config)
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
