"""The grading session's cache of trusted, candidate-independent figures: eager timings and launch floors.

Why: a queue grades many kernels of one problem on one GPU, and the eager baseline's timing (its
input sets, clock warm-up and timed loop) is the same work every time; doing it once per session
also gives every grading of the session one eager denominator (DESIGN: pairs are graded "against
one eager timing"). What is cached is only what a trusted worker measured *before* any candidate
was imported (the parent takes it from the `trusted` message, which precedes the `compile` phase
message on the result channel, so no candidate can have written it). Correctness draws, expected
outputs, fp64 anchors and re-check sets are never cached: they are drawn from each grading's own
secret.

Keys cannot cross problems, GPUs or versions: a key holds the problem number and its `problem_hash`
(mkb.problems: the folder and the helper modules problem.py imports, so an edit to a shared page-table
or fp8 helper invalidates the eager timing too), the GPU name and visible-device id the worker reported, the torch/mkb/grader versions,
the timing-policy id, and every config field the figure depends on. Entries also expire after
`max_age_s` (clocks and temperature drift over a long session) and die with the pool.

The launch floors (`floor:<dsl>`) are the exception, and only in what they do not depend on: the window floor
is the median of 30 stream windows around an empty call with the device's L2 flusher (`L2Flusher("cuda")`, sized
by the device), the DSL floor the same around the backend's `empty_kernel()`; neither reads the problem, its plan
or a config field (mkb.grader._harness, `trusted()`). So their key holds the DSL, GPU, visible device and versions
and no problem or config (`problem=0`, `problem_hash="*"`, neutral config fields): each DSL pays them once per
GPU and session instead of once per problem (H200, grader 2.5: 0.25-0.83 s per problem's first grading, and a
quiet wait before them). They are recorded beside the timing (`launch_floor_us`), never used in a check.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any


MAX_AGE_S = 900.0


@dataclass(frozen=True)
class TrustedKey:
    """Everything a cached eager timing or launch floor depends on."""

    what: str  # "eager", "reference" or "floor:<dsl>" (a floor's key holds no problem and no config: module docstring)
    problem: int
    problem_hash: str
    gpu: str
    visible_devices: str
    torch: str
    mkb: str
    grader: str
    timing_policy: str
    size: str
    n_warmup: int
    n_timed: int
    clock_warm_s: float
    set_first_pass: str  # how the eager's timed sets were placed (GraderConfig.set_first_pass)


def problem_identity(spec: Any) -> str:
    """The problem's hash (mkb.problems.problem_hash), or "unknown" (then nothing of it is cached)."""
    from mkb.problems import find_problem, problem_hash

    try:
        return problem_hash(find_problem(spec).parent)
    except (ValueError, OSError):
        return "unknown"


def is_floor(what: str) -> bool:
    """Whether `what` is a launch-floor figure (keyed without the problem and the config: module docstring)."""
    return what.startswith("floor:")


def trusted_key(what: str, *, problem: int, problem_hash: str, ready: dict, cfg: Any, grader_version: str) -> TrustedKey | None:
    """The key for `what`, or None when the worker did not report what the key needs (then nothing is cached)."""
    from mkb.measure import TIMING_POLICY

    gpu, torch_v = ready.get("gpu"), ready.get("torch")
    floor = is_floor(what)
    if not gpu or not torch_v or (problem_hash == "unknown" and not floor):
        return None
    try:
        from mkb import __version__ as mkb_v
    except ImportError:
        mkb_v = "unknown"
    common = dict(what=what, gpu=str(gpu), visible_devices=str(ready.get("visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES", ""))),
                  torch=str(torch_v), mkb=str(mkb_v), grader=grader_version, timing_policy=TIMING_POLICY)
    if floor:  # the empty call's windows: nothing of the problem or the config (the DSL is in `what`)
        return TrustedKey(**common, problem=0, problem_hash="*", size="*", n_warmup=0, n_timed=0, clock_warm_s=0.0,
                          set_first_pass="*")
    return TrustedKey(
        **common, problem=int(problem), problem_hash=problem_hash,
        size=cfg.size, n_warmup=cfg.n_warmup, n_timed=int(cfg.eager_timed or cfg.n_timed), clock_warm_s=cfg.clock_warm_s,
        set_first_pass=cfg.set_first_pass,
    )


class TrustedCache:
    """key -> (figures, monotonic time stored). Thread-safe; lives as long as its pool."""

    def __init__(self, *, max_age_s: float = MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self._d: dict[TrustedKey, tuple[dict, float]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: TrustedKey | None) -> dict | None:
        if key is None:
            return None
        with self._lock:
            hit = self._d.get(key)
            if hit is None or time.monotonic() - hit[1] > self.max_age_s:
                self.misses += 1
                return None
            self.hits += 1
            return dict(hit[0])

    def put(self, key: TrustedKey | None, figures: dict) -> None:
        if key is None or not figures:
            return
        with self._lock:
            self._d.setdefault(key, (dict(figures), time.monotonic()))

    def entries(self) -> list[tuple[TrustedKey, dict]]:
        """Every (key, figures) held, fresh or not (to carry one cache's measurements into another)."""
        with self._lock:
            return [(k, dict(v[0])) for k, v in self._d.items()]

    def __len__(self) -> int:
        return len(self._d)
