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
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mkb.grader._precompile_child import GUARDS_FD_ENV

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
SANDBOX_LIMIT_S = 90.0  # wall seconds for the sandbox (imports, one traced solve)
BUILD_LIMIT_S = 180.0  # wall seconds for the builder (nvcc per source)
MAX_SOURCES = 32  # sources one kernel may have built ahead; more are left to the worker
MAX_SOURCE_BYTES = 4 << 20  # all of a kernel's sources together
MAX_OUTPUT_BYTES = 8 << 20  # what a sandbox may print


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

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("folder")
        return d


OFF = DeviceCode("off")


class _Task:
    def __init__(self, key: tuple, folder: Path) -> None:
        self.key = key
        self.folder = folder
        self.requested = time.monotonic()
        self.cancelled = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.future: concurrent.futures.Future | None = None


class Precompiler:
    """The precompiles of one queue: `request(job)` when a job is queued, `take(job)` when its grading starts,
    `release(code)` when it ends, `close()` with the queue."""

    def __init__(self, *, gpu_arch: str, size: str, slots: int | None = None, root: Path | None = None,
                 python: str | None = None) -> None:
        self.gpu_arch, self.size = gpu_arch, size
        self.python = python or sys.executable
        self.root = Path(tempfile.mkdtemp(prefix="mkb-precompile-", dir=root))
        # a quarter of the host's cores (at most 4): the sandboxes' imports and nvcc run beside the gradings' own CPU work
        slots = slots or max(1, min(4, (os.cpu_count() or 1) // 4))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=slots, thread_name_prefix="mkb-precompile")
        self._tasks: dict[tuple, _Task] = {}
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def _key(job: Any) -> tuple:
        path = os.path.realpath(job.kernel_path)  # a symlink loop names itself, never raises
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            stamp = None
        return (str(job.problem), job.dsl, path, stamp)

    def request(self, job: Any) -> bool:
        """Start making `job`'s device code when a slot frees (False: its DSL makes none ahead, already asked, or
        anything went wrong: a precompile never fails a submission)."""
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
        with self._lock:
            if self._closed or key in self._tasks:
                return False
            task = _Task(key, Path(tempfile.mkdtemp(prefix="job-", dir=self.root)))
            self._tasks[key] = task
        task.future = self._pool.submit(self._make, task, job, backend)
        return True

    def take(self, job: Any) -> DeviceCode:
        """What was made for `job`, now: ready, or the task stopped (late) or failed; OFF where none was asked. Never
        raises: a precompile never fails a grading."""
        try:
            return self._take(job)
        except Exception as exc:  # noqa: BLE001
            return DeviceCode("failed", note=f"take: {type(exc).__name__}: {exc}"[:500])

    def _take(self, job: Any) -> DeviceCode:
        with self._lock:
            task = self._tasks.pop(self._key(job), None)
        if task is None:
            return OFF
        fut = task.future
        if fut is not None and fut.done() and not fut.cancelled():
            try:
                code = fut.result()
            except Exception as exc:  # noqa: BLE001 - a precompile never fails a grading
                code = DeviceCode("failed", note=f"{type(exc).__name__}: {exc}"[:500])
            if code.state != "ready":
                shutil.rmtree(task.folder, ignore_errors=True)
            return code
        self._stop(task)
        return DeviceCode("late", seconds=round(time.monotonic() - task.requested, 3))

    def release(self, code: DeviceCode) -> None:
        if code.folder is not None:  # the task's folder, which holds `out`
            shutil.rmtree(code.folder.parent, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            tasks = list(self._tasks.values())
            self._tasks.clear()
        for t in tasks:
            self._stop(t)
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # ---------------- one job ----------------

    def _stop(self, task: _Task) -> None:
        task.cancelled.set()
        if task.future is not None:
            task.future.cancel()
        with task.lock:
            proc = task.proc
        if proc is not None and proc.poll() is None:
            _kill_session(proc.pid)
        if task.future is None or task.future.cancelled():
            shutil.rmtree(task.folder, ignore_errors=True)
        else:  # its thread removes the folder once its process is gone
            task.future.add_done_callback(lambda _f, d=task.folder: shutil.rmtree(d, ignore_errors=True))

    def _run(self, task: _Task, args: list[str], env: dict[str, str], limit_s: float,
             guards: list[str] | None = None) -> tuple[int | None, str, str]:
        """Run one child in its own session, killed at `limit_s` or when the task is stopped; (rc, stdout, stderr).
        `guards` gets the line the child wrote on its own pipe before any candidate code ran (the sandbox's)."""
        if task.cancelled.is_set():
            return None, "", "stopped"
        out_f = tempfile.TemporaryFile()
        err_f = tempfile.TemporaryFile()
        r, w = os.pipe()
        try:
            with task.lock:
                task.proc = subprocess.Popen([self.python, "-m", "mkb.grader._precompile_child", *args],
                                             env={**env, GUARDS_FD_ENV: str(w)}, stdin=subprocess.DEVNULL,
                                             stdout=out_f, stderr=err_f, start_new_session=True, close_fds=True,
                                             pass_fds=(w,))
                proc = task.proc
        finally:
            os.close(w)
        reader = threading.Thread(target=_read_guards, args=(r, guards if guards is not None else []), daemon=True)
        reader.start()
        deadline = time.monotonic() + limit_s
        while proc.poll() is None:
            if task.cancelled.is_set() or time.monotonic() > deadline:
                _kill_session(proc.pid)
                proc.wait()
                break
            time.sleep(0.02)
        _kill_session(proc.pid)  # what the child left behind in its session (a candidate's child in the sandbox) goes too
        reader.join(5)
        out_f.seek(0)
        err_f.seek(0)
        stdout = out_f.read(MAX_OUTPUT_BYTES + 1).decode(errors="replace")
        stderr = err_f.read(64 << 10).decode(errors="replace")
        out_f.close()
        err_f.close()
        timed_out = time.monotonic() > deadline
        return (None if timed_out or task.cancelled.is_set() else proc.returncode), stdout, stderr[-2000:]

    def _env(self, backend: Any, folder: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(backend.environment(self.gpu_arch))
        env.update({"CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(folder), "HOME": str(folder), "PYTHONUNBUFFERED": "1",
                    **backend.private_environment(folder)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p)
        return env

    def _make(self, task: _Task, job: Any, backend: Any) -> DeviceCode:
        t0 = task.requested
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
        problem = str(job.problem)
        reported: list[str] = []
        rc, stdout, stderr = self._run(task, ["sources", job.dsl, str(copy), problem, self.size, str(sandbox)],
                                       self._env(backend, sandbox), SANDBOX_LIMIT_S, guards=reported)
        payload = _payload(stdout)
        if rc != 0 or "sources" not in payload:
            return DeviceCode("failed", note=f"sandbox: {_why(payload, rc, stderr)}"[:500])
        srcs = [s for s in payload["sources"] if isinstance(s, str)][:MAX_SOURCES]
        if sum(len(s) for s in srcs) > MAX_SOURCE_BYTES:
            return DeviceCode("failed", sources=len(srcs), note="sandbox: more source than is built ahead")
        if not srcs:
            return DeviceCode("failed", note="sandbox: no device source recorded")
        guards = (reported[0] if reported else "").replace(str(sandbox), "<sandbox>")
        shutil.rmtree(sandbox, ignore_errors=True)  # nothing of the sandbox's is read from here on
        listing = build_tmp / "sources.json"
        listing.write_text(json.dumps(srcs))
        env = self._env(backend, build_tmp)
        rc, stdout, stderr = self._run(task, ["build", job.dsl, str(listing), str(out), self.gpu_arch], env, BUILD_LIMIT_S)
        payload = _payload(stdout)
        if rc != 0 or "keys" not in payload:
            return DeviceCode("failed", sources=len(srcs), note=f"builder: {_why(payload, rc, stderr)}"[:500])
        shutil.rmtree(build_tmp, ignore_errors=True)
        return DeviceCode("ready", folder=out, seconds=round(time.monotonic() - t0, 3), sources=len(srcs),
                          builds=len(payload["keys"]), sandbox=guards)


def _kill_session(pid: int) -> None:
    """SIGKILL to the child's whole session (it was started in one of its own; nothing of it may leave it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _why(payload: dict, rc: int | None, stderr: str) -> str:
    """Why a child gave no result: what it said, else that it was stopped, else its exit and the end of its stderr."""
    return payload.get("error") or ("stopped" if rc is None else f"exit {rc}: {stderr.strip()[-300:]}")


def _read_guards(fd: int, into: list[str]) -> None:
    """The child's guards line: what it wrote on the pipe before closing it (then the candidate's code may run)."""
    chunks = []
    try:
        while True:
            b = os.read(fd, 4096)
            if not b or sum(map(len, chunks)) > 4000:
                break
            chunks.append(b)
    except OSError:
        pass
    finally:
        os.close(fd)
    into.append(b"".join(chunks).decode(errors="replace")[:2000])


def _payload(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("MKB_PRECOMPILE "):
            try:
                data = json.loads(line[len("MKB_PRECOMPILE "):])
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}
