"""`GradingQueue`: one queue per GPU that grades jobs from any thread or asyncio task, one at a time, over a warm pool.

Why one grading at a time per GPU: a grading's correctness draws, eager timing and timing loop all
use the GPU, and a second grading's work beside a timing loop moves its median (the quiet rule's
measurement, mkb.grader._pool). What overlaps is what cannot disturb a timing: the next worker's
Python imports, and the parent's bookkeeping. So a dispatcher thread per queue takes the next job
and grades it on a single-use worker from the queue's `WorkerPool`; the device's quiet coordinator
keeps spares' GPU warm-ups out of its GPU-sensitive phases.

Order: round-robin across experiments (each experiment with pending work gets the next grading in
turn, so a large experiment cannot starve a small one), FIFO within one. A batch (`submit_batch`, a
pair re-grade) is one turn: its kernels, all of one problem, are graded back to back with nothing
else on the GPU in between, against one eager timing measured for the batch. Every verdict carries
`queue_wait_s`, submit to the start of its grading, which an agent's working time excludes.

Events go to one long-lived writer and are flushed when the queue runs dry (or every `FLUSH_EVERY_S`
under load), off the gradings' critical path; `close()` drains every pending job and flushes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mkb.grader._config import GraderConfig
from mkb.grader._pool import WorkerPool, device_kind, normalize_device, quiet_for
from mkb.grader._precompile import Precompiler
from mkb.grader._prefetch import PlanFootprint, Prepared

SCOPES = ("submission", "attempt", "pair")
FLUSH_EVERY_S = 30.0


@dataclass(frozen=True)
class GradeJob:
    """One kernel to grade. `kernel_path` is a snapshot the caller never rewrites: the queue may read it any time."""

    problem: int
    dsl: str
    kernel_path: Path
    experiment: str = "default"  # round-robin key
    attempt_id: str | None = None
    scope: str = "submission"  # "submission" | "pair" (an attempt's own final re-grade: "attempt")


@dataclass
class _Entry:
    jobs: tuple[GradeJob, ...]
    futures: tuple[concurrent.futures.Future, ...]
    submitted: float
    batch: bool


class GradingQueue:
    """Grades `GradeJob`s on one device (`cuda:N`; `cpu` or `cpu:N` in tests), one at a time, fairly across experiments.

    `submit` returns a `concurrent.futures.Future[Verdict]` (from asyncio: `await asyncio.wrap_future(...)`);
    a grading that raises (an unreadable kernel, an unknown DSL or problem) fails its future with that
    exception. A kernel that fails is not an exception: its verdict says why.
    """

    def __init__(self, *, device: str = "cuda:0", store: Any = None, writer: Any = None,
                 config: GraderConfig | None = None, dsls: Sequence[str] | None = None,
                 env: dict[str, str] | None = None, prestart: bool = True, depth: int = 3,
                 low_water: int | None = 1, prefetch: bool = True, precompile_arch: str | None = None) -> None:
        self.device = normalize_device(device)
        _claim_device(self)
        try:
            self._start(store=store, writer=writer, config=config, dsls=dsls, env=env, prestart=prestart, depth=depth,
                        low_water=low_water, prefetch=prefetch, precompile_arch=precompile_arch)
        except BaseException:
            _release_device(self)
            raise

    def _start(self, *, store: Any, writer: Any, config: GraderConfig | None, dsls: Sequence[str] | None,
               env: dict[str, str] | None, prestart: bool, depth: int, low_water: int | None, prefetch: bool,
               precompile_arch: str | None) -> None:
        kind = device_kind(self.device)
        cfg = config or GraderConfig(device=kind)
        self.config = cfg if cfg.device == kind else dataclasses.replace(cfg, device=kind)
        self._own_writer = writer is None
        if writer is None:
            from mkb.events import EventWriter

            writer = EventWriter(store)
        self.writer = writer
        # warm workers for `dsls` (default: every registered DSL); a job of another DSL gets one started cold
        # (`depth`, `low_water`: how many spares per DSL and when to spawn the next batch, see WorkerPool). The
        # default 3 / 1 is the H200 queue pass's (events/h200-grader-2-3: a grading waited 0.15 s for a worker on
        # average, 4 of 42 at all); its serial pass, on a pool refilled one successor per take (the former
        # default here), waited 1.91 s per grading: a worker's start (imports, CUDA and profiler init) takes
        # several gradings' time (grader_bench's phases: `parent.worker_wait`)
        self.pool = WorkerPool(tuple(dsls) if dsls is not None else None, device=self.device, env=env, prestart=prestart,
                               depth=depth, low_water=low_water)
        # the next job's trusted plan made ahead by the spare that will grade it (mkb.grader._prefetch): at most one
        # at a time, for the job the dispatcher takes next, started while the current grading compiles
        self.prefetch = prefetch
        self._prepared: Prepared | None = None
        self._last_end: float | None = None  # when the previous grading on this device ended (verdict's device_idle_s)
        self._footprints: dict[tuple[str, str], PlanFootprint] = {}  # (problem hash, size) -> the last plan's bytes
        # each queued job's device code made ahead, outside the GPU, for a DSL whose compile is mostly nvcc
        # (mkb.grader._precompile); on a GPU for the device's own arch, on a CPU queue only where `precompile_arch` asks
        self.precompiler = _precompiler_for(self.config, kind, precompile_arch, self._upcoming)
        if self.precompiler is not None:
            # its forks stop while the device times a grading (CPU work beside a timing phase delays its wake-ups)
            quiet_for(self.device).listen(self.precompiler.pause)
            if prestart:  # its fork servers import while the workers warm up
                self.precompiler.prestart(self.pool.dsls)
        self._cv = threading.Condition()
        self._pending: collections.OrderedDict[str, collections.deque[_Entry]] = collections.OrderedDict()
        self._closed = False
        self._busy = False
        self.graded = 0
        self.busy_s = 0.0  # seconds the dispatcher spent grading (for gradings per GPU-hour)
        self._last_flush = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"mkb-grading-{self.device}", daemon=True)
        self._thread.start()

    # ---------------- producers (any thread) ----------------

    def submit(self, job: GradeJob) -> concurrent.futures.Future:
        """Queue one grading; the future resolves to its `Verdict`."""
        _check_job(job)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._put(_Entry((job,), (fut,), time.monotonic(), batch=False), job.experiment)
        return fut

    def submit_batch(self, jobs: Sequence[GradeJob]) -> list[concurrent.futures.Future]:
        """Queue an exclusive pair re-grade: kernels of one problem graded back to back against one eager timing.

        The batch takes one turn of its first job's experiment; nothing else runs on this GPU until
        its last kernel is graded. Verdicts of a `scope="pair"` batch share a `pair_id`.
        """
        jobs = tuple(jobs)
        if not jobs:
            return []
        for j in jobs:
            _check_job(j)
        problems = {j.problem for j in jobs}
        if len(problems) != 1:
            raise ValueError(f"a batch grades kernels of one problem, got problems {sorted(problems)}\n"
                             "hint: submit one batch per problem")
        futs = tuple(concurrent.futures.Future() for _ in jobs)
        self._put(_Entry(jobs, futs, time.monotonic(), batch=True), jobs[0].experiment)
        return list(futs)

    def _put(self, entry: _Entry, experiment: str) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError(f"the grading queue of {self.device} is closed\nhint: submit before close()")
            self._pending.setdefault(experiment, collections.deque()).append(entry)
            self._cv.notify_all()
        if self.precompiler is not None:
            for job in entry.jobs:
                self.precompiler.request(job)

    def _upcoming(self) -> list[GradeJob]:
        """The queued jobs in the order `_next` will hand them out (round-robin over experiments, FIFO within one), so
        that the precompiler starts first what is graded first."""
        with self._cv:
            queues = [list(q) for q in self._pending.values()]
        out: list[GradeJob] = []
        for r in range(max((len(q) for q in queues), default=0)):
            for q in queues:
                if r < len(q):
                    out.extend(q[r].jobs)
        return out

    def pending(self) -> int:
        """Jobs submitted and not yet started (for tests and load reports)."""
        with self._cv:
            return sum(len(e.jobs) for q in self._pending.values() for e in q)

    # ---------------- the dispatcher ----------------

    def _next(self) -> _Entry | None:
        """The next entry, round-robin over experiments (None once closed and drained)."""
        with self._cv:
            while not self._pending and not self._closed:
                self._cv.wait()
            if not self._pending:
                return None
            experiment, q = next(iter(self._pending.items()))
            entry = q.popleft()
            if q:
                self._pending.move_to_end(experiment)  # its next job waits for one turn of every other experiment
            else:
                del self._pending[experiment]
            self._busy = True
            return entry

    def _run(self) -> None:
        while True:
            entry = self._next()
            if entry is None:
                break
            t0 = time.monotonic()
            try:
                self._dispatch(entry)
            except BaseException as exc:  # noqa: BLE001 - a dispatcher fault fails the entry's futures, never hangs them
                for f in entry.futures:
                    if not f.done():
                        f.set_exception(exc)
            finally:
                self.busy_s += time.monotonic() - t0
                with self._cv:
                    self._busy = False
                    idle = not self._pending
                    self._cv.notify_all()
                if idle or time.monotonic() - self._last_flush > FLUSH_EVERY_S:
                    self._flush()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        try:
            self.writer.flush()
        except Exception:  # noqa: BLE001 - the writer keeps unflushed rows; close() tries again and raises there
            pass

    def _dispatch(self, entry: _Entry) -> None:
        from mkb.grader._grade import grade_with
        from mkb.grader._jsonl import uuid7

        pinned: dict | None = None
        pair_id = uuid7() if entry.batch and any(j.scope == "pair" for j in entry.jobs) else None
        for i, (job, fut) in enumerate(zip(entry.jobs, entry.futures)):
            prepared = self._claim_prepared(job)
            if not fut.set_running_or_notify_cancel():
                if prepared is not None:  # its job will not be graded: the spare holding its plan goes
                    prepared.drop()
                if self.precompiler is not None:  # nor its device code: stopped, its folder removed
                    self.precompiler.release(self.precompiler.take(job))
                continue  # cancelled by its producer while it waited
            wait = time.monotonic() - entry.submitted
            code = self.precompiler.take(job) if self.precompiler is not None else None
            try:
                verdict, fresh = grade_with(
                    job.problem, job.dsl, job.kernel_path, writer=self.writer, config=self.config, pool=self.pool,
                    scope=job.scope, attempt_id=job.attempt_id, queue_wait_s=wait, pinned=pinned,
                    # a batch's first grading measures eager afresh; the others use that one timing
                    fresh_eager=entry.batch and pinned is None, pair_id=pair_id if job.scope == "pair" else None,
                    prepared=prepared, on_compile=(lambda e=entry, k=i: self._prefetch_next(e, k)) if self.prefetch else None,
                    on_plan=lambda foot, j=job: self._note_footprint(j, foot),
                    device_idle_s=None if self._last_end is None else time.monotonic() - self._last_end,
                    device_code=code)
            except BaseException as exc:  # noqa: BLE001 - the producer gets it through its future
                if prepared is not None and not prepared.claimed:  # it raised before taking its worker (unreadable kernel)
                    prepared.drop()
                fut.set_exception(exc)
                continue
            finally:
                self._last_end = time.monotonic()
                if code is not None:
                    self.precompiler.release(code)
            if entry.batch and pinned is None and fresh.get("eager"):
                pinned = {"eager": fresh["eager"]}
            self.graded += 1
            fut.set_result(verdict)

    # ---------------- prefetch (mkb.grader._prefetch) ----------------

    def _claim_prepared(self, job: GradeJob) -> Prepared | None:
        """The prefetch made for `job` (an equal job may take it: its plan needs nothing of the kernel), else None."""
        with self._cv:
            p = self._prepared
            if p is None or p.job != job:
                return None
            self._prepared = None
            return p

    def _peek(self) -> GradeJob | None:
        """The job `_next` would hand out now (the head of the first experiment in turn)."""
        with self._cv:
            for q in self._pending.values():
                if q:
                    return q[0].jobs[0]
            return None

    def _note_footprint(self, job: GradeJob, foot: PlanFootprint) -> None:
        from mkb.grader._session import problem_identity

        with self._cv:
            self._footprints[(problem_identity(job.problem), self.config.size)] = foot

    def _prefetch_next(self, entry: _Entry, index: int) -> None:
        """Called when the grading of `entry.jobs[index]` starts its compile: hand the next job's plan to a ready spare.

        Only on a ready spare of the next job's DSL (none is started cold for it), only one prefetch at a time, and on a
        GPU only for a problem whose plan a previous grading here measured small beside the free memory it saw
        (`PlanFootprint.fits`; the worker checks its own figures again)."""
        from mkb.grader._grade import plan_job_fields
        from mkb.grader._session import problem_identity

        with self._cv:
            if self._prepared is not None:
                return
        nxt = entry.jobs[index + 1] if index + 1 < len(entry.jobs) else self._peek()
        if nxt is None:
            return
        phash = problem_identity(nxt.problem)
        if device_kind(self.device) == "cuda":
            with self._cv:
                foot = self._footprints.get((phash, self.config.size))
            if foot is None or not foot.fits(self.config.expectations, self.config.prefetch_fraction):
                return
        w = self.pool.take_ready(nxt.dsl)
        if w is None:
            return
        p = Prepared.for_job(w, nxt, plan_job_fields(nxt.problem, nxt.dsl, self.config, phash))
        with self._cv:
            self._prepared = p
        p.start()

    # ---------------- lifecycle ----------------

    def close(self) -> None:
        """Grade everything already submitted, then stop the dispatcher and the workers and flush the events."""
        try:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            if self._thread is not threading.current_thread():
                self._thread.join()
            with self._cv:
                left, self._prepared = self._prepared, None
            if left is not None:  # made for a job that never came (drained without it): its spare goes
                left.drop()
            if self.precompiler is not None:
                quiet_for(self.device).unlisten(self.precompiler.pause)
                self.precompiler.close()
            self.pool.close()
            if self._own_writer:
                self.writer.close()
            else:
                self.writer.flush()
        finally:  # whatever raised above (an interrupt in the join included), the device is this process's again
            _release_device(self)

    def __enter__(self) -> "GradingQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# the process's open queue of each device it guards (module docstring: one grading at a time per GPU)
_OPEN: dict[str, GradingQueue] = {}
_OPEN_LOCK = threading.Lock()


def _precompiler_for(cfg: GraderConfig, kind: str, arch: str | None,
                     order: Callable[[], list[GradeJob]]) -> Precompiler | None:
    """The queue's precompiler, or None: turned off, no Landlock (>= 6) to confine its sandbox, or a CPU queue not asked."""
    from mkb.grader._fs_guard import landlock_abi
    from mkb.grader._precompile_child import MIN_LANDLOCK_ABI

    if cfg.precompile == "off" or landlock_abi() < MIN_LANDLOCK_ABI:
        return None
    if arch is None and kind == "cuda":
        from mkb.measure._device import UnsupportedGpu, detect_arch

        try:
            arch = detect_arch()
        except UnsupportedGpu:
            return None
    return Precompiler(gpu_arch=arch, size=cfg.size, order=order, read_guard=cfg.read_guard) if arch else None


def _guarded(device: str) -> bool:
    """A GPU, or an indexed CPU stand-in for one (tests); a bare "cpu" (smoke runs, most tests) times nothing."""
    return device != "cpu"


def _claim_device(q: GradingQueue) -> None:
    """Refuse a second open queue of one device in this process. Why: two queues of one GPU would each grade one job at
    a time, so one's candidate would compile and run beside the other's timing loop (the quiet coordinator keeps
    warm-ups out of a timing phase, not another queue's grading), and its medians would move with no error anywhere."""
    if not _guarded(q.device):
        return
    with _OPEN_LOCK:
        if q.device in _OPEN:
            raise ValueError(f"a grading queue of {q.device} is already open in this process\nhint: one queue per GPU: "
                             "submit every experiment's jobs to that queue (it takes them round-robin), or close() it first; "
                             "devices are named as normalize_device names them (cuda and cuda:0 are one GPU)")
        _OPEN[q.device] = q


def _release_device(q: GradingQueue) -> None:
    with _OPEN_LOCK:
        if _OPEN.get(q.device) is q:
            del _OPEN[q.device]


def _check_job(job: Any) -> None:
    if not isinstance(job, GradeJob):
        raise TypeError(f"GradingQueue takes GradeJob, not {type(job).__name__}")
    if job.scope not in SCOPES:
        raise ValueError(f"unknown scope {job.scope!r}\nhint: one of {', '.join(SCOPES)}")
