"""Snapshots of what a candidate must not change (torch callables, timers, harness functions, numerics flags,
environment, threads, processes, interpreter hooks, current stream), taken before kernel.py is imported and compared after every call."""

from __future__ import annotations

import gc
import os
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

import torch

# Namespaces whose callables a candidate could rebind to fake timings or change what the reference computes.
_TORCH_SPACES = (
    "torch", "torch.nn.functional", "torch.cuda", "torch.linalg", "torch.special", "torch.fft", "torch.autograd",
    "torch.profiler", "torch.autograd.profiler",
)
_CLASS_SPACES = (
    ("torch", "Tensor"), ("torch._C", "TensorBase"), ("torch.cuda", "Event"), ("torch.cuda", "Stream"),
    ("torch.profiler", "profile"), ("mkb.grader._provenance", "CopyWatch"), ("mkb.measure._timing", "SmHold"),
)
_HARNESS_SPACES = (
    "time", "mkb.grader._harness", "mkb.grader._guards", "mkb.grader._trace", "mkb.grader._protocol",
    "mkb.grader._provenance", "mkb.grader._verdict", "mkb.measure._timing", "mkb.measure._compare", "mkb.measure._device",
    "torch.utils._python_dispatch", "json", "os", "builtins", "io", "gc",
)


def _watchable(v: Any) -> bool:
    if isinstance(v, types.ModuleType):
        return False
    return callable(v) or isinstance(v, (property, staticmethod, classmethod, types.GetSetDescriptorType))


def _spaces() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _TORCH_SPACES + _HARNESS_SPACES:
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = mod
    for modname, cls in _CLASS_SPACES:
        mod = sys.modules.get(modname)
        if mod is not None and cls in vars(mod):
            out[f"{modname}.{cls}"] = vars(mod)[cls]
    return out


_MISSING = object()
_TYPE_DICT = type.__dict__["__dict__"]  # a class's own namespace, whatever its metaclass defines as `__dict__`


def static_table(klass: type) -> dict[str, Any]:
    """name -> what `inspect.getattr_static(klass, name)` finds, for every name at once (grader 2.4: one pass over
    the MRO's namespaces instead of one MRO walk per name; ~700 names on torch.Tensor, nine snapshots a grading).

    The class's own MRO wins, the metaclass's MRO fills in names the class lacks, and each class's real namespace
    is read, as attribute lookup reads it; tests/grader/test_guard_table.py checks the table against
    getattr_static on every watched class and through metaclasses and shadowing.
    """
    table: dict[str, Any] = {}
    for entry in reversed(type.__dict__["__mro__"].__get__(type(klass))):
        table.update(_TYPE_DICT.__get__(entry))
    for entry in reversed(type.__dict__["__mro__"].__get__(klass)):
        table.update(_TYPE_DICT.__get__(entry))
    return table


def _namespace(obj: Any) -> dict[str, Any]:
    """What a space's names resolve to: a class's lookup table through its MRO, unbound (so Tensor.mean set on
    torch.Tensor, shadowing TensorBase.mean, counts as a change); a module's vars() (lazy __getattr__ never fires)."""
    return static_table(obj) if isinstance(obj, type) else vars(obj)


@dataclass(frozen=True)
class Identities:
    """Every watched callable, per space (vars(), so lazy module __getattr__ never fires)."""

    # per space, its watched (name, object) pairs, the objects held so that no id is reused while watched: what
    # `changed` looks up again, name by name
    by_space: dict[str, tuple[tuple[str, Any], ...]]

    @property
    def ids(self) -> dict[str, int]:
        """id() of every watched callable, keyed 'space.name'."""
        return {f"{space}.{name}": id(v) for space, pairs in self.by_space.items() for name, v in pairs}

    @classmethod
    def take(cls) -> "Identities":
        by_space: dict[str, tuple[tuple[str, Any], ...]] = {}
        for space, obj in _spaces().items():
            table = _namespace(obj)
            names = dir(obj) if isinstance(obj, type) else list(table)  # a class: the names its instances show
            by_space[space] = tuple((name, v) for name in names
                                    if (v := table.get(name, _MISSING)) is not _MISSING and _watchable(v))
        return cls(by_space)

    def changed(self) -> list[str]:
        """Names rebound or deleted since the snapshot (names added since are not watched).

        Each watched name is looked up again where the snapshot found it and must still be the very object it found
        (grader 2.21; before, the whole snapshot was taken again, walking dir() of every watched class, and compared
        by id: 3.3 ms against 0.4 ms on a 2-core host, and the guard checks identities after every stage and
        verification draw). A name is changed when its space is gone, or it is gone from the space or bound to another
        object."""
        spaces = _spaces()
        out = []
        for space, pairs in self.by_space.items():
            obj = spaces.get(space)
            table = _namespace(obj) if obj is not None else {}
            out.extend(f"{space}.{name}" for name, v in pairs if table.get(name, _MISSING) is not v)
        return sorted(out)


def numerics_flags() -> dict[str, Any]:
    """Global torch flags that change what the reference or eager computes."""
    b = torch.backends
    getters = {
        "cuda.matmul.allow_tf32": lambda: b.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": lambda: b.cudnn.allow_tf32,
        "cudnn.enabled": lambda: b.cudnn.enabled,
        "cudnn.deterministic": lambda: b.cudnn.deterministic,
        "cudnn.benchmark": lambda: b.cudnn.benchmark,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "default_dtype": lambda: str(torch.get_default_dtype()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "grad_enabled": torch.is_grad_enabled,
    }
    out = {}
    for k, g in getters.items():
        try:
            out[k] = g()
        except Exception as exc:  # a flag this torch lacks
            out[k] = f"<unreadable: {type(exc).__name__}>"
    return out


def environ() -> dict[str, str]:
    return dict(os.environ)


def environ_diff(before: dict[str, str]) -> list[str]:
    now = dict(os.environ)
    keys = set(before) | set(now)
    return sorted(k for k in keys if before.get(k) != now.get(k))


def python_threads() -> set[threading.Thread]:
    """The live Thread objects. Objects, not idents: the OS reuses the ident of a thread that ended, so a
    thread started by the candidate could otherwise pass as one that existed before the call."""
    return set(threading.enumerate())


_PR_SET_CHILD_SUBREAPER = 36
_WATCHING: list[bool] = []  # set once this process watches its descendants (a grading worker, at its confinement)


def watch_descendants() -> bool:
    """Make this process the reaper of every orphan among its descendants, so that whatever a candidate starts, however
    it forks or leaves its session, stays a child of the worker while it lives (`processes_left_running`). Once per
    process (a grading worker, before its candidate's import); returns whether the kernel took it."""
    if not _WATCHING:
        try:
            import ctypes

            ok = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            ok = False
        _WATCHING.append(ok)
    return _WATCHING[0]


def _children() -> list[int]:
    """This process's children (every thread's), from /proc/self/task/*/children, else a scan of /proc by ppid."""
    me, out = os.getpid(), []
    try:
        tasks = os.listdir("/proc/self/task")
        for tid in tasks:
            with open(f"/proc/self/task/{tid}/children", "rb") as f:
                out += [int(x) for x in f.read().split()]
        return out
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN
        pass
    except OSError:
        return []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    rest = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(rest) > 1 and rest[1] == str(me).encode():
                out.append(int(name))
    return out


def processes_left_running() -> list[tuple[int, str]]:
    """The live processes a candidate started in this grading worker: (pid, command); [] unless `watch_descendants` ran.

    Why: a correct kernel leaves none (nvcc and ptxas end inside its first call), and one left running could work
    beside the harness: rewrite the profiler's trace file in the worker's scratch folder between its export and its
    reading (the same Landlock domain may write there), or compute on the GPU in a context of its own while a call is
    timed. As the reaper of its orphans, the worker has a live child whenever it has any live descendant. A zombie is
    dead, unless it is only its main thread that ended (other threads of it run on); a child whose state cannot be
    read (a /proc mounted with hidepid) counts as running."""
    if not (_WATCHING and _WATCHING[0]):
        return []
    out = []
    for pid in sorted(set(_children())):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            comm = stat[stat.find(b"(") + 1:stat.rfind(b")")].decode(errors="replace")
            state = stat[stat.rfind(b")") + 2:].split()[0]
            if state in (b"Z", b"X") and len(os.listdir(f"/proc/{pid}/task")) <= 1:
                continue
        except FileNotFoundError:  # reaped meanwhile
            continue
        except (OSError, IndexError):
            comm = "<unreadable>"
        out.append((pid, comm))
    return out


def interpreter_hooks() -> dict[str, Any]:
    """The interpreter's hooks a candidate could use to run code inside the harness's own steps (a profile or trace
    function, a gc callback) or to change when they run; compared by identity after every call."""
    return {"sys.getprofile": sys.getprofile(), "sys.gettrace": sys.gettrace(),
            "threading.getprofile": getattr(threading, "getprofile", lambda: None)(),
            "threading.gettrace": getattr(threading, "gettrace", lambda: None)(),
            "gc.callbacks": tuple(gc.callbacks), "gc.get_threshold": gc.get_threshold(), "gc.isenabled": gc.isenabled()}


def _refuse_new_audit_hooks(event: str, args: tuple) -> None:
    if event == "sys.addaudithook":  # a RuntimeError here makes Python drop the new hook, quietly
        raise RuntimeError("mkb: no audit hook may be added while a candidate can run")


def refuse_audit_hooks() -> None:
    """From now on no audit hook can be added in this process (Python's and C's alike raise `sys.addaudithook`): a
    candidate's hook would run inside the harness's every open and import, where it could rewrite what is read."""
    if not _AUDIT_INSTALLED:
        sys.addaudithook(_refuse_new_audit_hooks)
        _AUDIT_INSTALLED.append(True)


_AUDIT_INSTALLED: list[bool] = []


def native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


@dataclass
class Guard:
    """Everything snapshotted before import; `check()` returns (reason, message) of the first violation or None."""

    identities: Identities
    flags: dict[str, Any]
    env: dict[str, str]
    threads: set[threading.Thread]
    stream: Any
    hooks: dict[str, Any]

    @classmethod
    def take(cls, device: str) -> "Guard":
        stream = torch.cuda.current_stream() if device == "cuda" else None
        return cls(Identities.take(), numerics_flags(), environ(), python_threads(), stream, interpreter_hooks())

    def check(self, *, identities: bool = True, threads: set[threading.Thread] | None = None,
              processes: bool = True) -> tuple[str, str] | None:
        """`processes=False` after each timed call: reading every thread's children per call would add tens of ms a
        grading, and the /proc scan where the kernel lists no children seconds on a host of thousands of processes;
        the checks after import, each stage and before every profiled call's export look."""
        if identities:
            changed = self.identities.changed()
            if changed:
                return "integrity_identity", f"rebound after import: {', '.join(changed[:20])}"
        flags = numerics_flags()
        diff = {k: (self.flags.get(k), v) for k, v in flags.items() if self.flags.get(k) != v}
        if diff:
            return "integrity_numerics_flag", f"numerics flags changed: {diff}"
        env = environ_diff(self.env)
        if env:
            return "integrity_environ", f"environment variables changed: {env}"
        base = self.threads if threads is None else threads
        extra = [t for t in threading.enumerate() if t not in base and t.is_alive()]
        if extra:
            return "integrity_thread", f"threads left running after the call: {[t.name for t in extra]}"
        if processes:
            procs = processes_left_running()
            if procs:
                return "integrity_thread", f"processes left running after the call: {procs[:8]}"
        hooks = interpreter_hooks()
        moved = sorted(k for k, v in hooks.items() if self.hooks.get(k) is not v and self.hooks.get(k) != v)
        if moved:
            return "integrity_identity", f"interpreter hooks changed: {', '.join(moved)}"
        if self.stream is not None:
            cur = torch.cuda.current_stream()
            if cur != self.stream:
                return "integrity_stream", f"current stream changed from {self.stream} to {cur}"
        return None
