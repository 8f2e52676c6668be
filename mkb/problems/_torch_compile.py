"""torch.compile in the characterisation: each problem's `eager` compiled per mode, checked, timed alone, written as `torch_compile` events.

This is the speed a user gets without an agent. Why it is shaped this way: inductor's compile is CPU-bound
and can take minutes, GPU time is scarce, and a timing must not share the machine with a compile. So each
(problem, mode) runs in its own spawned worker process (a cold process, isolated: a compiled kernel that
faults or hangs takes only its worker), up to `concurrency` of them compile at once, and a worker that has
compiled and passed its correctness draw times eager and then its compiled function with `mkb.measure`
(the loop, window and policy of the characterisation and the grader) while every other worker's process
group is paused (SIGSTOP; resumed with SIGCONT), so the GPU and the CPU are quiet; a worker's paused time is
taken out of its compile time and its cap. Workers share one on-disk inductor/triton cache, warmed first by
a trivial compile so the one-off toolchain builds (triton's launcher stubs) are nobody's compile time.

GPU memory admits workers as well as the count: at full size a worker's peak is dominated by the check's fp64
anchor (tens of GiB for the large problems, beyond 120 GiB for 50), and paused workers keep what they hold. A
task starts only when the running tasks' expected peaks plus its own fit within MEMORY_FRACTION of the device's
memory; in plan order, so one that does not fit holds back those after it (no starvation), and one expected to
exceed the budget runs alone (`estimate_peak`, `fits`). Each worker reports its own peak (`peak_memory_bytes`),
which the next call's estimate prefers. An out-of-memory failure beside other workers is tried again by the next
call; one while the task ran alone is recorded as `oom_alone` and is final: it will never fit on this GPU.

Resumable problem by problem: a (problem hash, mode, size, torch version, GPU model, backend) already
recorded with a final outcome is skipped; a timeout is final only for caps up to the one it ran under, an
out-of-memory failure only when the task ran alone (`oom_alone`). A wall-clock budget stops the run cleanly:
no worker starts when too little is left, running ones are killed before the budget ends and record nothing,
and the next run resumes them. Failures are recorded with their error class, never raised. Runs on the GPU
host with torch, pyarrow, fsspec and rich (no polars).
"""

from __future__ import annotations

import importlib
import json
import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_conns
from pathlib import Path
from typing import Any, Callable, Sequence

from mkb._procs import signal_group

MODES: tuple[str, ...] = ("default", "max-autotune-no-cudagraphs")
DEFAULT_CAP_S: dict[str, float] = {"default": 240.0, "max-autotune-no-cudagraphs": 150.0}
STATUSES: tuple[str, ...] = ("ok", "compile_error", "runtime_error", "mismatch", "timeout", "oom_alone")
DEFAULT_COMPILER = "mkb.problems._torch_compile:torch_compile"
SETUP_LIMIT_S = 300.0  # active seconds a worker may take to import and make its inputs before it compiles
TIMING_LIMIT_S = 60.0  # seconds a worker may hold the quiet GPU, or check its draw (a timing takes a few; every other worker waits)
WARM_LIMIT_S = 240.0  # the warm-up compile's limit; past it the run goes on without (each problem then pays the build)
KILL_MARGIN_S = 15.0  # the run stops this long before its budget: kill, join, flush, print
MIN_START_S = 45.0  # no worker starts with less budget than this left (it could not finish)
MAX_DEFAULT_CONCURRENCY = 12  # 3/4 of a 16-core host: each worker holds a CUDA context and ~3 GB of host memory
# GPU memory admission (see `estimate_peak`). The figures behind the factors: h200-torch-compile calls 1-4 and the
# full-size audits of h200-characterisation-3/4 (logs/audit-full.jsonl).
MEMORY_FRACTION = 0.85  # running tasks' expected peaks may sum to this share of the device's memory
ANCHOR_FACTOR = 8.0  # a worker's peak / its eager's characterised peak when nothing better is known: the fp64 anchor and
# the check hold fp64 copies of the inputs and intermediates (4x bf16, 8x fp8) beside the inputs, the compiled outputs
# and inductor's buffers; measured 2.2-5.9x in the full-size audits (03, 06, 10, 13, 14, 47, 50, 51, 57), and lower
# bounds up to 7.3x from the OOM messages of calls 1-4 (38: >= 105.6 GiB for a 14.4 GiB eager)
MEASURED_HEADROOM = 1.15  # a measured peak of the same mode: run-to-run variation of the caching allocator
OTHER_MODE_HEADROOM = 1.5  # a peak measured only in the other mode (max-autotune benchmarks candidates with own buffers)
CONTEXT_BYTES = 1 << 30  # a worker's CUDA context and non-PyTorch memory (0.5-0.7 GiB per idle worker in the OOM messages)
DEFAULT_PEAK_FRACTION = 0.25  # nothing known about a problem on this GPU: a quarter of the device (at most 3 beside it)


def torch_compile(fn: Callable[..., Any], *, mode: str, backend: str = "inductor") -> Callable[..., Any]:
    """`torch.compile` as a user would call it: mode=None for "default", no fullgraph (graph breaks allowed)."""
    import torch

    return torch.compile(fn, mode=None if mode == "default" else mode, backend=backend)


def resolve_compiler(spec: str) -> Callable[..., Any]:
    """A compiler by "module:function" (tests pass fakes; the worker resolves it after spawning)."""
    mod, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"compiler {spec!r} not found ({exc})\nhint: pass module:function") from None


def error_class(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _error_text(exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return f"{type(exc).__name__}: {exc}\n{''.join(tb[-4:])}"[:4000]


@dataclass(frozen=True)
class Task:
    """One (problem, mode) to compile, under its cap."""

    problem: str  # slug
    number: int
    problem_hash: str
    mode: str
    cap_s: float
    expected_peak_bytes: int | None = None  # GPU memory the run admits it under (None: admitted by count only)
    peak_source: str | None = None  # where that estimate came from (`estimate_peak`)


@dataclass(frozen=True)
class Config:
    """What every worker of a run shares (picklable: it travels to spawned workers)."""

    size: str = "full"
    device: str = "cuda"
    backend: str = "inductor"
    compiler: str = DEFAULT_COMPILER
    share_s: float = 4.0  # wall seconds one timing may take (eager and compiled get one each)
    timing_limit_s: float = TIMING_LIMIT_S
    setup_limit_s: float = SETUP_LIMIT_S
    cache_dir: str | None = None
    compile_threads: int = 1
    concurrency: int = 1
    worker_log: str | None = None  # the workers' stdout/stderr (inductor's autotune tables, warnings) go here, not the run's log
    memory_budget_bytes: int | None = None  # running tasks' expected peaks sum within this (None: admission by count only)

    @property
    def backend_label(self) -> str:
        """The `backend` column (part of the resume key): a fake or custom compiler is named, never taken for torch.compile."""
        return self.backend if self.compiler == DEFAULT_COMPILER else f"{self.backend} via {self.compiler}"


@dataclass(frozen=True)
class Context:
    """Where the run measures: the resume key's machine half."""

    gpu: str
    gpu_model: str | None
    torch_version: str
    triton_version: str | None

    @property
    def machine(self) -> str:
        return self.gpu_model or self.gpu


def detect_context(device: str) -> Context:
    """GPU name and model without initialising CUDA in the parent (nvidia-smi), and the torch/triton versions."""
    import importlib.metadata as md

    import torch

    from mkb.measure import model_of, query_gpu

    gpu, model = "cpu", None
    if device.startswith("cuda"):
        idx = int(device.split(":")[1]) if ":" in device else 0
        q = query_gpu(idx)
        gpu = q[0] if q else "unknown"
        model = model_of(gpu)
    try:
        triton = md.version("triton")
    except md.PackageNotFoundError:
        triton = None
    return Context(gpu=gpu, gpu_model=model, torch_version=torch.__version__, triton_version=triton)


_OOM_TEXT = "CUDA out of memory"


def is_oom(error_cls: str | None, error: str | None = None) -> bool:
    """An out-of-memory failure, also where dynamo or inductor wrapped torch's OutOfMemoryError in its own class."""
    return bool(error_cls and "OutOfMemory" in error_cls) or bool(error and _OOM_TEXT in error)


_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def oom_need_bytes(error: str | None, peak_bytes: int | None = None) -> int | None:
    """A lower bound on what the failed task needed, from torch's OOM message: what its process held (CUDA context
    included, or the worker's reserved peak if larger) plus the request that failed. None when the text says neither."""
    import re

    if not error:
        return None
    num = r"([0-9.]+) (bytes|KiB|MiB|GiB|TiB)"
    req = re.search(r"Tried to allocate " + num, error)
    held = re.search(r"this process has " + num + " memory in use", error)
    if req is None and held is None:
        return None
    val = lambda m: int(float(m.group(1)) * _UNITS[m.group(2)]) if m else 0  # noqa: E731
    return max(val(held), peak_bytes or 0) + val(req)


def _final(status: str, error_cls: str | None, row_cap: float | None, cap: float, error: str | None = None) -> bool:
    """Does a recorded outcome settle its key for a run whose cap is `cap`?"""
    if status == "timeout":
        return row_cap is not None and row_cap >= cap
    if status == "oom_alone":
        return True  # out of memory with the GPU to itself: it will not fit on this GPU
    if is_oom(error_cls, error) or error_cls == "WorkerDied(-9)":
        return False  # memory pressure from the run's own concurrency (or an outside kill): tried again
    return status in STATUSES


def _read_rows(store: Any, kind: str, cols: Sequence[str]) -> list[dict[str, Any]]:
    """`kind`'s rows in `store` (pyarrow only: the GPU host has no polars), columns an older minor lacks as None;
    torn files are skipped. A local store that does not exist has no rows."""
    import pyarrow.parquet as pq

    from mkb.events import ScanReport, resolve_store
    from mkb.events._reader import _check

    st = resolve_store(store)
    if st.is_local and not Path(st.root).exists():
        return []
    out: list[dict[str, Any]] = []
    for info in _check(st, kind, ScanReport()):
        have = {n for n, _ in info.types}
        with st.fs.open(info.path, "rb") as fh:
            t = pq.read_table(fh, columns=[c for c in cols if c in have], use_threads=False).to_pylist()
        out += [{c: r.get(c) for c in cols} for r in t]
    return out


def recorded(store: Any, *, size: str, ctx: Context, backend: str) -> dict[tuple[str, str], list[tuple[str, str | None, float | None, str | None]]]:
    """(problem_hash, mode) -> [(status, error_class, compile_cap_s, error)] already in `store` for this machine, torch
    version, size and backend. pyarrow only (the GPU host has no polars); torn files are skipped and named."""
    cols = ["problem_hash", "mode", "size", "gpu", "gpu_model", "torch_version", "backend", "status", "error_class", "compile_cap_s",
            "error"]
    from mkb.measure import machine_of

    out: dict[tuple[str, str], list] = {}
    for r in _read_rows(store, "torch_compile", cols):
        if (r["size"], r["torch_version"], r["backend"]) != (size, ctx.torch_version, backend):
            continue
        if machine_of(r["gpu"], r["gpu_model"]) != ctx.machine:  # the one machine rule, shared with peak_evidence
            continue
        out.setdefault((r["problem_hash"], r["mode"]), []).append((r["status"], r["error_class"], r["compile_cap_s"], r["error"]))
    return out


# --------------------------------------------------------------------------------------------- GPU memory admission


@dataclass(frozen=True)
class PeakEvidence:
    """What the stores know about one problem version's GPU memory on this machine and size."""

    measured: dict[str, int] = field(default_factory=dict)  # mode -> the largest peak_memory_bytes of an ok or mismatch row
    oom_need: int | None = None  # the largest lower bound from an out-of-memory row (`oom_need_bytes`), any mode
    eager_peak: int | None = None  # the newest characterisation's peak_memory_bytes (the eager alone)


def peak_evidence(store: Any | None, peak_stores: Sequence[Any], *, size: str, ctx: Context, backend: str) -> dict[str, PeakEvidence]:
    """problem_hash -> PeakEvidence from `store`'s torch_compile rows (this backend) and the characterisation rows of
    `store` and `peak_stores`, for this GPU model and size (any torch version: memory moves little between them).
    `store` None: the characterisations of `peak_stores` only."""
    from mkb.measure import machine_of

    measured: dict[str, dict[str, int]] = {}
    need: dict[str, int] = {}
    cols = ["problem_hash", "mode", "size", "gpu", "gpu_model", "backend", "status", "error_class", "error", "peak_memory_bytes"]
    for r in _read_rows(store, "torch_compile", cols) if store is not None else []:
        if r["size"] != size or r["backend"] != backend or machine_of(r["gpu"], r["gpu_model"]) != ctx.machine:
            continue
        h = r["problem_hash"]
        if is_oom(r["error_class"], r["error"]):
            n = oom_need_bytes(r["error"], r["peak_memory_bytes"])
            if n is not None:
                need[h] = max(need.get(h, 0), n)
        elif r["peak_memory_bytes"] is not None and r["status"] in ("ok", "mismatch"):  # the whole check ran (its peak)
            m = measured.setdefault(h, {})
            m[r["mode"]] = max(m.get(r["mode"], 0), int(r["peak_memory_bytes"]))
    eager: dict[str, tuple[Any, int]] = {}
    for st in [x for x in (store, *peak_stores) if x is not None]:
        for r in _read_rows(st, "characterisation", ["problem_hash", "size", "gpu", "peak_memory_bytes", "ts"]):
            if r["size"] != size or r["peak_memory_bytes"] is None or machine_of(r["gpu"]) != ctx.machine:
                continue
            prev = eager.get(r["problem_hash"])
            if prev is None or (r["ts"] is not None and (prev[0] is None or r["ts"] > prev[0])):
                eager[r["problem_hash"]] = (r["ts"], int(r["peak_memory_bytes"]))
    return {h: PeakEvidence(measured=measured.get(h, {}), oom_need=need.get(h), eager_peak=eager[h][1] if h in eager else None)
            for h in {*measured, *need, *eager}}


def estimate_peak(ev: PeakEvidence | None, mode: str, device_bytes: int) -> tuple[int, str]:
    """(bytes, source): the GPU memory a (problem, mode) worker is expected to hold at its peak, CUDA context included.

    A peak this mode measured beats one the other mode measured, which beats the characterisation's eager peak
    times ANCHOR_FACTOR, which beats the default (a quarter of the device); an earlier out-of-memory row's need
    (a lower bound) raises any of them ('+oom').
    """
    ev = ev or PeakEvidence()
    if mode in ev.measured:
        est, src = int(ev.measured[mode] * MEASURED_HEADROOM) + CONTEXT_BYTES, "measured"
    elif ev.measured:
        est, src = int(max(ev.measured.values()) * OTHER_MODE_HEADROOM) + CONTEXT_BYTES, "measured-other-mode"
    elif ev.eager_peak is not None:
        est, src = int(ev.eager_peak * ANCHOR_FACTOR) + CONTEXT_BYTES, "characterisation"
    else:
        est, src = int(device_bytes * DEFAULT_PEAK_FRACTION), "default"
    if ev.oom_need is not None and ev.oom_need * MEASURED_HEADROOM > est:
        est, src = int(ev.oom_need * MEASURED_HEADROOM), src + "+oom"
    return est, src


def fits(task: Task, running: Sequence[Task], budget_bytes: int | None) -> bool:
    """May `task` start beside `running`? With nothing running, always (a task too big to share runs alone); never
    beside a task that is itself over the budget; else when the expected peaks sum within the budget."""
    if budget_bytes is None or not running:
        return True
    peaks = [t.expected_peak_bytes or 0 for t in running]
    if max(peaks) > budget_bytes:
        return False
    return sum(peaks) + (task.expected_peak_bytes or 0) <= budget_bytes


def gpu_memory_bytes(device: str) -> int | None:
    """The device's total memory from nvidia-smi (the parent never initialises CUDA); None on the CPU or no answer."""
    import shutil
    import subprocess

    if not device.startswith("cuda") or shutil.which("nvidia-smi") is None:
        return None
    from mkb.measure._device import _physical_index

    idx = int(device.split(":")[1]) if ":" in device else 0
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", str(_physical_index(idx))],
                             capture_output=True, text=True, timeout=20)
        return int(float(res.stdout.strip().splitlines()[0])) << 20 if res.returncode == 0 else None  # MiB
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def plan(problems: Sequence[Any], *, modes: Sequence[str], caps: dict[str, float],
         done: dict[tuple[str, str], list]) -> tuple[list[Task], list[Task]]:
    """(to run, already recorded): mode-major, so every problem gets its default compile before any max-autotune."""
    todo, skipped = [], []
    for mode in modes:
        for p in problems:
            t = Task(p.slug, p.number, p.hash, mode, float(caps[mode]))
            prior = done.get((p.hash, mode), [])
            (skipped if any(_final(*r[:3], t.cap_s, *r[3:]) for r in prior) else todo).append(t)
    return todo, skipped


# --------------------------------------------------------------------------------------------- the worker


def _counters() -> tuple[int | None, int | None]:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))
    except Exception:  # noqa: BLE001 - a diagnostic, never a reason to fail
        return None, None


def _peak_memory(dev: Any) -> int | None:
    """The worker's GPU memory high-water mark (what the caching allocator held, so what other processes could not use)."""
    if dev is None or dev.type != "cuda":
        return None
    try:
        import torch

        return int(torch.cuda.max_memory_reserved(dev))
    except Exception:  # noqa: BLE001 - a measurement, never a reason to lose the row
        return None


def _start_worker(cfg: Config, name: str) -> None:
    try:
        os.setsid()  # its own process group: the parent pauses and kills it with everything it starts
    except OSError:
        pass
    if cfg.worker_log:
        fd = os.open(cfg.worker_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        print(f"=== {name} (pid {os.getpid()})", flush=True)


def _worker(conn: Any, task: Task, cfg: Config) -> None:
    """One (problem, mode) in a fresh process: set up, compile when told, check, time when told, report."""
    _start_worker(cfg, f"{task.problem} {task.mode}")
    t_begin = time.monotonic()
    out: dict[str, Any] = {}
    dev = None

    def send(kind: str, **kw: Any) -> None:
        conn.send((kind, kw))

    def finish(status: str, exc: BaseException | None = None, **kw: Any) -> None:
        out.update(kw)
        out["status"] = status
        if exc is not None:
            out["error_class"], out["error"] = error_class(exc), _error_text(exc)
        out["seconds"] = time.monotonic() - t_begin
        out["peak_memory_bytes"] = _peak_memory(dev)
        send("result", **out)

    try:
        import torch

        from mkb.measure import clone_inputs, compare, expect, gpu_state, time_problem_fn
        from mkb.problems import get_problem
        from mkb.problems._characterise import _free, _plan_calls, _sync

        dev = torch.device(cfg.device)
        if dev.type == "cuda":
            if dev.index is not None:
                torch.cuda.set_device(dev)
            torch.backends.cuda.matmul.allow_tf32 = False  # the eager baseline's numerics, as characterised
            torch.backends.cudnn.allow_tf32 = False
        problem = get_problem(task.problem)
        compiler = resolve_compiler(cfg.compiler)
        inputs = problem.make_inputs(0, device=dev, size=cfg.size)
    except Exception as exc:  # noqa: BLE001 - recorded
        finish("runtime_error", exc)
        return
    send("setup")
    if conn.recv() != "compile":
        return
    # compile: torch.compile is lazy, so the first call compiles (and autotunes); its return ends the compile
    t0 = time.monotonic()
    send("compiling", t0=t0)
    try:
        fn = compiler(problem.eager, mode=task.mode, backend=cfg.backend)
        fn(*inputs)
        _sync(dev)
    except Exception as exc:  # noqa: BLE001 - recorded
        t1 = time.monotonic()
        send("compiled", t0=t0, t1=t1)
        finish("compile_error", exc)
        return
    t1 = time.monotonic()
    graphs, breaks = _counters()
    send("compiled", t0=t0, t1=t1)
    out.update(graphs=graphs, graph_breaks=breaks)
    del inputs
    _free(dev)
    # correctness on a fresh draw, under the grader's comparison rules (outside the quiet window)
    try:
        inputs = problem.make_inputs(1, device=dev, size=cfg.size)
        exp = expect(problem.module, inputs)
        cand = clone_inputs(inputs)
        c0 = time.perf_counter()
        got = fn(*cand)
        _sync(dev)
        est = time.perf_counter() - c0
        verdict = compare(exp, got, inputs_after=cand, input_names=problem.meta.inputs)
        del exp, cand, got, inputs
        _free(dev)
    except Exception as exc:  # noqa: BLE001 - recorded
        finish("compile_error" if error_class(exc).startswith(("torch._dynamo", "torch._inductor")) else "runtime_error", exc)
        return
    if not verdict.ok:
        out.update(error_class=f"Mismatch({verdict.reason})")
        finish("mismatch", error=f"{verdict.reason}: {verdict.message}"[:4000])
        return
    send("ready")
    if conn.recv() != "time":
        return
    try:
        warmup, timed = _plan_calls(est, cfg.share_s)
        make = lambda s: problem.make_inputs(s, device=dev, size=cfg.size)  # noqa: E731
        eager = time_problem_fn(problem.eager, make, warmup=warmup, timed=timed, device=dev)
        _free(dev)
        comp = time_problem_fn(fn, make, warmup=warmup, timed=timed, device=dev)
        after, _ = _counters()
        _free(dev)
    except Exception as exc:  # noqa: BLE001 - recorded
        finish("runtime_error", exc)
        return
    finish("ok", median_us=comp.median_us, iqr_us=comp.iqr_us, cv=comp.cv, n_warmup=comp.n_warmup, n_timed=comp.n_timed,
           eager_median_us=eager.median_us, speedup_over_eager=eager.median_us / comp.median_us if comp.median_us > 0 else None,
           timing_policy=comp.policy or None,
           recompiles_timed=after - out["graphs"] if after is not None and out.get("graphs") is not None else None,
           gpu_state=json.dumps(gpu_state(dev).as_dict()) if dev.type == "cuda" else None)


def _warm_worker(conn: Any, cfg: Config) -> None:
    """Builds the toolchain's one-off pieces into the shared cache (a trivial compile), so no problem pays them."""
    _start_worker(cfg, "warm-up")
    try:
        import torch

        compiler = resolve_compiler(cfg.compiler)
        x = torch.randn(1024, device=cfg.device)
        t0 = time.monotonic()
        compiler(lambda a: a * 2 + 1, mode="default", backend=cfg.backend)(x)
        if torch.device(cfg.device).type == "cuda":
            torch.cuda.synchronize()
        conn.send(("result", {"status": "ok", "seconds": time.monotonic() - t0}))
    except Exception as exc:  # noqa: BLE001 - reported, the run goes on (each problem then pays the build)
        conn.send(("result", {"status": "error", "error": _error_text(exc)}))


# --------------------------------------------------------------------------------------------- the parent


@dataclass
class _Slot:
    task: Task
    proc: Any
    conn: Any
    started: float
    state: str = "starting"  # starting -> setup -> compiling -> checking -> ready -> timing -> done
    pauses: list[list[float]] = field(default_factory=list)  # [start, end or None]
    t0: float | None = None
    t1: float | None = None
    timing_since: float | None = None
    shared: bool = False  # another worker of the run was alive at some time during this one's life

    def paused_in(self, a: float, b: float) -> float:
        return sum(max(0.0, min(b, e if e is not None else b) - max(a, s)) for s, e in self.pauses)

    def active_since(self, a: float, now: float) -> float:
        return (now - a) - self.paused_in(a, now)

    @property
    def paused(self) -> bool:
        return bool(self.pauses) and self.pauses[-1][1] is None


@dataclass
class RunReport:
    """What a run did: rows written, tasks skipped as recorded, tasks left for the next run, timing windows."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Task] = field(default_factory=list)
    unfinished: list[Task] = field(default_factory=list)
    windows: list[tuple[str, float, float]] = field(default_factory=list)  # (slug/mode, start, end) of each quiet window
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # (slug/mode, start, end) of each worker's life
    warm_s: float | None = None
    stopped_by_budget: bool = False


def run_tasks(tasks: Sequence[Task], cfg: Config, ctx: Context, *, emit: Callable[[dict[str, Any]], None],
              budget_s: float, warm: bool = True, log: Callable[[str], None] = print,
              kill_margin_s: float = KILL_MARGIN_S, min_start_s: float = MIN_START_S) -> RunReport:
    """Compile `tasks` `cfg.concurrency` at a time, time each alone, `emit` one row per finished task.

    Stops `kill_margin_s` before `budget_s` (what runs then is killed and left for the next run) and starts no
    worker with less than `min_start_s` left.
    """
    rep = RunReport()
    t_start = time.monotonic()
    deadline = t_start + budget_s - kill_margin_s
    mpc = mp.get_context("spawn")
    env = {"TORCHINDUCTOR_COMPILE_THREADS": str(cfg.compile_threads)}
    if cfg.cache_dir:  # one cache for the run
        env.update(TORCHINDUCTOR_CACHE_DIR=str(Path(cfg.cache_dir) / "inductor"), TRITON_CACHE_DIR=str(Path(cfg.cache_dir) / "triton"))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # workers inherit the environment at spawn; restored when the run ends
    try:
        return _run(tasks, cfg, ctx, emit=emit, rep=rep, t_start=t_start, deadline=deadline, mpc=mpc, warm=warm, log=log,
                    min_start_s=min_start_s)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(tasks: Sequence[Task], cfg: Config, ctx: Context, *, emit: Callable[[dict[str, Any]], None], rep: RunReport,
         t_start: float, deadline: float, mpc: Any, warm: bool, log: Callable[[str], None], min_start_s: float) -> RunReport:
    warm_proc = warm_conn = None
    if warm:  # the toolchain's one-off builds, while the first workers import; nobody compiles before it ends
        warm_conn, b = mpc.Pipe()
        warm_proc = mpc.Process(target=_warm_worker, args=(b, cfg), daemon=False, name="tc-warm")
        warm_proc.start()
        b.close()
    warm_t0 = time.monotonic()
    pending = list(tasks)
    slots: list[_Slot] = []
    holder: _Slot | None = None
    n_done = 0

    def row_for(s: _Slot, res: dict[str, Any]) -> dict[str, Any]:
        from mkb.problems import get_problem

        p = get_problem(s.task.problem)
        compile_s = None
        if s.t0 is not None and s.t1 is not None:
            compile_s = (s.t1 - s.t0) - s.paused_in(s.t0, s.t1)
        row = {
            "problem": p.number, "problem_name": p.slug, "family": p.family, "problem_hash": p.hash, "size": cfg.size,
            "mode": s.task.mode, "backend": cfg.backend_label,
            "gpu": ctx.gpu, "gpu_model": ctx.gpu_model, "torch_version": ctx.torch_version, "triton_version": ctx.triton_version,
            "compile_s": compile_s, "compile_cap_s": s.task.cap_s, "concurrency": cfg.concurrency,
            "compile_threads": cfg.compile_threads, "error_class": None, "error": None,
            "expected_peak_bytes": s.task.expected_peak_bytes if cfg.memory_budget_bytes is not None else None,
            "expected_peak_source": s.task.peak_source if cfg.memory_budget_bytes is not None else None,
            "ran_alone": not s.shared,
        }
        row.update({k: v for k, v in res.items()})
        if row["status"] != "ok" and not s.shared and is_oom(row.get("error_class"), row.get("error")):
            row["status"] = "oom_alone"  # nothing else of the run held GPU memory: it will never fit here (final)
        row["ok"] = row["status"] == "ok"
        return row

    def close(s: _Slot, kill: bool) -> None:
        if kill:
            signal_group(s.proc.pid, signal.SIGKILL, or_process=True)
        s.proc.join(timeout=10)
        if s.proc.is_alive():
            signal_group(s.proc.pid, signal.SIGKILL, or_process=True)
            s.proc.join(timeout=5)
        try:
            s.conn.close()
        except OSError:
            pass
        rep.spans.append((f"{s.task.problem}/{s.task.mode}", s.started, time.monotonic()))
        slots.remove(s)

    def record(s: _Slot, res: dict[str, Any]) -> None:
        nonlocal n_done
        row = row_for(s, res)
        try:
            emit(row)
        except Exception as exc:  # noqa: BLE001 - one unwritable row must not end the run; it stays in the report
            log(f"could not record {s.task.problem} {s.task.mode}: {type(exc).__name__}: {exc}")
        rep.rows.append(row)
        n_done += 1
        t = s.task
        extra = "" if row["ok"] else f" [{row.get('error_class') or ''}]"
        cs = f"{row['compile_s']:.1f} s" if row.get("compile_s") is not None else "-"
        med = f"{row['median_us']:.1f} us" if row.get("median_us") is not None else "-"
        log(f"[{n_done}/{len(tasks)}] {t.problem} {t.mode}: {row['status']}{extra} compile {cs}, median {med} "
            f"(eager {row.get('eager_median_us') or 0:.1f} us) t={time.monotonic() - t_start:.0f}s")

    def pause_others(keep: _Slot, now: float) -> None:
        for o in slots:
            if o is not keep and not o.paused and o.proc.is_alive():
                signal_group(o.proc.pid, signal.SIGSTOP, or_process=True)
                o.pauses.append([now, None])

    def resume_all(now: float) -> None:
        for o in slots:
            if o.paused:
                signal_group(o.proc.pid, signal.SIGCONT, or_process=True)
                o.pauses[-1][1] = now

    def end_warm(res: dict[str, Any] | None) -> None:
        nonlocal warm_proc, warm_conn
        signal_group(warm_proc.pid, signal.SIGKILL, or_process=True)
        warm_proc.join(timeout=10)
        warm_conn.close()
        warm_proc = warm_conn = None
        if res is None or res.get("status") != "ok":
            log(f"warm-up compile failed or timed out ({(res or {}).get('error', 'no result')!s:.300}); "
                "the first compiles pay the toolchain build")
        else:
            rep.warm_s = float(res["seconds"])
            log(f"warm-up compile: {res['seconds']:.1f} s (toolchain stubs built into the shared cache), "
                f"done {time.monotonic() - warm_t0:.1f} s after the start")
        for o in slots:
            if o.state == "setup":
                o.conn.send("compile")

    try:
        while pending or slots:
            now = time.monotonic()
            if now >= deadline:
                rep.stopped_by_budget = True
                break
            if warm_proc is not None and (now - warm_t0 > WARM_LIMIT_S or not warm_proc.is_alive() and not warm_conn.poll()):
                end_warm(None)
            # start workers while there is room, GPU memory and budget (never while a worker holds the quiet GPU); in
            # plan order: a task that does not fit holds back those after it, so it waits only for the running ones
            while (holder is None and pending and len(slots) < cfg.concurrency and deadline - now > min_start_s
                   and fits(pending[0], [x.task for x in slots], cfg.memory_budget_bytes)):
                task = pending.pop(0)
                a, b = mpc.Pipe()
                proc = mpc.Process(target=_worker, args=(b, task, cfg), daemon=False, name=f"tc-{task.number}-{task.mode}")
                proc.start()
                b.close()
                new = _Slot(task, proc, a, time.monotonic(), shared=bool(slots))
                for x in slots:
                    x.shared = True
                slots.append(new)
                if cfg.memory_budget_bytes is not None:
                    gib = (task.expected_peak_bytes or 0) / 2**30
                    alone = " (alone: over the budget)" if (task.expected_peak_bytes or 0) > cfg.memory_budget_bytes else ""
                    log(f"start {task.problem} {task.mode}: expects {gib:.1f} GiB ({task.peak_source}){alone}, "
                        f"{sum((x.task.expected_peak_bytes or 0) for x in slots) / 2**30:.1f} of "
                        f"{cfg.memory_budget_bytes / 2**30:.1f} GiB admitted")
            if not slots:
                if pending:  # too little budget left to start another
                    rep.stopped_by_budget = True
                break
            ready = wait_conns([s.conn for s in slots] + ([warm_conn] if warm_conn is not None else []), timeout=0.2)
            now = time.monotonic()
            if warm_conn is not None and warm_conn in ready:
                try:
                    res = warm_conn.recv()[1]
                except (EOFError, OSError):
                    res = None
                end_warm(res)
            for s in [x for x in slots if x.conn in ready]:
                try:
                    kind, msg = s.conn.recv()
                except (EOFError, OSError):
                    kind, msg = "died", {}
                if kind == "setup":
                    s.state = "setup"
                    if warm_proc is None:  # else sent when the warm-up ends
                        s.conn.send("compile")
                elif kind == "compiling":
                    s.state, s.t0 = "compiling", msg["t0"]
                elif kind == "compiled":
                    s.state, s.t0, s.t1 = "checking", msg["t0"], msg["t1"]
                elif kind == "ready":
                    s.state = "ready"
                elif kind == "result":
                    if s is holder:
                        rep.windows.append((f"{s.task.problem}/{s.task.mode}", s.timing_since or now, now))
                        holder = None
                    record(s, msg)
                    close(s, kill=False)
                else:  # the worker died without a result
                    if s is holder:
                        holder = None
                    s.proc.join(timeout=5)
                    code = s.proc.exitcode
                    record(s, {"status": "compile_error" if s.state == "compiling" else "runtime_error",
                               "error_class": f"WorkerDied({code})", "error": f"worker exited with {code} while {s.state}"})
                    close(s, kill=True)
            # caps: a compile past its cap, a setup or a timing past its limit (active seconds)
            now = time.monotonic()
            for s in list(slots):
                over = None
                if s.state == "compiling" and s.t0 is not None and s.active_since(s.t0, now) > s.task.cap_s:
                    over = ("timeout", "CompileTimeout", f"compile ran past its cap of {s.task.cap_s:.0f} s")
                elif s.state == "starting" and s.active_since(s.started, now) > cfg.setup_limit_s:
                    over = ("runtime_error", "SetupTimeout", f"import and inputs ran past {cfg.setup_limit_s:.0f} s")
                elif s.state == "checking" and s.t1 is not None and s.active_since(s.t1, now) > cfg.timing_limit_s:
                    over = ("runtime_error", "CheckTimeout", f"the correctness draw ran past {cfg.timing_limit_s:.0f} s")
                elif s.state == "timing" and s.timing_since is not None and now - s.timing_since > cfg.timing_limit_s:
                    over = ("runtime_error", "TimingTimeout", f"timing ran past {cfg.timing_limit_s:.0f} s")
                if over is not None:
                    if s is holder:
                        holder = None
                    signal_group(s.proc.pid, signal.SIGKILL, or_process=True)
                    if over[0] == "timeout":
                        s.t1 = now
                    record(s, {"status": over[0], "error_class": over[1], "error": over[2]})
                    close(s, kill=True)
            # the quiet GPU: hand it to the next ready worker, everything else paused; resume when nobody holds it
            if holder is None:
                nxt = next((s for s in slots if s.state == "ready"), None)
                if nxt is not None and deadline - now > 10.0:
                    pause_others(nxt, now)
                    if nxt.paused:  # it was paused by an earlier window: it is ready and idle, wake it
                        signal_group(nxt.proc.pid, signal.SIGCONT, or_process=True)
                        nxt.pauses[-1][1] = now
                    holder, nxt.state, nxt.timing_since = nxt, "timing", now
                    nxt.conn.send("time")
                else:
                    resume_all(now)
    finally:
        if warm_proc is not None:
            signal_group(warm_proc.pid, signal.SIGKILL, or_process=True)
            warm_proc.join(timeout=10)
        for s in list(slots):  # the budget ran out (or the run failed): their tasks are left for the next run
            rep.unfinished.append(s.task)
            close(s, kill=True)
        rep.unfinished.extend(pending)
    return rep


def run_torch_compile(*, store: str | None = None, size: str = "full", device: str | None = None,
                      family: str | None = None, only: Sequence[str] | None = None, modes: Sequence[str] = MODES,
                      caps: dict[str, float] | None = None, budget_s: float = 480.0, concurrency: int | None = None,
                      compile_threads: int = 1, backend: str = "inductor", compiler: str = DEFAULT_COMPILER,
                      cache_dir: str | None = None, share_s: float = 4.0, write: bool = True, warm: bool = True,
                      log: Callable[[str], None] = print, kill_margin_s: float = KILL_MARGIN_S,
                      min_start_s: float = MIN_START_S, worker_log: str | None = None, peak_stores: Sequence[str] = (),
                      memory_fraction: float = MEMORY_FRACTION, device_memory_bytes: int | None = None) -> RunReport:
    """Resume the torch.compile characterisation of the selected problems into `store` within `budget_s`.

    GPU memory admission: each task's expected peak (`estimate_peak`, from `store`'s own torch_compile rows and the
    characterisations in `store` and `peak_stores`) and a budget of `memory_fraction` of the device's memory
    (`device_memory_bytes`, else nvidia-smi's; none on the CPU unless given: then the count alone admits).
    """
    import dataclasses
    import tempfile

    from mkb.problems import get_problem, problems

    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown torch.compile mode {', '.join(unknown)}\nhint: modes are {', '.join(MODES)}")
    if size not in ("full", "smoke"):
        raise ValueError(f"unknown size {size!r}\nhint: full or smoke")
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory fraction {memory_fraction} is not in (0, 1]\nhint: e.g. 0.85 of the device's memory")
    if device_memory_bytes is not None and device_memory_bytes <= 0:
        raise ValueError(f"GPU memory {device_memory_bytes} bytes is not positive\nhint: leave it out to take nvidia-smi's figure")
    from mkb.events import resolve_store

    for ps_ in peak_stores:
        st_ = resolve_store(ps_)
        if st_.is_local and not Path(st_.root).is_dir():
            raise ValueError(f"peak store {ps_!r} does not exist\nhint: a characterisation dataset, e.g. events/h200-characterisation-2")
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    caps = {**DEFAULT_CAP_S, **(caps or {})}
    ps = [get_problem(k) for k in only] if only else list(problems(family=family))
    ctx = detect_context(dev)
    n_cpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    conc = max(1, concurrency if concurrency is not None else min(MAX_DEFAULT_CONCURRENCY, (n_cpu * 3) // 4))
    cache = cache_dir or tempfile.mkdtemp(prefix="mkb-torch-compile-cache-")
    total = device_memory_bytes if device_memory_bytes is not None else gpu_memory_bytes(dev)
    mem_budget = int(total * memory_fraction) if total else None
    cfg = Config(size=size, device=dev, backend=backend, compiler=compiler, share_s=share_s, cache_dir=cache,
                 compile_threads=compile_threads, concurrency=conc, worker_log=worker_log, memory_budget_bytes=mem_budget)
    done = recorded(store, size=size, ctx=ctx, backend=cfg.backend_label) if write else {}
    todo, skipped = plan(ps, modes=modes, caps=caps, done=done)
    if total:
        ev = peak_evidence(store if write else None, peak_stores, size=size, ctx=ctx, backend=cfg.backend_label)
        todo = [dataclasses.replace(t, expected_peak_bytes=e, peak_source=src)
                for t in todo for e, src in [estimate_peak(ev.get(t.problem_hash), t.mode, total)]]
    log(f"torch.compile characterisation: {len(todo)} to run, {len(skipped)} already recorded "
        f"({ctx.machine}, torch {ctx.torch_version}, size={size}, backend={backend}); {conc} workers x "
        f"{compile_threads} compile threads, cache {cache}, budget {budget_s:.0f} s; "
        + (f"GPU memory {mem_budget / 2**30:.1f} of {total / 2**30:.1f} GiB admits by expected peaks" if mem_budget
           else "no GPU memory figure: admission by count only"))
    writer = None
    if write:
        from mkb.events import EventWriter

        writer = EventWriter(store, flush_every=8, flush_after_s=20.0)
    emit = (lambda row: writer.emit("torch_compile", **row)) if writer is not None else (lambda row: None)
    try:
        rep = run_tasks(todo, cfg, ctx, emit=emit, budget_s=budget_s, warm=warm and bool(todo), log=log,
                        kill_margin_s=kill_margin_s, min_start_s=min_start_s)
    finally:
        if writer is not None:
            writer.close()
    rep.skipped = skipped
    left = len(rep.unfinished)
    log(f"done: {len(rep.rows)} recorded ({sum(r['ok'] for r in rep.rows)} ok), {len(skipped)} skipped as recorded, "
        f"{left} left for the next run{' (budget reached)' if rep.stopped_by_budget else ''}")
    return rep


def main_summary(rep: RunReport) -> str:
    """One line per recorded row, for logs (the events hold everything)."""
    lines = []
    for r in rep.rows:
        lines.append(f"{r['problem']:02d} {r['mode']:<27} {r['status']:<14} compile {r.get('compile_s') or float('nan'):7.1f} s  "
                     f"median {r.get('median_us') or float('nan'):10.1f} us  eager {r.get('eager_median_us') or float('nan'):10.1f} us  "
                     f"x{r.get('speedup_over_eager') or float('nan'):.2f}  {r.get('error_class') or ''}")
    return "\n".join(lines)

