"""Single-use grader workers and the pool that keeps the next one spawned, imported and CUDA-initialised.

The quiet rule: a spare worker's warm start overlaps other gradings, so it is split in two. Its
Python imports (CPU only) run at once; everything of its warm start that touches the GPU (CUDA
init, the profiler's CUPTI init, stream calibration, any allocation) waits for a `go` from the
parent, which the device's `GpuQuiet` (one coordinator per device of the process, `quiet_for`,
shared by every pool and queue of that device) sends only while no worker of that device is in a
GPU-sensitive phase: the timing loop, and the trusted phase's eager timing and
launch floors. A worker announces such a phase with a `hold` message and waits for its own `go`,
which comes once no spare is in its GPU warm-up (bounded by `WARM_WAIT_S` and the grading's wall
limit) and no new spare gets `go` until it says the phase is over. Measured on the H200: with the
spare importing and initialising CUDA beside a timing loop, per-call CVs were 10-19% and one
kernel's median 21% slower (events/h200-grader-bench, "Caveats").

Why it cannot deadlock: a spare waits only on holds, a hold waits only on warm-ups that already
have `go` (never on a waiting spare, and a pending hold stops further `go`s, so it is not starved),
and a warm-up waits on nothing. Every hold dies with its worker: `_run_worker` releases it in a
`finally`, and killing / reaping a worker releases it too (crash, timeout, forged messages alike).
A grading that takes a spare still waiting for `go` never waits on itself: it holds nothing while
it waits for the worker to be ready, so `go` comes as soon as the others' phases end. The deferral
below waits on nothing either: it runs out `DEFER_GO_S` after the spare's imports (its start watcher
rechecks every 0.5 s), and a grading counts as untimed only after it has its own worker ready.

When a spare's `go` comes (issue #10): a spare whose imports end while a grading of the device is in flight
and has not yet ended its timing phase (its trusted phase, compile, verification) waits for that timing phase to
end, for at most `DEFER_GO_S` after its imports. Why: a warm-up started late in the gap before a timing phase
overruns it and the timing waits (H200, grader 2.5: `run.quiet_wait` 0.25 s per grading, mean, up to 1.4 s); one
started as a timing phase ends has the whole next gap (the rest of that grading, the next one's trusted phase,
compile and verification). Bounded, so a long compile still finds its spares warm; never for a worker a grading
already took and waits for (`urge`); and it only ever delays a `go`: nothing of the rule above is loosened.

Per device: a warm-up on one GPU does not disturb a timing loop on another, so each device
("cuda:0", "cuda:1", ...) has its own coordinator and one process can drive every GPU of a host.
A worker of "cuda:N" sees only that GPU (CUDA_VISIBLE_DEVICES, mapped through the parent's own list).
"""

from __future__ import annotations

import atexit
import collections
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mkb._procs import signal_group
from mkb._secrets import without_secrets
from mkb.grader._backends import backend_from_target, backend_target
from mkb.grader._fs_guard import SCRATCH_ENV
from mkb.grader._protocol import LineReader, write_msg
from mkb.grader._session import TrustedCache

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class _Reaper:
    """One thread that reaps the workers killed without waiting (`Worker.kill(wait=False)`), polling each until it is
    gone (at most REAP_LIMIT_S), then removes its scratch folder and records it reaped.

    Why one long-lived thread fed by a queue rather than a thread per kill: starting a thread blocks its starter until
    the new thread has run, which takes one GIL switch interval (5 ms) per busy thread of the parent, and the kill is
    on a finished grading's path to the next one (`parent.teardown` took ~1 ms or 11-30 ms on the H200,
    events/h200-grader-bench-2-22..2-24). The thread is started with the first worker, never on a kill's path."""

    POLL_S = 0.01

    def __init__(self) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._outstanding = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mkb-reaper", daemon=True)
                self._thread.start()

    def submit(self, w: "Worker") -> None:
        with self._lock:
            self._outstanding += 1
        self._q.put(w)
        self.start()  # a no-op once a worker started it (always in a pool)

    def _run(self) -> None:
        pending: list[tuple["Worker", float]] = []
        while True:
            try:
                w = self._q.get(timeout=self.POLL_S) if pending else self._q.get()
                pending.append((w, time.monotonic()))
            except queue.Empty:
                pass
            left = []
            for w, t0 in pending:
                try:
                    if w.proc.poll() is None and time.monotonic() - t0 < REAP_LIMIT_S:
                        left.append((w, t0))
                        continue
                    w._reap(timeout=0, join_s=1.0)
                except Exception:  # noqa: BLE001 - one worker's reap never stops the others' (nor the exit's join)
                    pass
                with self._lock:
                    self._outstanding -= 1
                    self._lock.notify_all()
            pending = left

    def join(self, timeout_s: float) -> bool:
        """Wait until every submitted worker is reaped (or `timeout_s`); whether none is left."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._outstanding > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True


REAP_LIMIT_S = 30.0  # a killed worker still alive after this is left to the OS; its scratch folder is removed all the same
_REAPER = _Reaper()


@atexit.register
def _join_reapers(timeout_s: float = REAP_LIMIT_S + 5.0) -> bool:
    """At exit, let the background reaps finish, so no worker's scratch folder outlives the process that made it."""
    return _REAPER.join(timeout_s)


# a hold waits at most this long for spares already in their GPU warm-up; a warm-up that takes
# longer than WARM_LIMIT_S after its `go` is treated as failed (and no longer blocks holds)
WARM_WAIT_S = 60.0
WARM_LIMIT_S = 120.0
# a spare that finished its imports while a grading is before the end of its timing phase waits at most this long
# for that phase to end before its GPU warm-up may start (module docstring; 0 turns the deferral off)
DEFER_GO_S = 3.0
# GpuQuiet.history's length: about 10 notes per grading, so a queue run of a thousand gradings can be replayed whole
HISTORY_MAX = 20_000


def normalize_device(device: str) -> str:
    """"cuda" -> "cuda:0" (the process's first visible GPU, the same one as "cuda:0"); "cpu", "cpu:1" unchanged.

    CPU devices with an index are stand-ins that tests use to show the per-device rule without a GPU.
    """
    kind, _, index = str(device).partition(":")
    if kind not in ("cuda", "cpu") or (index and not index.isdigit()):
        raise ValueError(f"unknown device {device!r}\nhint: use cuda:N (a GPU of this host) or cpu (tests, smoke runs)")
    if kind == "cuda":
        return f"cuda:{int(index or 0)}"
    return f"cpu:{int(index)}" if index else "cpu"


def device_kind(device: str) -> str:
    return normalize_device(device).split(":")[0]


def visible_device(device: str, env: dict[str, str] | None = None) -> str | None:
    """The CUDA_VISIBLE_DEVICES value that shows a worker of `device` its GPU only (None for CPU devices)."""
    dev = normalize_device(device)
    if not dev.startswith("cuda:"):
        return None
    index = int(dev.split(":")[1])
    parent = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if parent is None or not parent.strip():
        return str(index)
    ids = [x.strip() for x in parent.split(",") if x.strip()]
    if index >= len(ids):
        raise ValueError(f"device {dev} is not visible (CUDA_VISIBLE_DEVICES={parent})\nhint: use cuda:0..cuda:{len(ids) - 1}")
    return ids[index]


class GpuQuiet:
    """One device: which workers are in a GPU-sensitive phase, which spares wait for `go`, which warm up.

    State changes under one condition variable; `history` keeps (monotonic time, event, pid) for
    tests and post-mortems.
    """

    def __init__(self, device: str = "cuda:0") -> None:
        self.device = device
        self._cv = threading.Condition()
        self._holds: dict[object, str] = {}
        self._pending = 0
        self._waiting: list[Worker] = []
        self._warming: set[Worker] = set()
        self._untimed: set[object] = set()  # gradings in flight whose timing phase has not ended (defer new `go`s)
        self.defer_s = DEFER_GO_S
        self.history: collections.deque[tuple[float, str, int]] = collections.deque(maxlen=HISTORY_MAX)
        self._listeners: list[Callable[[bool], None]] = []

    def listen(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(True)` when a GPU-sensitive phase begins on this device and none was held, `fn(False)` when the last
        one ends (and once now, with the state now): CPU work beside the device's gradings (a queue's precompiles)
        steps aside for timing. Called under the coordinator's lock: `fn` must be quick and never call back here."""
        with self._cv:
            self._listeners.append(fn)
            self._tell(fn, bool(self._holds))

    def unlisten(self, fn: Callable[[bool], None]) -> None:
        with self._cv:
            if fn in self._listeners:
                self._listeners.remove(fn)

    @staticmethod
    def _tell(fn: Callable[[bool], None], held: bool) -> None:
        try:
            fn(held)
        except Exception:  # noqa: BLE001 - a listener's fault never reaches a grading's hold
            pass

    def _held(self, before: bool) -> None:
        """Tell the listeners where the holds went from none to some or back (under `_cv`)."""
        now = bool(self._holds)
        if now != before:
            for fn in list(self._listeners):
                self._tell(fn, now)

    def _note(self, event: str, pid: int) -> None:
        self.history.append((time.monotonic(), event, pid))

    def note(self, event: str, pid: int) -> None:
        """Record something the rule does not act on (a killed worker's teardown until it is reaped), in order."""
        with self._cv:
            self._note(event, pid)

    def busy(self) -> dict[str, object]:
        """What is going on now (for tests and logs)."""
        with self._cv:
            return {"holds": dict(self._holds), "pending": self._pending, "waiting": [w.pid for w in self._waiting],
                    "warming": sorted(w.pid for w in self._warming), "untimed": len(self._untimed)}

    def want_go(self, w: "Worker") -> None:
        """`w` finished its imports: `go` now if quiet, else when the last hold ends."""
        with self._cv:
            if w._forgotten:
                return
            self._note("imported", w.pid)
            if not self._holds and not self._pending and not self._defers(w):
                self._go(w)
            else:
                self._wait(w)

    def _wait(self, w: "Worker") -> None:
        """`w` waits for `go`; noted once as `deferred` when only the deferral keeps it (for the benchmark)."""
        self._waiting.append(w)
        if not self._holds and not self._pending and not w._deferred:
            w._deferred = True
            self._note("deferred", w.pid)

    def _defers(self, w: "Worker") -> bool:
        """Whether `w`'s `go` waits for a grading's timing phase to end (module docstring; under `_cv`)."""
        if not self._untimed or self.defer_s <= 0:
            return False
        if w._urgent:  # a grading waits for this very worker: never deferred
            return False
        since = w.imported_at
        return since is None or time.monotonic() - since < self.defer_s

    def urge(self, w: "Worker") -> None:
        """A grading took `w` before its warm start ended and waits for it: its `go` is no longer deferred."""
        with self._cv:
            w._urgent = True
            self._wake()

    def grading_started(self, token: object, *, pid: int = 0) -> None:
        """A grading of this device took its (ready) worker: new spares' `go`s wait for its timing phase to end."""
        with self._cv:
            self._untimed.add(token)
            self._note("grading", pid)

    def timing_ended(self, token: object, *, pid: int = 0) -> None:
        """The grading's timing phase ended, or the grading did (idempotent): deferred spares may go."""
        with self._cv:
            if token in self._untimed:
                self._untimed.discard(token)
                self._note("timed", pid)
            self._wake()

    def recheck(self) -> None:
        """Send the `go`s whose deferral ran out (a waiting spare's start watcher calls this every 0.5 s)."""
        with self._cv:
            self._wake()

    def _go(self, w: "Worker") -> None:
        try:
            w._send({"type": "go"})
        except OSError:  # the worker is gone; its reap forgets it
            return
        w.go_at = time.monotonic()
        self._warming.add(w)
        self._note("go", w.pid)

    def side_work(self, w: "Worker", start: Callable[[], None], *, cancel: threading.Event,
                  lock: threading.Lock | None = None, timeout: float = 3600.0) -> bool:
        """Job-independent GPU work of a ready worker (a prefetched plan, mkb.grader._prefetch), under the warm-up rule.

        Waits until no worker of the device is in (or waits for) a GPU-sensitive phase, then calls `start` (which
        sends the work) and counts `w` as warming until `warmed(w)`, so a hold waits for all of it as for a warm-up
        (grader 2.16 removed 2.13's pause for a hold: no gain, docs/DESIGN.md "Throughput of one GPU"). False when
        `cancel` is set first, the worker is gone, or `timeout` passes (then `start` is never called).
        """
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                if cancel.is_set() or w._forgotten or time.monotonic() > deadline:
                    return False
                if not self._holds and not self._pending:
                    break
                self._cv.wait(0.05)
            with (lock or threading.Lock()):
                if cancel.is_set():
                    return False
                start()
            self._warming.add(w)
            self._note("prepare", w.pid)
            return True

    def warmed(self, w: "Worker") -> None:
        with self._cv:
            if w in self._warming:
                self._warming.discard(w)
                self._note("warmed", w.pid)
            self._cv.notify_all()

    def hold(self, token: object, what: str, *, pid: int = 0, timeout: float = WARM_WAIT_S) -> float:
        """Enter a GPU-sensitive phase: wait (<= `timeout`) for spares in their GPU warm-up; returns seconds waited."""
        t0 = time.monotonic()
        with self._cv:
            self._pending += 1
            try:
                self._cv.wait_for(lambda: not self._warming, timeout=max(0.0, timeout))
            finally:
                self._pending -= 1
            before = bool(self._holds)
            self._holds[token] = what
            self._note(f"hold:{what}", pid)
            self._held(before)
        return time.monotonic() - t0

    def release(self, token: object, *, pid: int = 0) -> None:
        """Leave the phase (idempotent); the last one out sends `go` to every waiting spare."""
        with self._cv:
            if self._holds.pop(token, None) is not None:
                self._note("release", pid)
                self._held(True)
            self._wake()

    def _wake(self) -> None:
        if self._holds or self._pending:
            return
        waiting, self._waiting = self._waiting, []
        for w in waiting:
            if w._forgotten:
                continue
            if self._defers(w):
                self._wait(w)
            else:
                self._go(w)
        self._cv.notify_all()

    def forget(self, w: "Worker") -> None:
        """`w` is being killed: drop it from every set and release its holds."""
        with self._cv:
            w._forgotten = True
            if w in self._waiting:
                self._waiting.remove(w)
            if w in self._warming:  # a warm-up or prefetch that ends without `warmed` (the record says so)
                self._warming.discard(w)
                self._note("forgotten", w.pid)
            self._untimed.discard(w)
            if self._holds.pop(w, None) is not None:
                self._note("release", w.pid)
                self._held(True)
            self._wake()


@dataclass(frozen=True)
class PhaseReplay:
    """What a coordinator's history shows about the quiet rule over a run (`replay_phases`)."""

    timing_phases: int  # holds entered (trusted timing and timing loops)
    beside_timing: tuple[str, ...]  # a hold entered while another worker held one: the rule broken
    warm_ups_beside_timing: int  # holds entered while a spare warmed up or prepared a plan (its warm wait ran out)
    go_beside_timing: tuple[str, ...]  # a spare's `go` or prepare while a hold was held: the rule broken
    beside_teardown: int = 0  # holds entered while a killed worker that had used the GPU was not yet reaped (recorded)


def replay_phases(history, *, since: float | None = None) -> PhaseReplay:
    """Replay `GpuQuiet.history` in order (from `since`, a monotonic time): a run's evidence that every timing phase
    had the device to itself, from the record the coordinator keeps under its lock (so in the order states changed).

    What it cannot see is GPU work no one announced; that is what the grader's own checks are for."""
    holding: set[int] = set()
    warming: set[int] = set()
    tearing: set[int] = set()
    holds = beside_warm = beside_tear = 0
    broken: list[str] = []
    went: list[str] = []
    for t, event, pid in history:
        if since is not None and t < since:
            continue
        if event.startswith("hold:"):
            others = sorted(holding - {pid})
            if others:
                broken.append(f"{event} of {pid} at {t:.6f} beside the hold of {others}")
            holding.add(pid)
            holds += 1
            beside_warm += bool(warming - {pid})
            beside_tear += bool(tearing - {pid})
        elif event == "teardown":
            tearing.add(pid)
        elif event == "reaped":
            tearing.discard(pid)
        elif event == "release":
            holding.discard(pid)
        elif event in ("go", "prepare"):
            if holding:
                went.append(f"{event} of {pid} at {t:.6f} beside the hold of {sorted(holding)}")
            warming.add(pid)
        elif event in ("warmed", "forgotten"):
            warming.discard(pid)
    return PhaseReplay(timing_phases=holds, beside_timing=tuple(broken), warm_ups_beside_timing=beside_warm,
                       go_beside_timing=tuple(went), beside_teardown=beside_tear)


_QUIETS: dict[str, GpuQuiet] = {}
_QUIETS_LOCK = threading.Lock()


def quiet_for(device: str) -> GpuQuiet:
    """The process's coordinator of `device` (created on first use, then the same object for every pool)."""
    key = normalize_device(device)
    with _QUIETS_LOCK:
        q = _QUIETS.get(key)
        if q is None:
            q = _QUIETS[key] = GpuQuiet(key)
        return q


QUIET = quiet_for("cuda:0")  # the process's default GPU (device "cuda")


class Worker:
    """One spawned worker process in its own process group; used for exactly one job, then killed."""

    def __init__(self, dsl: str, *, device: str = "cuda", env: dict[str, str] | None = None,
                 python: str = sys.executable, gpu_arch: str | None = None) -> None:
        self.dsl = dsl
        self.device_key = normalize_device(device)  # the quiet rule's key
        self.device = device = device_kind(device)  # what the worker runs on: cuda or cpu
        self.quiet = quiet_for(self.device_key)
        if device == "cuda" and gpu_arch is None:  # the device's own arch, never a default (mkb.measure.detect_arch)
            from mkb.measure._device import UnsupportedGpu, detect_arch

            try:
                gpu_arch = detect_arch()
            except UnsupportedGpu:  # no device found: the worker's own CUDA start fails and says so (infra_error)
                gpu_arch = None
        job_r, self._job_w = os.pipe()
        self._res_r, res_w = os.pipe()
        self.log = tempfile.NamedTemporaryFile(prefix=f"mkb-worker-{dsl}-", suffix=".log", delete=False)
        full_env = without_secrets(os.environ if env is None else env)  # no credential for a candidate to print (mkb._secrets)
        backend = backend_from_target(backend_target(dsl), dsl)
        if device == "cuda" and gpu_arch:  # the DSL's environment (arch, CUDA path, math policy) before it is first imported
            full_env.update(backend.environment(gpu_arch))
            full_env["CUDA_VISIBLE_DEVICES"] = visible_device(self.device_key, env)
        # the one folder the worker may write once its candidate can run (mkb.grader._fs_guard): its temporary files
        # and the DSL's compile cache, private to this single-use worker and removed with it
        self.scratch = tempfile.mkdtemp(prefix=f"mkb-worker-{dsl}-")
        private = getattr(backend, "private_environment", None)  # added to the protocol after v1
        full_env.update({SCRATCH_ENV: self.scratch, "TMPDIR": self.scratch,
                         **(private(Path(self.scratch)) if private is not None else {})})
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, full_env.get("PYTHONPATH", "")) if p)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.spawned_at = time.monotonic()
        self.proc = subprocess.Popen(
            [python, "-m", "mkb.grader._worker", "--job-fd", str(job_r), "--result-fd", str(res_w),
             "--dsl", dsl, "--device", device, "--backend", backend_target(dsl)],
            pass_fds=(job_r, res_w), stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True, env=full_env, close_fds=True,
        )
        os.close(job_r)
        os.close(res_w)
        self.reader = LineReader(self._res_r)
        self.ready: dict | None = None
        self.ready_error: str | None = None
        self.imported_at: float | None = None  # parent's monotonic clock
        self.go_at: float | None = None
        self._forgotten = False
        self._urgent = False  # taken by a grading that waits for it (GpuQuiet.urge)
        self._deferred = False  # its `go` was deferred behind a grading's timing phase (GpuQuiet's history says so)
        self._reaped = False
        self._reaped_in_background = False  # kill(wait=False): the reaper removes the scratch folder once it is gone
        self._reap_done = threading.Event()  # set once the one reap (wait, folder, record, fds) is over
        self._state_lock = threading.Lock()
        self._started = threading.Event()
        # reads the result channel until `ready` (imports -> go -> GPU warm-up); the job's reader takes over after
        self._watcher = threading.Thread(target=self._watch_start, name=f"mkb-start-{self.proc.pid}", daemon=True)
        self._watcher.start()
        _REAPER.start()  # here, with the worker, so that no kill waits for a thread to start

    def _send(self, msg: dict) -> None:
        if self._forgotten:
            raise OSError("the worker was killed")
        write_msg(self._job_w, msg)

    def send_go(self) -> None:
        """Let a worker waiting in a `hold` go on (after `self.quiet.hold`)."""
        try:
            self._send({"type": "go"})
        except OSError:
            pass

    def _finish_start(self, ready: dict | None, error: str | None) -> None:
        with self._state_lock:
            if self.ready is None and self.ready_error is None:
                self.ready, self.ready_error = ready, error
        self.quiet.warmed(self)
        self._started.set()

    def _watch_start(self) -> None:
        msg = self.reader.read(time.monotonic() + 3600.0)  # imports: the limit is enforced in wait_ready
        if isinstance(msg, dict) and msg.get("type") == "imported":
            self.imported_at = time.monotonic()
            self.quiet.want_go(self)
            while True:
                if self.go_at is not None:  # the GPU warm-up runs: bounded, so that it cannot block holds for ever
                    msg = self.reader.read(self.go_at + WARM_LIMIT_S)
                    break
                msg = self.reader.read(time.monotonic() + 0.5)
                if msg != "timeout":
                    break
                self.quiet.recheck()  # a `go` deferred behind a grading's timing phase runs out after DEFER_GO_S
        if isinstance(msg, dict) and msg.get("type") == "ready":
            self._finish_start(msg, None)
            return
        if msg == "timeout" and self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGKILL)  # a GPU warm-up that hangs: killed (reaped by its owner), it blocks nobody
        err = (f"{msg['what']}\n{msg.get('log', '')}" if msg.get("what") else msg.get("log", "")) \
            if isinstance(msg, dict) else f"worker start: {msg}"
        self._finish_start(None, err + "\n" + self.log_text())

    def quiet_wait_s(self) -> float:
        """Seconds this worker spent (so far) waiting for `go` after its imports."""
        if self.imported_at is None:
            return 0.0
        return (self.go_at if self.go_at is not None else time.monotonic()) - self.imported_at

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, limit_s: float) -> bool:
        """Block until the warm start finished (True) or failed / ran past `limit_s` (False, ready_error set).

        Time spent waiting for `go` (others were timing) does not count against `limit_s`.
        """
        while not self._started.is_set():
            left = self.spawned_at + limit_s + self.quiet_wait_s() - time.monotonic()
            if left <= 0 and (self.imported_at is None or self.go_at is not None):
                with self._state_lock:
                    if self.ready is None and self.ready_error is None:
                        self.ready_error = f"worker start: timeout after {limit_s:.0f} s\n" + self.log_text()
                break
            self._started.wait(min(max(left, 0.05), 0.5))
        return self.ready is not None and self.ready_error is None

    def send_job(self, job: dict) -> None:
        self._send(job)

    def log_text(self, limit: int = 2_000_000) -> str:
        """The log's last `limit` bytes (a candidate writes to it as it likes: never read whole)."""
        try:
            with open(self.log.name, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - limit))
                data = f.read(limit)
            return data.decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, *, wait: bool = True) -> int | None:
        """Kill the whole process group (the worker and anything it started); returns the exit status.

        `wait=False` reaps in the background: tearing down a large CUDA context takes a while, and the
        verdict of a worker that finished its job does not depend on how it ends.
        """
        self.quiet.forget(self)
        if self.go_at is not None and not self._reaped:  # it has a CUDA context: its teardown is in the record until reaped
            self.quiet.note("teardown", self.pid)
        if self.proc.returncode is None:  # once reaped, its pid may lead another process's group (a new worker's)
            signal_group(self.proc.pid, signal.SIGKILL)
        if not wait:
            self._reaped_in_background = True
            _REAPER.submit(self)
            return None
        return self._reap()

    def _reap(self, *, timeout: float = REAP_LIMIT_S, join_s: float = 10.0) -> int | None:
        with self._state_lock:
            first = not self._reaped
            self._reaped = True
            done = self._reap_done
        if not first:  # another thread reaps it: a waiting kill returns once that reap (its folder's removal) is over
            done.wait(timeout + join_s + 5.0)
            return self.proc.returncode
        try:
            return self._reap_once(timeout=timeout, join_s=join_s)
        finally:
            done.set()

    def _reap_once(self, *, timeout: float, join_s: float) -> int | None:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        # dead: nothing of it writes there any more (still alive after `timeout`: removed all the same, as cleanup always did)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.go_at is not None and rc is not None:  # still there after 30 s: its teardown stays in the record
            self.quiet.note("reaped", self.pid)
        if self._watcher is not threading.current_thread():
            self._watcher.join(join_s)
        fds = (self._job_w, self._res_r) if not self._watcher.is_alive() else (self._job_w,)
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        return rc

    def cleanup(self) -> None:
        """Remove the worker's log and scratch folder. Where `kill(wait=False)` left a reaper running, the folder is
        its to remove once the process is gone (grader 2.24): never while the grading waits, nor while a process of the
        worker could still write there. (Meant to shorten the grading's teardown; on the H200 it did not:
        events/h200-grader-bench-2-24.)"""
        try:
            os.unlink(self.log.name)
        except OSError:
            pass
        if not self._reaped_in_background:
            shutil.rmtree(self.scratch, ignore_errors=True)


class WorkerPool:
    """Keeps `depth` workers per DSL spawned ahead of need; `take` hands out the oldest and refills.

    A worker's warm start (torch + the DSL's imports + CUDA init, 8-10 s cold on the H200 host)
    overlaps the previous evaluations, so a queue of gradings pays it once; its GPU part waits for
    quiet (the device's `GpuQuiet`, the module docstring's rule), so it never runs beside a timing
    loop on the same GPU. Workers are single-use: whatever a candidate did to its process dies with it.

    Refill in batches: the GPU part of a warm start (CUDA and profiler init, 4-6 s on the H200,
    `profiler_init_at_warm_start_s` in events/h200-grader-bench; `warm_start_s` since grader 2.10) is exclusive with timing, so a
    timing phase waits for any warm-up already running. Spawning one successor per take puts one
    such warm-up in front of nearly every timing phase; with `low_water` below `depth - 1` the pool
    spawns `depth - low_water` workers together once only `low_water` are left, their imports end
    together, they get `go` in the same quiet gap and warm up side by side: one stall per batch.
    """

    def __init__(self, dsls: tuple[str, ...] | None = None, *, device: str = "cuda", prestart: bool = True,
                 env: dict[str, str] | None = None, depth: int = 1, refill_on_take: bool = True,
                 trusted: TrustedCache | None = None, low_water: int | None = None) -> None:
        if depth < 1 or (low_water is not None and not 0 <= low_water < depth):
            raise ValueError(f"WorkerPool needs depth >= 1 and 0 <= low_water < depth (got {depth}, {low_water})")
        self.device = normalize_device(device)
        self.env = env
        self.depth = depth
        self.low_water = depth - 1 if low_water is None else low_water  # default: a successor for every take
        self.refill_on_take = refill_on_take
        self._ready: dict[str, list[Worker]] = {}
        self._lock = threading.Lock()
        self.spawned = 0
        self.closed = False
        if dsls is None:  # every registered DSL
            from mkb.dsl import dsl_names

            dsls = dsl_names()
        self.dsls = tuple(dsls)
        # eager timings and launch floors measured by this pool's workers (or shared with another pool of the session)
        self.trusted = trusted if trusted is not None else TrustedCache()
        import mkb.measure  # noqa: F401 - the trusted cache's keys need it (torch): imported here, not on the first grading's clock
        if prestart:
            for d in self.dsls:
                self.refill(d)

    def _spawn(self, dsl: str) -> Worker:
        w = Worker(dsl, device=self.device, env=self.env)
        self.spawned += 1
        with self._lock:
            self._ready.setdefault(dsl, []).append(w)
        return w

    def refill(self, dsl: str | None = None) -> None:
        """Spawn workers until `depth` wait for each DSL (or for `dsl`)."""
        for d in ([dsl] if dsl else self.dsls):
            with self._lock:
                n = len(self._ready.get(d, []))
            for _ in range(self.depth - n):
                self._spawn(d)

    def take(self, dsl: str) -> Worker:
        """The oldest warm worker for `dsl` (spawning one if there is none); refills once `low_water` are left.

        With `refill_on_take=False` no successor is spawned until `refill()` (the benchmark does this
        so that no worker imports while another one times a kernel).
        """
        if self.closed:
            raise RuntimeError("the worker pool is closed")
        w = None
        while True:
            with self._lock:
                queue = self._ready.get(dsl, [])
                w = queue.pop(0) if queue else None
            if w is None or w.alive():
                break
            w.kill()
            w.cleanup()
        if w is None:
            w = Worker(dsl, device=self.device, env=self.env)
            self.spawned += 1
        if self.refill_on_take:
            with self._lock:
                left = len(self._ready.get(dsl, []))
            if left <= self.low_water:
                self.refill(dsl)
        if dsl not in self.dsls:
            self.dsls += (dsl,)
        return w

    def take_ready(self, dsl: str) -> Worker | None:
        """The oldest worker of `dsl` whose warm start has finished (None if there is none: nothing is spawned cold).

        For a prefetch (mkb.grader._prefetch): only a ready spare can prepare a plan now; refills like `take`."""
        if self.closed:
            return None
        with self._lock:
            queue = self._ready.get(dsl, [])
            w = next((x for x in queue if x._started.is_set() and x.ready is not None and x.ready_error is None
                      and x.alive()), None)
            if w is None:
                return None
            queue.remove(w)
            left = len(queue)
        if self.refill_on_take and left <= self.low_water:
            self.refill(dsl)
        return w

    def warm(self) -> dict[str, int]:
        """pid of the next waiting worker of each DSL (for tests and the benchmark)."""
        with self._lock:
            return {d: ws[0].pid for d, ws in self._ready.items() if ws}

    def wait_warm(self, limit_s: float = 180.0) -> None:
        with self._lock:
            ws = [w for q in self._ready.values() for w in q]
        for w in ws:
            w.wait_ready(limit_s)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            ws, self._ready = [w for q in self._ready.values() for w in q], {}
        for w in ws:
            w.kill()
            w.cleanup()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
