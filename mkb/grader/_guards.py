"""Snapshots of what a candidate must not change (torch callables, timers, harness functions, numerics flags,
environment, threads, processes, current stream), taken before kernel.py is imported and compared after every call."""

from __future__ import annotations

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
    "torch.utils._python_dispatch", "json", "os",
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


@dataclass(frozen=True)
class Identities:
    """id() of every watched callable, keyed 'space.name' (vars(), so lazy module __getattr__ never fires)."""

    ids: dict[str, int]

    @classmethod
    def take(cls) -> "Identities":
        ids = {}
        for space, obj in _spaces().items():
            if isinstance(obj, type):
                # classes: what attribute lookup finds through the MRO, unbound (so Tensor.mean set on
                # torch.Tensor, shadowing TensorBase.mean, counts as a change)
                table = static_table(obj)
                for name in dir(obj):
                    v = table.get(name, _MISSING)
                    if v is not _MISSING and _watchable(v):
                        ids[f"{space}.{name}"] = id(v)
            else:
                for name, v in list(vars(obj).items()):
                    if _watchable(v):
                        ids[f"{space}.{name}"] = id(v)
        return cls(ids)

    def changed(self) -> list[str]:
        """Names rebound or deleted since the snapshot (names added since are not watched)."""
        now = Identities.take().ids
        return sorted(k for k, v in self.ids.items() if now.get(k) != v)


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


def group_processes() -> list[tuple[int, str]]:
    """The live processes of this grading worker's process group other than itself: (pid, command), [] outside a worker.

    Why: whatever a candidate starts stays in the group (mkb.grader._syscall_guard refuses setsid and setpgid), so a
    process it left running is found here. A correct kernel leaves none (nvcc and ptxas end inside its first call),
    and one left running could work beside the harness: rewrite the profiler's trace file in the worker's scratch
    folder between its export and its reading (the same domain may write there), or compute on the GPU in a context
    of its own while a call is timed. Only where this process leads its own group (a `Worker` is spawned in a new
    session): elsewhere (a test's own process) the group is someone else's. Zombies are dead and left out."""
    me = os.getpid()
    try:
        if os.getpgrp() != me:
            return []
        entries = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        comm, rest = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:].split()
        if len(rest) > 2 and rest[0] not in ("Z", "X") and rest[2] == str(me):  # state, ppid, pgrp
            out.append((int(name), comm))
    return sorted(out)


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

    @classmethod
    def take(cls, device: str) -> "Guard":
        stream = torch.cuda.current_stream() if device == "cuda" else None
        return cls(Identities.take(), numerics_flags(), environ(), python_threads(), stream)

    def check(self, *, identities: bool = True, threads: set[threading.Thread] | None = None) -> tuple[str, str] | None:
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
        procs = group_processes()
        if procs:
            return "integrity_thread", f"processes left running after the call: {procs[:8]}"
        if self.stream is not None:
            cur = torch.cuda.current_stream()
            if cur != self.stream:
                return "integrity_stream", f"current stream changed from {self.stream} to {cur}"
        return None
