"""Where a grading's wall time went: every second from request to verdict in one named phase (DESIGN, Grader: overhead).

Why: the overhead target (issue #10) is met by cutting phases, and a phase nobody recorded cannot be cut. The
parent times its own steps (reading the kernel, problem identity, static rules, taking a worker, waiting for it,
the drive loop, teardown); the worker times its steps from the job's arrival to its last message (setup, the
trusted plan's sub-steps, compile / verification / timing's sub-steps, integrity, the failure report) and sends
them in a `timeline` message. `attribute` joins the two: the parent's drive loop is replaced by the worker's
phases plus `parent.ipc` (the loop's span minus the worker's own span: pipe latency, the parent's handling of
each message, process scheduling), the candidate's own compile and timed-call seconds move to `kernel.compile`
and `kernel.timed` (what `Verdict.overhead_s` leaves out), and `parent.unattributed` takes the rest, so the
phases sum to `wall_s` exactly and the phases outside `kernel.*` sum to `overhead_s`.

A worker's timeline is the candidate's process's word, like its stage figures: it attributes time, never
decides a verdict, and a malformed one is dropped (the drive loop then stays one `parent.worker_job` phase).
"""

from __future__ import annotations

import math
import time
from typing import Any

KERNEL_PHASES = ("kernel.compile", "kernel.timed")
UNATTRIBUTED = "parent.unattributed"
_MAX_WORKER_PHASES = 64


class PhaseClock:
    """Consecutive named spans on the monotonic clock: `mark(name)` closes the span that began at the last mark."""

    def __init__(self, start: float | None = None) -> None:
        self.s: dict[str, float] = {}
        self._t = time.monotonic() if start is None else start

    def mark(self, name: str) -> float:
        now = time.monotonic()
        self.s[name] = self.s.get(name, 0.0) + (now - self._t)
        self._t = now
        return now


def clean_timeline(msg: Any) -> dict[str, float] | None:
    """The worker's `phases_s` if it is a small name -> finite non-negative seconds map, else None."""
    if not isinstance(msg, dict) or len(msg) > _MAX_WORKER_PHASES:
        return None
    out: dict[str, float] = {}
    for k, v in msg.items():
        if not isinstance(k, str) or len(k) > 64 or isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if not math.isfinite(v) or v < -1e-3:
            return None
        out[k] = max(float(v), 0.0)
    return out


def attribute(*, wall_s: float, parent: dict[str, float], worker: dict[str, float] | None = None,
              compile_s: float | None = None, timed_s: float | None = None) -> dict[str, float]:
    """One flat name -> seconds map over the whole grading; sums to `wall_s`.

    `parent` holds the parent's spans in order, `worker_job` being the drive loop (job sent to the worker's
    last message); `worker` the worker's timeline (None when it sent none: a crash, a timeout, a static-rule
    failure that never reached a worker). The candidate's `compile_s` is taken out of `worker.run.compile` and
    its `timed_s` out of `worker.run.timing_loop` (or, where those phases are missing, out of the block that
    holds them), never below zero.
    """
    out: dict[str, float] = {}
    for name, secs in parent.items():
        if name == "worker_job" and worker is not None:
            for wk, wv in worker.items():
                out[f"worker.{wk}"] = wv
            out["parent.ipc"] = secs - sum(worker.values())
        else:
            out[f"parent.{name}"] = secs
    for kernel, holders, secs in (("kernel.compile", ("worker.run.compile", "worker.run.other", "parent.worker_job"), compile_s),
                                  ("kernel.timed", ("worker.run.timing_loop", "worker.run.other", "parent.worker_job"), timed_s)):
        if not secs or secs <= 0:
            continue
        left = float(secs)
        for h in holders:
            if left <= 0:
                break
            take = min(left, max(out.get(h, 0.0), 0.0))
            if take > 0:
                out[h] -= take
                left -= take
        out[kernel] = float(secs)  # more than the phases held (never by construction): `parent.unattributed` goes below 0
    out[UNATTRIBUTED] = 0.0
    out[UNATTRIBUTED] = wall_s - sum(out.values())
    return {k: round(v, 6) for k, v in out.items()}


def overhead_of(phases: dict[str, float]) -> float:
    """The phases' share that is the grader's own (everything but the candidate's compile and timed calls)."""
    return sum(v for k, v in phases.items() if k not in KERNEL_PHASES)
