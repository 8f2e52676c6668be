"""The prefetched trusted plan: a spare computes the next job's secret draws and expectations before that job starts.

Why (DESIGN, Grader: "Overhead, attributed"): the trusted plan's 17 expectations were the largest part of a warm
queue's overhead on the H200 (0.49-0.73 s median, up to 3.1 s), and none of it needs the candidate. With a backlog,
the queue hands the next job's plan inputs (problem, its hash, DSL, config, a secret drawn for it) to the spare that
will grade it, while the current grading compiles; that spare computes the plan before anything of a candidate
exists in its process, and the job, once it starts, finds it made.

Rules kept (each tested in tests/grader/test_prefetch.py):
- The plan is computed in the very worker that grades the job, before the candidate is imported, from a secret drawn
  for that job only. It is keyed on everything it depends on (`plan_key`): a job whose key differs finds no plan
  (the worker drops it and computes its own), and the secret of a prepare that was not used is never used again.
- The prepare is GPU work outside any window: it waits for quiet like a spare's warm-up (no worker of the device
  in a GPU-sensitive phase) and a timing phase waits for a prepare already running, all of it
  (mkb.grader._pool.GpuQuiet; that wait is the grading's `quiet_wait`). Grader 2.13 let a pending timing phase pause
  the prepare instead; 2.16 removed that: no gain in two H200 A/Bs, and a paused prepare cost problem 1's next
  grading its cached input blocks (docs/DESIGN.md, "Throughput of one GPU").
- Memory: a prepared plan stays on the device beside the grading in flight, whose free-memory readings
  (`needs_sampling`, the timing loop's input budget) were taken before it existed. So a plan is prefetched only when
  a previous grading of the same problem measured it at most `PREFETCH_FREE_FRACTION` of the free memory it saw,
  and the worker checks its own measurement again and declines otherwise; a plan that would be sampled under
  `expectations="auto"` beside the grading in flight is declined too (prefetching must never change how a plan
  keeps its expectations). A declined or failed prepare leaves the job to compute its plan lazily, as before.
- A prepare's failure is never the candidate's: a worker that dies or errs while preparing is replaced by a fresh
  spare and the job is graded there with a fresh secret.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# a prefetched plan (its expectations, the compile call's input set and the first expectation's working peak) may
# take at most this share of the free device memory: the grading in flight read its input budget (a quarter of the
# free memory) and its sampling decision before the plan existed, so 1/16 leaves it more than two thirds of what it saw
PREFETCH_FREE_FRACTION = 1 / 16
PREPARE_LIMIT_S = 60.0  # a prepare still running after this long is a hung worker: killed, the job takes another
_PLAN_FIELDS = ("problem", "problem_hash", "dsl", "backend", "secret", "config")


def plan_key(job: dict) -> str:
    """The identity of a trusted plan: a hash of everything `_Plan` depends on (the secret makes it one job's)."""
    return hashlib.sha256(json.dumps({k: job.get(k) for k in _PLAN_FIELDS}, sort_keys=True, default=str).encode()).hexdigest()


def plan_fields(job: dict) -> dict:
    """The part of a job a prepare gets: what the plan needs, nothing of the candidate (no kernel path)."""
    return {k: job.get(k) for k in _PLAN_FIELDS}


def free_fraction(fraction: float | None) -> float:
    """The share of the free device memory a prefetch may use: `GraderConfig.prefetch_fraction`, None meaning the
    shipped PREFETCH_FREE_FRACTION (resolved here only, so the gate and its refusal message read one value)."""
    return PREFETCH_FREE_FRACTION if fraction is None else fraction


def prefetch_fits(*, plan_bytes: int | None, working_bytes: int | None, free_bytes: int | None,
                  fraction: float | None = None) -> bool:
    """Whether a plan of `plan_bytes` kept (+ its first expectation's transient `working_bytes`) may be prepared beside
    a grading in flight, on a device with `free_bytes` free, at most `fraction` of it (None: PREFETCH_FREE_FRACTION,
    as shipped; GraderConfig.prefetch_fraction). Off the GPU (free_bytes None) there is no device memory to share:
    always. On it, with a figure missing: never (prepare lazily, as before)."""
    if free_bytes is None:
        return True
    if plan_bytes is None or working_bytes is None:
        return False
    return plan_bytes + working_bytes <= free_bytes * free_fraction(fraction)


@dataclass(frozen=True)
class PlanFootprint:
    """What one grading's trusted plan took on the device (the worker's `plan` message, sent before any candidate)."""

    kept_bytes: int | None
    input_bytes: int | None
    working_bytes: int | None
    free_bytes: int | None
    expectations: str | None

    @classmethod
    def from_msg(cls, msg: dict) -> "PlanFootprint | None":
        def num(k: str) -> int | None:
            v = msg.get(k)
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None

        if not isinstance(msg, dict):
            return None
        mode = msg.get("expectations")
        return cls(kept_bytes=num("kept_bytes"), input_bytes=num("input_bytes"), working_bytes=num("working_bytes"),
                   free_bytes=num("free_bytes"), expectations=mode if mode in ("whole", "sampled") else None)

    def fits(self, cfg_expectations: str, fraction: float | None = None) -> bool:
        """Prefetch this problem's next plan? Only one kept whole (or sampled by the config, not by the free memory)."""
        if cfg_expectations == "auto" and self.expectations != "whole" and self.free_bytes is not None:
            return False
        plan = None if self.kept_bytes is None else self.kept_bytes + (self.input_bytes or 0)
        return prefetch_fits(plan_bytes=plan, working_bytes=self.working_bytes, free_bytes=self.free_bytes,
                             fraction=fraction)


@dataclass
class Prepared:
    """One prefetch in the parent: the spare it went to, the plan fields (with their secret) and how it went.

    States: waiting (for quiet), sent (the worker prepares), ready (it reported the plan made), declined (it did not
    make it: memory; the worker stays clean and usable), failed (it died, erred or ran past PREPARE_LIMIT_S: killed),
    cancelled (claimed before it started: nothing was sent), dropped (its job went away: killed).
    """

    worker: Any
    job: Any  # the GradeJob it was made for (value equality: an identical job may take it)
    fields: dict
    key: str
    state: str = "waiting"
    created: float = field(default_factory=time.monotonic)
    sent_at: float | None = None
    done_at: float | None = None
    reply: dict = field(default_factory=dict)
    error: str | None = None
    claimed: bool = False  # a grading took it (its worker is that grading's to kill)
    deadline: float | None = None  # when the prepare counts as hung: sent_at + PREPARE_LIMIT_S (set with sent_at)
    _done: threading.Event = field(default_factory=threading.Event)
    _cancel: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_job(cls, worker: Any, job: Any, fields: dict) -> "Prepared":
        f = {**plan_fields(fields), "secret": secrets.randbits(62)}
        return cls(worker=worker, job=job, fields=f, key=plan_key(f))

    def start(self, send_prepare=None) -> None:
        """Wait for quiet on the worker's device, send the prepare, read its reply (a daemon thread)."""
        threading.Thread(target=self._run, args=(send_prepare,), name=f"mkb-prepare-{self.worker.pid}", daemon=True).start()

    def _run(self, send_prepare) -> None:
        w = self.worker
        try:
            def send() -> None:
                (send_prepare or (lambda: w.send_job({"type": "prepare", **self.fields})))()
                self.sent_at = time.monotonic()
                self.deadline = self.sent_at + PREPARE_LIMIT_S
                self.state = "sent"

            with self._lock:
                if self._cancel.is_set():
                    self.state = "cancelled"
                    return
            started = w.quiet.side_work(w, send, cancel=self._cancel, lock=self._lock)
            if not started:
                if self.state == "waiting":
                    self.state = "cancelled"
                return
            msg = w.reader.read(self.deadline)
            if isinstance(msg, dict) and msg.get("type") == "prepared":
                self.reply = {k: v for k, v in msg.items() if k != "type"}
                if msg.get("ok") and msg.get("key") != self.key:  # never: the worker keyed the plan on other fields
                    self.state, self.error = "failed", "the worker reported a plan of another key"
                elif msg.get("ok"):
                    self.state = "ready"
                elif msg.get("declined"):
                    self.state = "declined"
                else:
                    self.state, self.error = "failed", str(msg.get("error") or "the prepare failed")[:4000]
            else:
                self.state, self.error = "failed", f"the worker's prepare ended with {msg if isinstance(msg, str) else 'a stray message'}"
        except Exception as exc:  # noqa: BLE001 - a prepare's fault is the grader's: the job takes another worker
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            if self.state == "failed":  # dead, erring or hung: it must not go on using the GPU outside the rule
                w.kill(wait=False)
            self.done_at = time.monotonic()
            w.quiet.warmed(w)
            self._done.set()

    def claim(self, timeout: float | None = None) -> tuple[Any | None, dict]:
        """For the job's start: the worker to grade on (None: take another) and the record for the verdict.

        A prepare not yet started is cancelled (its worker, which never saw the plan, is used plainly); one running is
        waited for; a failed one's worker (dead, erring, hung, or dead since) is killed and the job takes a fresh spare.
        `secret_used` says the job gets this prepare's secret (its worker holds the plan made from it). The wait ends,
        without `timeout`, 5 s after the prepare's own deadline (its reader gives up there and kills the worker): one
        sent long before the claim is not given a fresh minute. One not yet sent is cancelled here, under the lock that
        `send` runs under, so it never will be; the wait for its `_run` thread to see that (within 0.05 s) is bounded
        by the full limit from the claim."""
        t0 = time.monotonic()
        with self._lock:
            self.claimed = True
            if self.state == "waiting":
                self._cancel.set()
            limit = (t0 + PREPARE_LIMIT_S if self.deadline is None else self.deadline) + 5
        self._done.wait(max(0.0, limit - time.monotonic()) if timeout is None else timeout)
        waited = time.monotonic() - t0
        if not self._done.is_set():
            self.state, self.error = "failed", f"the prepare did not end within {waited:.0f} s (its limit {PREPARE_LIMIT_S:.0f} s)"
        elif self.state != "failed" and not self.worker.alive():  # died after its prepare, before its job: as a spare would
            self.state, self.error = "failed", f"the worker died before its job (exit {self.worker.proc.poll()})"
        w = self.worker
        if self.state == "failed":
            w.kill()
            w.cleanup()
            w = None
        rec = {"state": self.state, "wait_s": round(waited, 6), "secret_used": self.state == "ready",
               "quiet_wait_s": None if self.sent_at is None else round(self.sent_at - self.created, 6),
               "prepare_s": self.reply.get("prepare_s"), "prepare_wall_s": (round(self.done_at - self.sent_at, 6)
                                                                          if self.sent_at and self.done_at else None),
               "plan_bytes": self.reply.get("plan_bytes"), "declined": self.reply.get("declined"),
               "sealed": self.reply.get("sealed"), "error": self.error}
        return w, rec

    def drop(self) -> None:
        """Its job will not come (cancelled, the queue closing): the worker, which may hold the plan, is killed."""
        with self._lock:
            self._cancel.set()
        self.worker.kill()
        self.worker.cleanup()
        if self.state in ("waiting", "sent"):
            self.state = "dropped"
