"""Device code made ahead for queued jobs, outside the GPU, so that a grading's compile finds it built (grader 2.17).

Why: a queue grades one job at a time per GPU, and the candidate's compile is the largest phase of a grading (0.70-1.26
s mean on the H200 hosts measured; DESIGN, Throughput of one GPU). For a DSL whose compile is mostly a step that needs
no GPU (TIRx: nvcc, 71-84% of it; `events/h200-precompile-probe`), that step can run while the job waits, beside
another grading's timing, if no code of the candidate's can reach the GPU there. So for each queued job of such a DSL:

1. a sandbox (`mkb.grader._precompile_child sources`) runs the candidate's `solve` with launching stubbed and the
   device compiler replaced by a recorder. It confines itself before any candidate code runs (writes only beneath
   its own folder, so it cannot open the GPU's device files; the grader's seccomp filter; a CPU-time limit, low
   priority) and refuses to run where it cannot;
2. a trusted builder (`... build`), confined the same way, compiles each recorded source as the worker's own build
   would, into a folder the sandbox never could write;
3. the worker, told the folder in its job, reads a build there whose key is that of its own compiler call (the key
   names every input of the nvcc command line; `mkb.dsl.tirx._device_code_key`), and compiles anything else itself.

What the sandbox prints can only choose which sources get built, never which bytes a key maps to; a kernel the
sandbox fails on, or that is not ready when its grading starts, is compiled in the worker as before. Each verdict's
compile figures record what it got (`CompileFigures.device_code`). The sandbox runs candidate code beside a timing
phase on the CPU only (as spares' imports do); at most `slots` (a quarter of the host's cores, up to 4) run at once.

Both are forked from one fork server per DSL (`_ForkServer`; `_precompile_child serve`), which has imported torch and
the DSL once with no GPU visible: a sandbox started afresh spent 10-15 s importing them on the slower H200 hosts, and
a deep queue outran its slots (`events/h200-grader-2-17-queue`). Waiting jobs are started in the order the queue
will grade them (`order`), not the order they came.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from mkb._procs import signal_group
from mkb._secrets import without_secrets
from mkb.grader._config import READ_GUARD_DEFAULT
from mkb.grader._fs_guard import READ_GUARD_ENV

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
SANDBOX_LIMIT_S = 90.0  # wall seconds for the sandbox (one traced solve)
BUILD_LIMIT_S = 180.0  # wall seconds for the builder (nvcc per source)
SERVER_START_S = 180.0  # wall seconds for a fork server's imports
MAX_SOURCES = 32  # sources one kernel may have built ahead; more are left to the worker
MAX_SOURCE_BYTES = 4 << 20  # all of a kernel's sources together
MAX_OUTPUT_BYTES = 8 << 20  # what a sandbox may print


@dataclass(frozen=True)
class PrecompilerFigures:
    """One precompiler's servers (what each said when ready) and its pauses for timing phases (count, seconds)."""

    servers: dict[str, dict]
    pauses: int
    paused_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeviceCode:
    """What a grading got made ahead: `state` ready (its builds are in `folder`), late (not finished when the grading
    started: stopped), failed (the sandbox or the builder did not finish; `note` says why), or off."""

    state: str
    folder: Path | None = None
    seconds: float | None = None  # request to built
    sources: int = 0
    builds: int = 0
    note: str = ""
    sandbox: str = ""  # how the sandbox that ran the candidate's code was confined (its guards, one line)
    waited_s: float | None = None  # request to a slot's start (the queue ahead of it)
    sandbox_s: float | None = None  # the sandbox's fork to its end (the fork server's start included, where it waited)
    build_s: float | None = None  # the builder's

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("folder")
        return d


OFF = DeviceCode("off")


@dataclass(frozen=True)
class DeviceCodeTally:
    """One DSL's device code over a run's gradings: each state's count (`none`: the grading recorded none), the
    worker's reads, and the candidate compile's mean with builds read against without (the phase a precompile takes
    off). The one tally the bench and the queue run both print."""

    states: dict[str, int]
    hits: int
    misses: int
    uncacheable: int
    n_read: int
    compile_s_mean_read: float | None
    n_not_read: int
    compile_s_mean_not_read: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tally_device_code(gradings: Iterable[tuple[str, dict | None, float | None]]) -> dict[str, DeviceCodeTally]:
    """Per DSL, the tally of `(dsl, the compile stage's device_code record, its compile_s)` for each grading."""
    acc: dict[str, dict] = {}
    for dsl, rec, compile_s in gradings:
        rec = rec if isinstance(rec, dict) else {}
        t = acc.setdefault(dsl, {"states": {}, "hits": 0, "misses": 0, "uncacheable": 0, "read": [], "not_read": []})
        state = str(rec.get("state")) if rec else "none"
        t["states"][state] = t["states"].get(state, 0) + 1
        for k in ("hits", "misses", "uncacheable"):
            t[k] += int(rec.get(k) or 0)
        if compile_s is not None:
            (t["read"] if rec.get("hits") else t["not_read"]).append(compile_s)
    return {dsl: DeviceCodeTally(states=t["states"], hits=t["hits"], misses=t["misses"], uncacheable=t["uncacheable"],
                                 n_read=len(t["read"]), compile_s_mean_read=statistics.fmean(t["read"]) if t["read"] else None,
                                 n_not_read=len(t["not_read"]),
                                 compile_s_mean_not_read=statistics.fmean(t["not_read"]) if t["not_read"] else None)
            for dsl, t in acc.items()}


class _Task:
    def __init__(self, key: tuple, folder: Path, job: Any, backend: Any) -> None:
        self.key = key
        self.folder = folder
        self.job, self.backend = job, backend
        self.requested = time.monotonic()
        self.cancelled = threading.Event()
        self.child: _Child | None = None  # the sandbox or builder running now
        self.phase = "waiting for a slot"  # where a task stopped as late was (its note)
        self.lock = threading.Lock()
        self.future: concurrent.futures.Future = concurrent.futures.Future()


class _Child:
    """One fork of a fork server, as the server reports it: its pid once confined, its exit once ended."""

    def __init__(self, ident: int) -> None:
        self.id = ident
        self.pid: int | None = None
        self.guards = ""
        self.rc: int | None = None
        self.error = ""
        self.started = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._killed = False

    def kill(self) -> None:
        """Kill its session now, or as soon as its pid is known (a fork asked for and then stopped never runs on)."""
        with self._lock:
            self._killed = True
            pid = self.pid
        if pid is not None:
            _kill_session(pid)

    def _on_pid(self, pid: int, guards: str) -> None:
        with self._lock:
            self.pid, self.guards = pid, guards
            killed = self._killed
        if killed:
            _kill_session(pid)
        self.started.set()

    def _end(self, rc: int | None, error: str = "") -> None:
        self.rc, self.error = rc, error
        self.started.set()
        self.done.set()


class _ForkServer:
    """`python -m mkb.grader._precompile_child serve <dsl>`: torch and the DSL imported once, a confined fork per
    sandbox or builder; what it says is read by one thread into each `_Child`."""

    def __init__(self, python: str, dsl: str, env: dict[str, str], folder: Path,
                 on_pid: Callable[[_Child, int, str], None]) -> None:
        self.dsl = dsl
        self._on_pid = on_pid
        self._err = open(folder / f"server-{dsl}.err", "w+b")
        self.proc = subprocess.Popen([python, "-m", "mkb.grader._precompile_child", "serve", dsl], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     start_new_session=True, close_fds=True, cwd=folder)
        self.ready = threading.Event()
        self.info: dict = {}
        self._children: dict[int, _Child] = {}
        self._ids = 0
        self._lock = threading.Lock()
        self._alive = True
        threading.Thread(target=self._read, name=f"mkb-precompile-server-{dsl}", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self._alive and self.proc.poll() is None

    def why_gone(self) -> str:
        self._err.flush()
        self._err.seek(0)
        tail = self._err.read()[-600:].decode(errors="replace").strip()
        return f"the fork server of {self.dsl} ended (exit {self.proc.poll()}): {tail or 'no stderr'}"

    def start(self, mode: str, args: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> _Child:
        with self._lock:
            self._ids += 1
            child = _Child(self._ids)
            if not self._alive:
                child._end(None, self.why_gone())
                return child
            self._children[child.id] = child
            line = json.dumps({"id": child.id, "mode": mode, "args": args, "env": env, "stdout": str(stdout),
                               "stderr": str(stderr)}) + "\n"
            try:
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                self._children.pop(child.id, None)
                child._end(None, self.why_gone())
        return child

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("ready"):
                self.info = msg
                self.ready.set()
                continue
            with self._lock:
                child = self._children.get(msg.get("id"))
            if child is None:
                continue
            if "pid" in msg:
                self._on_pid(child, int(msg["pid"]), str(msg.get("guards", "")))
            elif "exit" in msg or "error" in msg:
                with self._lock:
                    self._children.pop(child.id, None)
                child._end(msg.get("exit"), str(msg.get("error", "")))
        with self._lock:  # the server has gone: every fork it had is reported ended
            self._alive = False
            left = list(self._children.values())
            self._children.clear()
        self.proc.wait()
        for child in left:
            child._end(None, self.why_gone())
        self.ready.set()

    def pids(self) -> list[int]:
        """The server's and its running forks' (each leads its own session)."""
        with self._lock:
            return [self.proc.pid, *(c.pid for c in self._children.values() if c.pid is not None)]

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the server kills its forks' sessions and exits
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            _kill_session(self.proc.pid)
            self.proc.wait()
        self._err.close()


class Precompiler:
    """The precompiles of one queue: `request(job)` when a job is queued, `take(job)` when its grading starts,
    `release(code)` when it ends, `close()` with the queue. `order()`, where given, lists the queued jobs in the order
    they will be graded: a free slot starts the first of them that waits."""

    def __init__(self, *, gpu_arch: str, size: str, slots: int | None = None, root: Path | None = None,
                 python: str | None = None, order: Callable[[], list] | None = None, read_guard: str = READ_GUARD_DEFAULT) -> None:
        self.gpu_arch, self.size = gpu_arch, size
        self.read_guard = read_guard  # GraderConfig.read_guard: "landlock" confines each fork's reads too
        self.python = python or sys.executable
        self.root = Path(tempfile.mkdtemp(prefix="mkb-precompile-", dir=root))
        # a quarter of the host's cores (at most 4): the sandboxes and nvcc run beside the gradings' own CPU work
        self.slots = slots or max(1, min(4, (os.cpu_count() or 1) // 4))
        self._order = order
        self._tasks: dict[tuple, list[_Task]] = {}  # per kernel, one task per request (a kernel queued twice gets two)
        self._waiting: list[_Task] = []
        self._servers: dict[str, _ForkServer] = {}
        self._broken: dict[str, str] = {}  # a DSL whose server died before it was ready is not started again
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._paused_at: float | None = None  # set while the device times a grading: every fork is stopped
        self.paused_s = 0.0
        self.pauses = 0

    @staticmethod
    def _key(job: Any) -> tuple:
        path = os.path.realpath(job.kernel_path)  # a symlink loop names itself, never raises
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            stamp = None
        return (str(job.problem), job.dsl, path, stamp)

    def request(self, job: Any) -> bool:
        """Start making `job`'s device code when a slot frees; once per grading asked for (False: its DSL makes none
        ahead, or anything went wrong: a precompile never fails a submission)."""
        try:
            return self._request(job)
        except Exception:  # noqa: BLE001 - the grading compiles in its worker, as without a precompile
            return False

    def _request(self, job: Any) -> bool:
        from mkb.grader._backends import backend_from_target, backend_target

        backend = backend_from_target(backend_target(job.dsl), job.dsl)
        if not getattr(backend, "precompiles", False):
            return False
        key = self._key(job)
        with self._cv:
            if self._closed:
                return False
            task = _Task(key, Path(tempfile.mkdtemp(prefix="job-", dir=self.root)), job, backend)
            self._tasks.setdefault(key, []).append(task)
            self._waiting.append(task)
            if len(self._threads) < self.slots:  # the slots start with the first requests
                t = threading.Thread(target=self._slot, name=f"mkb-precompile-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
            self._cv.notify()
        return True

    def take(self, job: Any) -> DeviceCode:
        """What was made for `job`, now: ready, or the task stopped (late) or failed; OFF where none was asked. Never
        raises: a precompile never fails a grading."""
        try:
            return self._take(job)
        except Exception as exc:  # noqa: BLE001
            return DeviceCode("failed", note=f"take: {type(exc).__name__}: {exc}"[:500])

    def _take(self, job: Any) -> DeviceCode:
        key = self._key(job)
        with self._lock:
            asked = self._tasks.get(key)
            task = asked.pop(0) if asked else None
            if asked == []:
                del self._tasks[key]
        if task is None:
            return OFF
        fut = task.future
        if fut.done() and not fut.cancelled():
            code = fut.result()
            if code.state != "ready":
                shutil.rmtree(task.folder, ignore_errors=True)
            return code
        self._stop(task)
        return DeviceCode("late", seconds=round(time.monotonic() - task.requested, 3), note=f"stopped {task.phase}")

    def release(self, code: DeviceCode) -> None:
        if code.folder is not None:  # the task's folder, which holds `out`
            shutil.rmtree(code.folder.parent, ignore_errors=True)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            tasks = [t for asked in self._tasks.values() for t in asked]
            self._tasks.clear()
            self._cv.notify_all()
        self.pause(False)  # a stopped server can neither reap a killed fork nor read the end of its input
        for t in tasks:
            self._stop(t)
        for t in self._threads:
            t.join()
        for server in self._servers.values():
            server.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def pause(self, held: bool) -> None:
        """Stop (SIGSTOP) every fork server and fork while the queue's device is in a timing phase, continue them after
        (`GpuQuiet.listen`): their CPU work beside a timing phase delayed the timing thread's wake-ups enough to fail a
        passing baseline's side-work check on the H200 (`events/h200-grader-bench-2-18-ab`). A fork reported while
        stopped is stopped at once; a stopped one is still killed when late."""
        with self._lock:
            held = held and not self._closed  # a closing precompiler's forks go on, to exit
            if held == (self._paused_at is not None):
                return
            now = time.monotonic()
            if held:
                self._paused_at, self.pauses = now, self.pauses + 1
            else:
                self.paused_s += now - (self._paused_at or now)
                self._paused_at = None
            for server in self._servers.values():
                for pid in server.pids():
                    signal_group(pid, signal.SIGSTOP if held else signal.SIGCONT)

    def _on_pid(self, child: _Child, pid: int, guards: str) -> None:
        with self._lock:  # against a pause's list of pids: a fork is either in it or stopped here
            child._on_pid(pid, guards)
            if self._paused_at is not None:
                signal_group(pid, signal.SIGSTOP)

    def servers(self) -> dict[str, dict]:
        """What each fork server said when ready (its import seconds, threads, pid), for logs and tests."""
        return {dsl: dict(s.info) for dsl, s in self._servers.items()}

    def figures(self) -> PrecompilerFigures:
        """The servers and how often and how long every fork was stopped for a timing phase, so far (the A/B's record
        of what the pause cost the precompiles)."""
        with self._lock:
            paused_s = self.paused_s + (time.monotonic() - self._paused_at if self._paused_at is not None else 0.0)
            return PrecompilerFigures(servers=self.servers(), pauses=self.pauses, paused_s=paused_s)

    # ---------------- the slots ----------------

    def _slot(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
            upcoming = self._upcoming()  # outside our lock: the queue's order takes the queue's
            with self._cv:
                task = self._pick(upcoming)
            if task is None or not task.future.set_running_or_notify_cancel():
                continue  # another slot took it, or it was stopped while it waited
            try:
                code = self._make(task)
            except Exception as exc:  # noqa: BLE001 - a precompile never fails a grading
                code = DeviceCode("failed", note=f"{type(exc).__name__}: {exc}"[:500])
            task.future.set_result(code)

    def _upcoming(self) -> dict[tuple, int]:
        if self._order is None:
            return {}
        try:
            jobs = self._order()
        except Exception:  # noqa: BLE001 - order unknown: the order they came
            return {}
        rank: dict[tuple, int] = {}
        for i, job in enumerate(jobs):
            rank.setdefault(self._key(job), i)
        return rank

    def _pick(self, upcoming: dict[tuple, int]) -> _Task | None:
        """The waiting task graded soonest (by `upcoming`; one not in it after those that are, in the order asked)."""
        if not self._waiting:
            return None
        best = min(range(len(self._waiting)), key=lambda i: (upcoming.get(self._waiting[i].key, len(upcoming)), i))
        return self._waiting.pop(best)

    # ---------------- one job ----------------

    def _stop(self, task: _Task) -> None:
        task.cancelled.set()
        task.future.cancel()  # succeeds only while it waits for a slot
        with self._cv:
            if task in self._waiting:
                self._waiting.remove(task)
        with task.lock:
            child = task.child
        if child is not None:
            child.kill()
        if task.future.cancelled():
            shutil.rmtree(task.folder, ignore_errors=True)
        else:  # its slot removes the folder once its fork is gone
            task.future.add_done_callback(lambda _f, d=task.folder: shutil.rmtree(d, ignore_errors=True))

    def prestart(self, dsls: Sequence[str]) -> None:
        """Start the fork server of each of `dsls` that makes device code ahead now, so that the first jobs do not wait
        for its imports; never raises (a server that fails to start fails its jobs, which compile in their workers)."""
        from mkb.grader._backends import backend_from_target, backend_target

        for dsl in dsls:
            try:
                backend = backend_from_target(backend_target(dsl), dsl)
                if getattr(backend, "precompiles", False):
                    self._started(backend)
            except Exception:  # noqa: BLE001
                pass

    def _started(self, backend: Any) -> _ForkServer:
        """The DSL's fork server, started now where there is none or it has ended (raises where it never could)."""
        dsl = backend.name
        with self._lock:
            if dsl in self._broken:
                raise RuntimeError(self._broken[dsl])
            if self._closed:
                raise RuntimeError("the precompiler is closed")
            server = self._servers.get(dsl)
            if server is None or (server.ready.is_set() and not server.alive):
                if server is not None:
                    server.close()
                folder = self.root / f"server-{dsl}"
                folder.mkdir(exist_ok=True)
                server = _ForkServer(self.python, dsl, self._env(backend, folder), self.root, self._on_pid)
                if self._paused_at is not None:
                    signal_group(server.proc.pid, signal.SIGSTOP)
                self._servers[dsl] = server
            return server

    def _server(self, backend: Any, task: _Task) -> _ForkServer:
        """The DSL's fork server, started (again, if it has ended since) and ready; raises with why it is not."""
        dsl = backend.name
        server = self._started(backend)
        deadline = time.monotonic() + SERVER_START_S
        while not server.ready.wait(0.1):
            if task.cancelled.is_set():
                raise RuntimeError("stopped while the fork server started")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fork server of {dsl} was not ready in {SERVER_START_S:.0f} s")
        if not server.info:  # ended before it was ready: its imports fail, and would each time
            with self._lock:
                self._broken[dsl] = server.why_gone()
            raise RuntimeError(self._broken[dsl])
        return server

    def _run(self, task: _Task, mode: str, args: list[str], folder: Path, limit_s: float) -> tuple[int | None, str, str, str]:
        """One fork of the DSL's server, killed with its session at `limit_s` or when the task is stopped;
        (rc, stdout, stderr, the guards line it reported before any candidate code ran)."""
        if task.cancelled.is_set():
            return None, "", "stopped", ""
        server = self._server(task.backend, task)
        out_p, err_p = task.folder / f"{mode}.out", task.folder / f"{mode}.err"
        child = server.start(mode, args, self._job_env(task.backend, folder), out_p, err_p)
        with task.lock:
            task.child = child
        if task.cancelled.is_set():
            child.kill()
        deadline = time.monotonic() + limit_s
        while not child.done.wait(0.02):
            if task.cancelled.is_set() or time.monotonic() > deadline:
                child.kill()
                child.done.wait(10)
                break
        if child.pid is not None:
            _kill_session(child.pid)  # what the fork left behind in its session (a candidate's child) goes too
        stdout, stderr = _read(out_p, MAX_OUTPUT_BYTES + 1), _read(err_p, 64 << 10)
        stopped = time.monotonic() > deadline or task.cancelled.is_set() or not child.done.is_set()
        stderr = (child.error + "\n" + stderr) if child.error else stderr
        return (None if stopped else child.rc), stdout, stderr[-2000:], child.guards

    @staticmethod
    def _job_env(backend: Any, folder: Path) -> dict[str, str]:
        """What a fork sets for its job: its temporary files and the DSL's own in its folder."""
        return {"TMPDIR": str(folder), "HOME": str(folder), **backend.private_environment(folder)}

    def _env(self, backend: Any, folder: Path) -> dict[str, str]:
        """A fork server's environment: the DSL's, no GPU visible, and the job environment of its own folder."""
        env = without_secrets(os.environ)  # the sandbox runs the candidate's code: no credential for it to print
        env.update(backend.environment(self.gpu_arch))
        env.update({"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", READ_GUARD_ENV: self.read_guard,
                    **self._job_env(backend, folder)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p)
        return env

    def _make(self, task: _Task) -> DeviceCode:
        t0, job, backend = task.requested, task.job, task.backend
        waited = round(time.monotonic() - t0, 3)
        kernel = Path(job.kernel_path).resolve()
        try:
            source = kernel.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            return DeviceCode("failed", note=f"cannot read the kernel: {exc}")
        if tuple(backend.static_rules(source)):
            return DeviceCode("failed", note="the kernel breaks a static rule (its grading says which)")
        sandbox = task.folder / "sandbox"
        out = task.folder / "out"
        build_tmp = task.folder / "build"
        for d in (sandbox, out, build_tmp):
            d.mkdir()
        copy = sandbox / "kernel.py"  # the sandbox reads its own copy: the file it was asked for may change meanwhile
        copy.write_text(source)
        task.phase, t1 = "in the sandbox", time.monotonic()
        rc, stdout, stderr, reported = self._run(task, "sources", [job.dsl, str(copy), str(job.problem), self.size,
                                                                   str(sandbox)], sandbox, SANDBOX_LIMIT_S)
        payload = _payload(stdout)
        times = {"waited_s": waited, "sandbox_s": round(time.monotonic() - t1, 3)}
        if rc != 0 or "sources" not in payload:
            return DeviceCode("failed", note=f"sandbox: {_why(payload, rc, stderr)}"[:500], **times)
        srcs = [s for s in payload["sources"] if isinstance(s, str)][:MAX_SOURCES]
        if sum(len(s) for s in srcs) > MAX_SOURCE_BYTES:
            return DeviceCode("failed", sources=len(srcs), note="sandbox: more source than is built ahead", **times)
        if not srcs:
            return DeviceCode("failed", note="sandbox: no device source recorded", **times)
        guards = reported.replace(str(sandbox), "<sandbox>")
        shutil.rmtree(sandbox, ignore_errors=True)  # nothing of the sandbox's is read from here on
        listing = build_tmp / "sources.json"
        listing.write_text(json.dumps(srcs))
        task.phase, t2 = "in the builder", time.monotonic()
        rc, stdout, stderr, _ = self._run(task, "build", [job.dsl, str(listing), str(out), self.gpu_arch], build_tmp,
                                          BUILD_LIMIT_S)
        payload = _payload(stdout)
        times["build_s"] = round(time.monotonic() - t2, 3)
        if rc != 0 or "keys" not in payload:
            return DeviceCode("failed", sources=len(srcs), note=f"builder: {_why(payload, rc, stderr)}"[:500], **times)
        shutil.rmtree(build_tmp, ignore_errors=True)
        return DeviceCode("ready", folder=out, seconds=round(time.monotonic() - t0, 3), sources=len(srcs),
                          builds=len(payload["keys"]), sandbox=guards, **times)


def _read(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def _kill_session(pid: int) -> None:
    """SIGKILL to the child's whole session (it was started in one of its own; nothing of it may leave it)."""
    signal_group(pid, signal.SIGKILL)


def _why(payload: dict, rc: int | None, stderr: str) -> str:
    """Why a child gave no result: what it said, else that it was stopped, else its exit and the end of its stderr."""
    return payload.get("error") or ("stopped" if rc is None else f"exit {rc}: {stderr.strip()[-300:]}")


def _payload(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("MKB_PRECOMPILE "):
            try:
                data = json.loads(line[len("MKB_PRECOMPILE "):])
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}
