"""The Ray executor: the same plan and claims, with agent attempts as Ray tasks on CPUs and one grader actor per GPU.

The driver runs the local executor's scheduling loop unchanged; only where an attempt runs and where its gradings go
differ. Every task and actor reads and writes the one store (shared storage: a path every node mounts, or s3://, gs://),
and claims still go through the store's Lease, so two drivers, or a driver restarted after a crash, are safe. A model's
rpm/tpm hold for the whole cluster: one pacing actor per (model, api_base) books every worker's requests.
"""

from __future__ import annotations

import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mkb.experiment._executor import Executor, RunReport, Runner
from mkb.experiment._graders import grader_from_spec
from mkb.experiment._plan import Coordinate, Plan
from mkb.experiment._ray_pace import check_pacers, ray_limiters, start_pacers


def _ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray executor needs ray\nhint: pip install 'mkb[ray]'") from None
    return ray


class GraderActorImpl:
    """One per GPU: owns that GPU's grading queue. Kernels arrive as bytes (the attempt ran on another node)."""

    def __init__(self, spec: str, store: str | None) -> None:
        self.grader = grader_from_spec(spec, store)  # in an actor: the one GPU Ray gave it (CUDA_VISIBLE_DEVICES)
        self.version = getattr(self.grader, "version", None)
        self.dir = Path(tempfile.mkdtemp(prefix="mkb-grader-actor-"))

    def _local(self, job: Any, source: bytes) -> Any:
        """The kernel as a file named by its content, written whole before it is renamed into place: the actor grades
        up to 64 submissions at once, and the same kernel (a pair's re-grade, two attempts that wrote the same file)
        written again in place was truncated under a grading reading it, which then graded an empty kernel."""
        import dataclasses
        import hashlib

        p = self.dir / f"{hashlib.sha256(source).hexdigest()}.py"
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(source)
        os.replace(tmp, p)  # atomic: a reader sees the whole file, never a truncated one
        return dataclasses.replace(job, kernel_path=p)

    def get_version(self) -> str | None:
        return self.version

    def grade(self, job: Any, source: bytes) -> Any:
        return self.grader.submit(self._local(job, source)).result()

    def grade_batch(self, jobs: list[Any], sources: list[bytes]) -> list[Any]:
        futs = self.grader.submit_batch([self._local(j, s) for j, s in zip(jobs, sources)])
        return [f.result() for f in futs]

    def close(self) -> None:
        if hasattr(self.grader, "close"):
            self.grader.close()


class ActorGrader:
    """The `Grader` an attempt task sees: submissions go to a GPU's actor; a batch goes whole to one actor (one GPU)."""

    def __init__(self, actors: list[Any], version: str | None = None) -> None:
        self.actors, self.version = actors, version
        self._i = 0

    def _pick(self) -> Any:
        a = self.actors[self._i % len(self.actors)]
        self._i += 1
        return a

    def submit(self, job: Any) -> Future:
        return self._pick().grade.remote(job, Path(job.kernel_path).read_bytes()).future()

    def submit_batch(self, jobs: list[Any]) -> list[Future]:
        ref = self._pick().grade_batch.remote(list(jobs), [Path(j.kernel_path).read_bytes() for j in jobs])
        whole = ref.future()
        outs = [Future() for _ in jobs]

        def done(f: Future) -> None:
            try:
                vs = f.result()
                for o, v in zip(outs, vs):
                    o.set_result(v)
            except BaseException as exc:  # noqa: BLE001 - every arm's future carries the batch's failure
                for o in outs:
                    o.set_exception(exc)

        whole.add_done_callback(done)
        return outs


def _attempt_task(plan: Plan, store: str, key: str, actors: list[Any], version: str | None, runner: Runner | None,
                  ttl_s: float, versions: dict, pacers: dict[Any, Any] | None = None) -> Any:
    ex = Executor(plan, store=store, grader=ActorGrader(actors, version), runner=runner, ttl_s=ttl_s, versions=versions,
                  pair_regrade=False, limiters=ray_limiters(pacers or {}, plan.config.name))
    try:
        return ex.run_coordinate(plan.by_key[key])
    finally:
        ex.writer.close()


class RayExecutor(Executor):
    """`Executor` whose attempts run as Ray tasks (num_cpus each) and whose gradings go to one actor per GPU.

    Every model with rpm/tpm is paced by one book for the whole cluster (`mkb.experiment._ray_pace`), not per process.
    """

    def __init__(self, plan: Plan, *, store: str, grader_spec: str, n_graders: int | None = None, gpus_per_grader: float = 1.0,
                 task_cpus: float = 1.0, runner: Runner | None = None, **kw: Any) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, ignore_reinit_error=True, log_to_driver=False)
        n = n_graders if n_graders is not None else max(1, int(ray.cluster_resources().get("GPU", 0)))
        Actor = ray.remote(num_gpus=gpus_per_grader, num_cpus=0, max_concurrency=64)(GraderActorImpl)
        self.actors = [Actor.remote(grader_spec, store) for _ in range(n)]
        version = ray.get(self.actors[0].get_version.remote())
        self._task = ray.remote(num_cpus=task_cpus, max_retries=0)(_attempt_task)
        self._runner_remote = runner
        self.pacers = start_pacers(plan.config.name, plan.config.models)
        super().__init__(plan, store=store, grader=ActorGrader(self.actors, version), runner=runner,
                         limiters=ray_limiters(self.pacers, plan.config.name), **kw)

    def _submit(self, pool: ThreadPoolExecutor, c: Coordinate) -> Future:
        return self._task.remote(self.plan, self.store.url, c.key, self.actors, self.grader.version, self._runner_remote,
                                 self.ttl_s, self.versions, self.pacers).future()

    def _after(self, c: Coordinate, out: Any, not_before: dict[str, float]) -> None:
        if self.pacers and out.result is not None and out.result.status == "infra_error":
            check_pacers(self.pacers, self.cfg.name)  # a lost pacer would fail every attempt: stop, exclude nothing
        super()._after(c, out, not_before)

    def close(self) -> None:
        ray = _ray()
        for a in self.actors:
            try:
                ray.get(a.close.remote())
            except Exception:  # noqa: BLE001 - an actor already gone has nothing to flush
                pass


def run_on_ray(plan: Plan, *, store: str | None, grader_spec: str, only=None, rerun=(), rerun_stale: bool = False,
               **kw: Any) -> RunReport:
    """`mkb-run run --executor ray`: connect to RAY_ADDRESS (or start a local Ray), run, close the grader actors."""
    from mkb.events import resolve_store

    url = resolve_store(store, for_writing=True).url
    if not grader_spec.startswith("gpu") and "n_graders" not in kw:  # a replay grader needs no GPU: one actor
        kw.update(n_graders=1, gpus_per_grader=0.0)
    ex = RayExecutor(plan, store=url, grader_spec=grader_spec, **kw)
    try:
        return ex.run(only=only, rerun=rerun, rerun_stale=rerun_stale)
    finally:
        ex.close()
