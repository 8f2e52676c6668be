"""Kill-and-resume cycles over the demo plan: start an executor process, SIGKILL it at a random moment, repeat, then check.

Shared by the CI test (5 cycles) and `benchmarks/experiment_bench.py` (>= 50): the check is what "nothing lost or
duplicated" means: every coordinate has exactly one scored attempt, none superseded, and every claimed attempt
either finished or is recorded as abandoned.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Check:
    coordinates: int
    scored: int
    duplicates: int  # coordinates with more than one unsuperseded finished attempt
    superseded: int
    claimed: int
    finished: int
    abandoned: int
    unaccounted: int  # claimed attempts neither finished nor abandoned

    @property
    def ok(self) -> bool:
        return self.scored == self.coordinates and self.duplicates == 0 and self.unaccounted == 0 and self.superseded == 0


def start(store: str, *, sleep_s: float, ttl_s: float, env: dict | None = None, extra: list[str] = ()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mkb.experiment._fake", store, "--sleep", str(sleep_s), "--ttl", str(ttl_s), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, text=True)


def kill_cycles(store: str, *, cycles: int, seed: int = 0, sleep_s: float = 0.3, ttl_s: float = 1.0,
                kill_after: tuple[float, float] = (1.0, 4.0), log=print) -> list[float]:
    """`cycles` runs each SIGKILLed after a seeded random delay, counted from the moment the run's first attempt
    starts (its imports, store reads and first claim done: on a fresh or loaded machine they alone can outlast the
    delay, and a run killed before it claims anything tests nothing); returns the delays used. A run with nothing
    left to claim never announces, and is killed after the delay counted from the wait's timeout."""
    from mkb.experiment._fake import READY

    rng = random.Random(seed)
    delays = []
    for i in range(cycles):
        p = start(store, sleep_s=sleep_s, ttl_s=ttl_s)
        _wait_for_line(p, READY, timeout_s=60)
        d = rng.uniform(*kill_after)
        try:
            p.wait(timeout=d)
            log(f"cycle {i + 1}: finished before the kill at {d:.2f} s (rc {p.returncode})")
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            log(f"cycle {i + 1}: SIGKILL at {d:.2f} s")
        delays.append(d)
    return delays


def _wait_for_line(p: subprocess.Popen, line: str, *, timeout_s: float) -> None:
    """Read `p`'s output until `line` (or its exit, or `timeout_s`: then the delay simply starts late). Raw reads of
    the pipe's descriptor, so nothing sits in a Python buffer that `select` cannot see."""
    fd, seen, want = p.stdout.fileno(), b"", line.encode()
    deadline = time.monotonic() + timeout_s
    while want not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        seen += chunk


def finish(store: str, *, sleep_s: float = 0.0, ttl_s: float = 1.0, timeout: float = 600) -> str:
    p = start(store, sleep_s=sleep_s, ttl_s=ttl_s)
    out, _ = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"the final run failed (rc {p.returncode}):\n{out}")
    return out


def check(store: str) -> Check:
    from mkb.experiment import build_plan
    from mkb.experiment._fake import demo_config
    from mkb.experiment._state import read_state

    plan = build_plan(demo_config())
    st = read_state(store, plan.config.name)
    scored = dup = sup = claimed = fin = ab = un = 0
    for c in plan.coordinates:
        cs = st.coord(c.key)
        live = [a for a in cs.attempts if a.status in ("finished", "budget_exhausted") and not a.superseded]
        scored += cs.scored is not None
        dup += len(live) > 1
        for a in cs.attempts:
            claimed += 1
            sup += a.superseded
            fin += a.status is not None
            ab += a.abandoned
            un += a.status is None and not a.abandoned
    return Check(len(plan.coordinates), scored, dup, sup, claimed, fin, ab, un)
