"""Runs model-written commands (bash, the CPU check) inside a bubblewrap sandbox that sees only the attempt's workspace.

What the sandbox holds: the workspace at /workspace (writable; its problem/ and docs/ read-only),
the system (/usr and friends), the Python installation and its site-packages read-only, and a
runtime copy of the `mkb` package with no baseline solutions (`_data/problems` hidden) and no doc
packs (`dsl/docs` hidden: the attempt's own is its workspace's docs/) plus this problem's problem.py
alone. It does not hold the event store, any other workspace, the real HOME,
the repository checkout or GPU device nodes; it has its own HOME, TMPDIR and caches, no network
(a fresh network namespace), a cleared environment (no API keys), its own PID namespace (killing
"the parent" reaches only the sandbox), and process, memory, file-size and time limits.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from mkb._procs import kill_group

WORKSPACE = "/workspace"
HOME = "/home/agent"
RUNTIME = "/opt/mkb-runtime"
_SYSTEM_RO = ("/usr", "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/ca-certificates",
              "/etc/localtime", "/etc/nsswitch.conf")
_SYMLINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"))
SANDBOX_UID = 65534  # nobody: the uid a root-run sandbox drops to


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here; the attempt refuses to start (see --unsafe-no-sandbox)."""


@dataclass(frozen=True)
class Limits:
    """Per-command limits. Processes are counted per real user, so the cap is what is running now plus `processes`."""

    processes: int = 512
    address_space_bytes: int = 48 << 30  # torch + a DSL compiler map a lot of virtual memory; RSS is far lower
    file_size_bytes: int = 1 << 30
    open_files: int = 1024


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None when killed at the time limit
    output: str  # stdout and stderr interleaved, decoded with replacement
    output_bytes: int
    duration_s: float
    timed_out: bool


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def probe() -> str | None:
    """None when a sandbox can be created here, else why not (one line)."""
    exe = bwrap_path()
    if exe is None:
        return "bubblewrap (bwrap) is not installed\nhint: apt-get install -y bubblewrap, or pass --unsafe-no-sandbox (recorded)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root, the sandbox drops to an unprivileged uid with setpriv (util-linux), which is missing"
    try:  # the same namespaces Sandbox.argv uses, and the uid drop when root
        drop = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "/bin/true"] if os.geteuid() == 0 else ["/bin/true"]
        proc = subprocess.run([exe, *_namespaces(os.geteuid() == 0), "--die-with-parent", "--ro-bind", "/usr", "/usr", *_symlink_args(),
                               "--proc", "/proc", "--dev", "/dev", *drop], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run here: {exc}"
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        return f"bubblewrap cannot create a sandbox here: {err[-1] if err else proc.returncode}\nhint: user namespaces may be disabled; pass --unsafe-no-sandbox (recorded)"
    return None


def _namespaces(as_root: bool) -> list[str]:
    # root: bwrap mounts with its own privileges (no user namespace), the command drops to SANDBOX_UID;
    # otherwise an unprivileged user namespace (which some distributions restrict: see .ci/run)
    return ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"] if as_root else ["--unshare-all"]


def _symlink_args() -> list[str]:
    out: list[str] = []
    for target, link in _SYMLINKS:
        if Path(link).is_symlink() or not Path(link).exists():
            out += ["--symlink", target, link]
        else:
            out += ["--ro-bind", link, link]
    return out


def _mkb_package() -> Path:
    import mkb

    return Path(mkb.__file__).resolve().parent


def build_runtime(state_dir: Path, problem_file: Path) -> Path:
    """A runtime folder `<state>/runtime` with `problems/<family>/<slug>/problem.py` only (no baselines).

    The mkb package itself is bound read-only from where it is installed, with its `_data/problems`
    hidden under an empty tmpfs (a wheel carries the baselines there).
    """
    rt = state_dir / "runtime"
    dest = rt / "problems" / problem_file.parent.parent.name / problem_file.parent.name
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(problem_file, dest / "problem.py")
    return rt


def _python_roots() -> list[Path]:
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent.parent}
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(Path(p).resolve())
    # keep only outermost roots (binding a parent and its child twice is harmless but noisy)
    out = sorted(roots, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in out:
        if not any(p.is_relative_to(k) for k in kept):
            kept.append(p)
    return kept


class _Mounts:
    """bwrap arguments, creating each destination's missing parents 0755 (bwrap would copy a 0700 /root)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._dirs: set[str] = {"/"}

    def _parents(self, dest: str) -> None:
        parts = Path(dest).parts
        for i in range(2, len(parts)):
            d = str(Path(*parts[:i]))
            if d not in self._dirs:
                self.args += ["--perms", "0755", "--dir", d]
                self._dirs.add(d)

    def add(self, flag: str, src: str | None, dest: str) -> None:
        self._parents(dest)
        self.args += [flag, dest] if src is None else [flag, src, dest]
        self._dirs.add(dest)


class Sandbox:
    """One attempt's sandbox: `run(command)` executes `bash -c command` in it with cwd /workspace.

    Run as root (a container), bwrap mounts everything itself without a user namespace and the command
    drops to uid/gid 65534 through setpriv, because the kernel exempts root from the process limit;
    run as another user, bwrap unshares the user namespace and the limit counts that user.
    """

    def __init__(self, workspace: Path, state_dir: Path, *, problem_file: Path, extra_env: dict[str, str] | None = None,
                 unsafe: bool = False, limits: Limits = Limits(), timeout_cap_s: float = 300.0) -> None:
        self.workspace = Path(workspace).resolve()
        self.state_dir = Path(state_dir).resolve()
        self.unsafe = unsafe
        self.limits = limits
        self.timeout_cap_s = timeout_cap_s
        self.home = self.state_dir / "home"
        (self.home / ".cache").mkdir(parents=True, exist_ok=True)
        self.tmp = self.state_dir / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.runtime = build_runtime(self.state_dir, Path(problem_file))
        self.extra_env = dict(extra_env or {})
        self.as_root = os.geteuid() == 0 and not unsafe
        if not unsafe:
            why = probe()
            if why:
                raise SandboxUnavailable(why)
            if self.as_root and shutil.which("setpriv") is None:
                raise SandboxUnavailable("running as root needs setpriv (util-linux) to drop to an unprivileged uid in the sandbox")
        if self.as_root:
            for p in (self.workspace, self.home, self.tmp):
                self.own(p, recursive=True)

    def own(self, path: Path, *, recursive: bool = False) -> None:
        """Give `path` to the sandbox's user (root mode), so files the host tools write stay editable from bash."""
        if not self.as_root:
            return
        paths = [Path(path)]
        if recursive and Path(path).is_dir():
            paths += list(Path(path).rglob("*"))
        for p in paths:
            try:
                os.lchown(p, SANDBOX_UID, SANDBOX_UID)
            except OSError:
                pass

    @property
    def workspace_view(self) -> str:
        """The workspace path the model sees."""
        return str(self.workspace) if self.unsafe else WORKSPACE

    def environment(self) -> dict[str, str]:
        """The whole environment a sandboxed command gets: nothing inherited, so no key or credential."""
        home = str(self.home) if self.unsafe else HOME
        pythonpath = str(_mkb_package().parent) if self.unsafe else RUNTIME
        env = {
            "HOME": home, "USER": "agent", "LOGNAME": "agent", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "TMPDIR": str(self.tmp) if self.unsafe else "/tmp",
            "XDG_CACHE_HOME": f"{home}/.cache", "PYTHONPYCACHEPREFIX": f"{home}/.cache/pycache",
            "CUDA_CACHE_PATH": f"{home}/.cache/nv", "TVM_CACHE_DIR": f"{home}/.cache/tvm", "CUTE_DSL_CACHE_DIR": f"{home}/.cache/cute",
            "PYTHONPATH": pythonpath, "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
        }
        env.update(self.extra_env)
        return env

    def merged_env(self, env: dict[str, str] | None) -> dict[str, str]:
        """The sandbox environment plus `env` (a backend's). A PATH in `env` goes first, then the sandbox's: a backend
        puts its toolkit's bin/ ahead of the host PATH, and entries that do not exist in the sandbox are skipped by exec."""
        out = self.environment()
        for k, v in (env or {}).items():
            if k == "PATH":
                entries = [p for p in v.split(os.pathsep) + out["PATH"].split(os.pathsep) if p]
                out["PATH"] = os.pathsep.join(dict.fromkeys(entries))
            else:
                out[k] = v
        return out

    def argv(self, command: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The full bwrap command line for `command` (the command itself when unsafe)."""
        if self.unsafe:
            return command
        exe = bwrap_path()
        assert exe is not None
        a = [exe, *_namespaces(self.as_root), "--die-with-parent", "--new-session", "--clearenv", "--hostname", "mkb-sandbox"]
        m = _Mounts()
        m.add("--proc", None, "/proc")
        m.add("--dev", None, "/dev")
        m.args += ["--perms", "1777"]
        m.add("--tmpfs", None, "/tmp")
        for p in _SYSTEM_RO:
            if Path(p).exists():
                m.add("--ro-bind", p, p)
        m.args += _symlink_args()
        for root in _python_roots():
            m.add("--ro-bind", str(root), str(root))
            for installed in root.glob("lib/python*/site-packages/mkb/_data"):
                m.add("--tmpfs", None, str(installed))  # an installed wheel carries the baselines there
            for installed in root.glob("lib/python*/site-packages/mkb/dsl/docs"):
                m.add("--tmpfs", None, str(installed))  # every DSL's doc pack: the attempt's own is in /workspace/docs
        pkg = _mkb_package()
        m.add("--ro-bind", str(pkg), f"{RUNTIME}/mkb")
        if (pkg / "_data").is_dir():
            m.add("--tmpfs", None, f"{RUNTIME}/mkb/_data")
        if (pkg / "dsl" / "docs").is_dir():  # the other DSL's primer and worked examples would leak across arms
            m.add("--tmpfs", None, f"{RUNTIME}/mkb/dsl/docs")
        m.add("--ro-bind", str(self.runtime / "problems"), f"{RUNTIME}/problems")
        m.add("--bind", str(self.workspace), WORKSPACE)
        for ro in ("problem", "docs"):
            if (self.workspace / ro).exists():
                m.add("--ro-bind", str(self.workspace / ro), f"{WORKSPACE}/{ro}")
        m.add("--bind", str(self.home), HOME)
        a += m.args + ["--chdir", WORKSPACE]
        for k, v in self.merged_env(env).items():
            a += ["--setenv", k, v]
        if self.as_root:
            a += ["--", "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        else:
            a += ["--"]
        return [*a, *command]

    def _preexec(self) -> None:
        running = _processes_of_uid(SANDBOX_UID if self.as_root else os.getuid())
        for res, value in ((resource.RLIMIT_NPROC, running + self.limits.processes), (resource.RLIMIT_AS, self.limits.address_space_bytes),
                           (resource.RLIMIT_FSIZE, self.limits.file_size_bytes), (resource.RLIMIT_NOFILE, self.limits.open_files),
                           (resource.RLIMIT_CORE, 0)):
            try:
                resource.setrlimit(res, (value, value))
            except (ValueError, OSError):
                pass

    def run(self, command: str | list[str], *, timeout_s: float, max_output_bytes: int = 8 << 20, env: dict[str, str] | None = None) -> RunResult:
        """Run `command` (a shell string for bash, or an argv) and return its combined output.

        Killing bwrap kills the sandbox's PID namespace with everything in it (--die-with-parent);
        output beyond `max_output_bytes` is read and dropped, so a model printing gigabytes cannot
        exhaust the host's memory.
        """
        import selectors

        timeout_s = max(1.0, min(float(timeout_s), self.timeout_cap_s))
        argv = ["/bin/bash", "-c", command] if isinstance(command, str) else list(command)
        t0 = time.monotonic()
        proc = subprocess.Popen(self.argv(argv, env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=str(self.workspace), env=self.merged_env(env) if self.unsafe else {"PATH": "/usr/bin:/bin"},
                                start_new_session=True, preexec_fn=self._preexec)
        chunks: list[bytes] = []
        kept = total = 0
        timed_out = False
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = t0 + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not sel.select(timeout=min(left, 0.5)):
                continue
            data = os.read(proc.stdout.fileno(), 1 << 16)
            if not data:
                break
            total += len(data)
            if kept < max_output_bytes:
                chunks.append(data[: max_output_bytes - kept])
                kept += len(chunks[-1])
        sel.close()
        if not timed_out:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        inits = _children(proc.pid)  # bwrap's child: the init of the sandbox's PID namespace
        _kill_group(proc)
        _wait_gone(inits, 20.0)  # it dies of --die-with-parent; the kernel then kills everything in its namespace
        code = None if timed_out else proc.returncode
        out = b"".join(chunks).decode(errors="replace")
        if timed_out:
            out += f"\n[mkb: killed after {timeout_s:.0f} s]"
        return RunResult(code, out, total, time.monotonic() - t0, timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
    kill_group(proc)
    if proc.stdout:
        proc.stdout.close()


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def _wait_gone(pids: list[int], limit_s: float) -> None:
    """Until each pid has exited (a zombie has an empty cmdline) or `limit_s` passed; SIGKILL again on the way."""
    end = time.monotonic() + limit_s
    for pid in pids:
        while time.monotonic() < end:
            try:
                if not Path(f"/proc/{pid}/cmdline").read_bytes():
                    break
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                break
            time.sleep(0.05)


def _processes_of_uid(uid: int) -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n
