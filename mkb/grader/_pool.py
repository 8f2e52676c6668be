"""Single-use grader workers and the pool that keeps the next one spawned, imported and CUDA-initialised."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mkb.grader._backends import backend_from_target, backend_target
from mkb.grader._protocol import LineReader, write_msg
from mkb.grader._session import TrustedCache

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class Worker:
    """One spawned worker process in its own process group; used for exactly one job, then killed."""

    def __init__(self, dsl: str, *, device: str = "cuda", env: dict[str, str] | None = None,
                 python: str = sys.executable, gpu_arch: str = "sm_90a") -> None:
        self.dsl, self.device = dsl, device
        job_r, self._job_w = os.pipe()
        self._res_r, res_w = os.pipe()
        self.log = tempfile.NamedTemporaryFile(prefix=f"mkb-worker-{dsl}-", suffix=".log", delete=False)
        full_env = dict(os.environ if env is None else env)
        if device == "cuda":  # the DSL's environment (arch, CUDA path, math policy) before it is first imported
            full_env.update(backend_from_target(backend_target(dsl), dsl).environment(gpu_arch))
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

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, limit_s: float) -> bool:
        """Block until the warm start finished (True) or failed / ran past `limit_s` (False, ready_error set)."""
        if self.ready is not None:
            return True
        if self.ready_error is not None:
            return False
        msg = self.reader.read(self.spawned_at + limit_s)
        if isinstance(msg, dict) and msg.get("type") == "ready":
            self.ready = msg
            return True
        self.ready_error = (msg.get("log", "") if isinstance(msg, dict) else f"worker start: {msg}") + "\n" + self.log_text()
        return False

    def send_job(self, job: dict) -> None:
        write_msg(self._job_w, job)

    def log_text(self, limit: int = 2_000_000) -> str:
        try:
            with open(self.log.name, "rb") as f:
                data = f.read()
            return data[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, *, wait: bool = True) -> int | None:
        """Kill the whole process group (the worker and anything it started); returns the exit status.

        `wait=False` reaps in the background: tearing down a large CUDA context takes a while, and the
        verdict of a worker that finished its job does not depend on how it ends.
        """
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if not wait:
            threading.Thread(target=self._reap, name=f"mkb-reap-{self.proc.pid}", daemon=True).start()
            return None
        return self._reap()

    def _reap(self) -> int | None:
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        for fd in (self._job_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        return rc

    def cleanup(self) -> None:
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


class WorkerPool:
    """Keeps one warm worker per DSL spawned ahead of need; `take` hands it out and spawns its successor.

    A worker's warm start (torch + the DSL's imports + CUDA init, 8-10 s cold on the H200 host)
    overlaps the previous evaluation, so a queue of gradings pays it once. Workers are single-use:
    whatever a candidate did to its process dies with it.
    """

    def __init__(self, dsls: tuple[str, ...] = ("cute", "tirx"), *, device: str = "cuda", prestart: bool = True,
                 env: dict[str, str] | None = None, depth: int = 1, refill_on_take: bool = True,
                 trusted: TrustedCache | None = None) -> None:
        self.device = device
        self.env = env
        self.depth = depth
        self.refill_on_take = refill_on_take
        self._ready: dict[str, list[Worker]] = {}
        self._lock = threading.Lock()
        self.spawned = 0
        self.closed = False
        self.dsls = tuple(dsls)
        # eager timings and launch floors measured by this pool's workers (or shared with another pool of the session)
        self.trusted = trusted if trusted is not None else TrustedCache()
        if prestart:
            for d in dsls:
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
        """The oldest warm worker for `dsl` (spawning one if there is none) and, at once, its successor.

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
            self.refill(dsl)
        if dsl not in self.dsls:
            self.dsls += (dsl,)
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
