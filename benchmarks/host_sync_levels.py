"""What sets the per-grading level of a kernel that syncs with the host inside its timed call (problem 23; issue #9).

Problem 23's baselines read `seq_lens.tolist()` on the host in every call (the output's size is data-dependent;
`seq_lens` is a declared structure input), so every timed window (`mkb.measure.stream_window`) holds the device-to-host
copy, the host's wake-up from that sync and the launches after it. The quiet SM hold (timing policy v4) keeps the GPU
busy for up to 2 ms before the window, and the sync waits for it, so the host has been waiting that long when the
window opens. On the H200 these medians move 29-42% between gradings, one level per grading (process).

This GPU experiment (stdlib + torch + the DSLs + mkb; no polars) tells which host state sets that level. Fresh
processes run in sequence, one arm each (the order rotates from round to round):

- `a` as graded today (the CUDA primary context's default scheduling, the process's inherited CPU set);
- `b` the primary context set to spin-wait (`cuDevicePrimaryCtxSetFlags(dev, CU_CTX_SCHED_SPIN)` through ctypes on
  libcuda.so.1, before torch creates the context; read back with `cuDevicePrimaryCtxGetState`);
- `c` blocking sync (`CU_CTX_SCHED_BLOCKING_SYNC`): the contrast, a host that sleeps in every wait;
- `d` the process pinned (`os.sched_setaffinity`, before torch is imported) to the CPUs local to the GPU (NVML's
  `nvmlDeviceGetCpuAffinity`, else `/sys/bus/pci/devices/<bdf>/local_cpulist`, within the CPUs the process may use);
  skipped, with the reason recorded, when they are unknown;
- `e` spin + pinned.

Each process times 23 cute, 23 tirx, 23's eager, a torch-only host-sync probe (`probe/sync`: read 8 lengths on the
host, then one small kernel sized by them) and a device-only control (28 cute) in 2 "gradings" each, with the grader's
own primitives: 10 + 100 calls through `mkb.measure.timed_loop` (pre-made input sets, the hold set from the warm-ups'
host dispatch as the grader sets it), the read flush and `stream_window` with the quiet hold, after a clock warm-up.
Per grading it keeps the per-call device times, the host's time per call (`perf_counter` around it), the hold, the
thread's voluntary / involuntary context switches and CPU time over the loop, and the CPU it ran on
(`/proc/self/stat` field 39) before and after; per process the context flags read back before and after torch made
the context, and the CPU set. No new process starts after 150 s, each is stopped after 60 s (less near the end), and
the whole run stays under 200 s; a process writes what it measured after every grading, so one that is stopped keeps it.

    python benchmarks/host_sync_levels.py --gpu --out $OUT     # writes $OUT/hostsync.json and $OUT/hostsync.log
    python benchmarks/host_sync_levels.py --summary hostsync.json   # the table again

docs/timing-repeatability.md ("Host-syncing kernels (problem 23)") says what each outcome means for the grader.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO, REPO / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from timing_repeatability import spread  # noqa: E402  (one definition of the between-grading statistics)

KERNELS = ("23/cute", "23/tirx", "23/eager", "probe/sync", "28/cute")
WARM, N, REPS = 10, 100, 2
CLOCK_WARM_S = 0.3  # the grader's clock_warm_s before each timing loop
START_BY_S, CHILD_TIMEOUT_S, TOTAL_S, MIN_CHILD_S = 150.0, 60.0, 195.0, 15.0

# CUDA driver API: CUctx_flags' scheduling bits
CU_CTX_SCHED_AUTO, CU_CTX_SCHED_SPIN, CU_CTX_SCHED_YIELD, CU_CTX_SCHED_BLOCKING_SYNC = 0, 1, 2, 4
CU_CTX_SCHED_MASK = 7
_SCHED_NAMES = {CU_CTX_SCHED_AUTO: "auto", CU_CTX_SCHED_SPIN: "spin", CU_CTX_SCHED_YIELD: "yield",
                CU_CTX_SCHED_BLOCKING_SYNC: "blocking_sync"}


@dataclass(frozen=True)
class Arm:
    """One way to run a process: the primary context's scheduling flag (None: untouched) and whether it is pinned."""

    name: str
    label: str
    sched: int | None
    pin: bool


ARMS = {a.name: a for a in (
    Arm("a", "as graded", None, False),
    Arm("b", "spin", CU_CTX_SCHED_SPIN, False),
    Arm("c", "blocking sync", CU_CTX_SCHED_BLOCKING_SYNC, False),
    Arm("d", "pinned", None, True),
    Arm("e", "spin + pinned", CU_CTX_SCHED_SPIN, True),
)}


def sched_name(flags: int | None) -> str:
    """The scheduling part of a context's flags, by name ('spin', 'blocking_sync', ...)."""
    if flags is None:
        return "unknown"
    return _SCHED_NAMES.get(flags & CU_CTX_SCHED_MASK, f"0x{flags & CU_CTX_SCHED_MASK:x}")


# ----------------------------------------------------------------------------------------------------------------
# the plan: which arm each process runs, and when to stop starting processes
# ----------------------------------------------------------------------------------------------------------------

def plan_arms(n: int, arms: Sequence[str], *, start: int = 0) -> list[str]:
    """The arm of processes start .. start + n - 1: every round of len(arms) processes runs each arm once, and each
    round starts one arm later than the one before (a b c d e, b c d e a, ...), so no arm always runs first or
    last in a round, and `start` continues the rotation of an earlier call."""
    k = len(arms)
    if not k:
        return []
    return [arms[(j % k + j // k) % k] for j in range(start, start + n)]


@dataclass(frozen=True)
class Budget:
    """When a new process may start, and how long it may run, so the whole run ends within `total_s`."""

    start_by_s: float = START_BY_S
    child_timeout_s: float = CHILD_TIMEOUT_S
    total_s: float = TOTAL_S
    min_child_s: float = MIN_CHILD_S

    def timeout(self, elapsed_s: float) -> float | None:
        """The time the next process gets, started `elapsed_s` into the run; None: start no more."""
        left = self.total_s - elapsed_s
        if elapsed_s > self.start_by_s or left < self.min_child_s:
            return None
        return min(self.child_timeout_s, left)


# ----------------------------------------------------------------------------------------------------------------
# the host: the CUDA driver and NVML through ctypes, the CPU a process runs on
# ----------------------------------------------------------------------------------------------------------------

class Unavailable(RuntimeError):
    """A library or device the experiment needs is not there (the message is the line to print after 'skipped: ')."""


class DriverError(RuntimeError):
    """A CUDA driver call returned an error (named)."""


class Driver:
    """The few CUDA driver calls the experiment needs, on libcuda.so.1 through ctypes (no context is created)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    @classmethod
    def open(cls, name: str = "libcuda.so.1", *, loader: Callable[[str], Any] = ctypes.CDLL) -> "Driver":
        try:
            lib = loader(name)
        except OSError as exc:
            raise Unavailable(f"no libcuda ({exc})") from None
        drv = cls(lib)
        drv._check("cuInit", lib.cuInit(0))
        return drv

    def _error_name(self, code: int) -> str:
        try:
            s = ctypes.c_char_p()
            if self.lib.cuGetErrorName(code, ctypes.byref(s)) == 0 and s.value:
                return s.value.decode()
        except Exception:  # noqa: BLE001 - the numeric code is still said
            pass
        return "CUDA error"

    def _check(self, fn: str, code: int) -> None:
        if code != 0:
            raise DriverError(f"{fn} failed: {self._error_name(code)} ({code})")

    def _fn(self, *names: str) -> tuple[str, Any]:
        """The first of `names` libcuda exports (the _v2 entry points replace the plain ones since CUDA 11)."""
        for n in names:
            f = getattr(self.lib, n, None)
            if f is not None:
                return n, f
        raise DriverError(f"libcuda exports none of {', '.join(names)}")

    def version(self) -> int:
        v = ctypes.c_int()
        self._check("cuDriverGetVersion", self.lib.cuDriverGetVersion(ctypes.byref(v)))
        return v.value

    def device(self, ordinal: int = 0) -> int:
        d = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(d), ordinal))
        return d.value

    def primary_state(self, dev: int) -> dict[str, Any]:
        """The primary context's flags and whether it exists yet (`cuDevicePrimaryCtxGetState`)."""
        flags, active = ctypes.c_uint(), ctypes.c_int()
        self._check("cuDevicePrimaryCtxGetState", self.lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags),
                                                                                       ctypes.byref(active)))
        return {"flags": flags.value, "sched": sched_name(flags.value), "active": bool(active.value)}

    def set_primary_flags(self, dev: int, flags: int) -> None:
        name, f = self._fn("cuDevicePrimaryCtxSetFlags_v2", "cuDevicePrimaryCtxSetFlags")
        self._check(name, f(dev, ctypes.c_uint(flags)))

    def pci_bus_id(self, dev: int) -> str:
        buf = ctypes.create_string_buffer(64)
        self._check("cuDeviceGetPCIBusId", self.lib.cuDeviceGetPCIBusId(buf, 64, dev))
        return buf.value.decode()


def normalise_bdf(bus_id: str) -> str:
    """A PCI address as sysfs names it (`0000:19:00.0`) from the driver's or NVML's (`00000000:19:00.0`)."""
    try:
        dom, bus, rest = bus_id.strip().split(":")
        dev, fn = rest.split(".")
        return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
    except ValueError:
        raise ValueError(f"not a PCI address: {bus_id!r}") from None


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` (sysfs's cpulist format) -> [0, 1, 2, 3, 8, 10, 11]."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def cpus_from_mask(words: Sequence[int], bits: int = 64) -> list[int]:
    """NVML's CPU affinity (an array of `unsigned long` words, CPU i is bit i % 64 of word i // 64) -> CPU numbers."""
    return [w * bits + b for w, word in enumerate(words) for b in range(bits) if word >> b & 1]


def nvml_cpus(bus_id: str, *, name: str = "libnvidia-ml.so.1", loader: Callable[[str], Any] = ctypes.CDLL,
              max_cpus: int = 1024) -> list[int]:
    """The CPUs NVML calls local to the GPU at `bus_id` (`nvmlDeviceGetCpuAffinity`); raises Unavailable."""
    try:
        lib = loader(name)
    except OSError as exc:
        raise Unavailable(f"no NVML ({exc})") from None
    rc = lib.nvmlInit_v2()
    if rc != 0:
        raise Unavailable(f"nvmlInit_v2 returned {rc}")
    try:
        h = ctypes.c_void_p()
        rc = lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(h))
        if rc != 0:
            raise Unavailable(f"nvmlDeviceGetHandleByPciBusId_v2({bus_id}) returned {rc}")
        n = max_cpus // 64
        mask = (ctypes.c_ulong * n)()
        rc = lib.nvmlDeviceGetCpuAffinity(h, n, mask)
        if rc != 0:
            raise Unavailable(f"nvmlDeviceGetCpuAffinity returned {rc}")
        return cpus_from_mask(list(mask))
    finally:
        lib.nvmlShutdown()


def gpu_local_cpus(bus_id: str | None, *, sysfs: Path = Path("/sys/bus/pci/devices"),
                   nvml: Callable[[str], list[int]] = nvml_cpus,
                   allowed: Sequence[int] | None = None) -> dict[str, Any]:
    """What NVML and sysfs say about the CPUs local to the GPU, and the ones this process may pin to (`usable`:
    the local ones within its affinity; empty when unknown, with `why`)."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    out: dict[str, Any] = {"bus_id": bus_id, "nvml": None, "nvml_error": None, "sysfs": None, "sysfs_error": None,
                           "numa_node": None, "allowed": allowed, "source": None, "local": None, "usable": [], "why": None}
    if bus_id is None:
        out["why"] = "unknown: no PCI address for the GPU"
        return out
    try:
        out["nvml"] = nvml(bus_id)
    except (Unavailable, OSError, AttributeError, ValueError) as exc:
        out["nvml_error"] = str(exc)
    try:
        d = sysfs / normalise_bdf(bus_id)
        out["sysfs"] = parse_cpulist((d / "local_cpulist").read_text())
        try:
            out["numa_node"] = int((d / "numa_node").read_text())
        except (OSError, ValueError):
            pass
    except (OSError, ValueError) as exc:
        out["sysfs_error"] = f"{type(exc).__name__}: {exc}"
    for src in ("nvml", "sysfs"):
        if out[src]:
            out["source"], out["local"] = src, out[src]
            break
    if out["local"] is None:
        out["why"] = "unknown: " + "; ".join(e for e in (out["nvml_error"], out["sysfs_error"]) if e)
        return out
    out["usable"] = sorted(set(out["local"]) & set(allowed))
    if not out["usable"]:
        out["why"] = f"none of the GPU-local CPUs ({out['source']}) is in this process's affinity"
    elif set(out["usable"]) == set(allowed):
        out["why"] = "every CPU this process may use is GPU-local: pinning changes nothing here"
    return out


def parse_stat_cpu(stat: str) -> int:
    """Field 39 of /proc/<pid>/stat (the CPU the task last ran on); the command name in field 2 may hold spaces."""
    return int(stat[stat.rindex(")") + 2:].split()[36])


def current_cpu() -> int | None:
    try:
        return parse_stat_cpu(Path("/proc/self/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def cpu_mhz(cpu: int | None) -> float | None:
    if cpu is None:
        return None
    try:
        return int(Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq").read_text()) / 1000.0
    except (OSError, ValueError):
        return None


def host_facts() -> dict[str, Any]:
    """The host's CPU model, count, governor and idle states (what a host-sync level could depend on)."""
    facts: dict[str, Any] = {"cpu_count": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0))}
    try:
        facts["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                  if ln.startswith("model name"))
    except (OSError, StopIteration):
        facts["cpu_model"] = None
    cpu0 = Path("/sys/devices/system/cpu/cpu0")
    for key, rel in (("governor", "cpufreq/scaling_governor"), ("max_mhz", "cpufreq/cpuinfo_max_freq")):
        try:
            facts[key] = (cpu0 / rel).read_text().strip()
        except OSError:
            facts[key] = None
    try:
        facts["cpuidle_states"] = [(s / "name").read_text().strip() for s in sorted((cpu0 / "cpuidle").glob("state*"))]
    except OSError:
        facts["cpuidle_states"] = None
    return facts


# ----------------------------------------------------------------------------------------------------------------
# one process
# ----------------------------------------------------------------------------------------------------------------

def _say(a: argparse.Namespace, msg: str) -> None:
    print(f"[proc {a.child} arm {a.arm}] {msg}", flush=True)


def _setup_host(a: argparse.Namespace, state: dict[str, Any]) -> Driver | None:
    """The arm's host state, before torch is imported: the CPU set, then the primary context's flags."""
    arm = ARMS[a.arm]
    state["affinity_inherited"] = sorted(os.sched_getaffinity(0))
    if arm.pin:
        os.sched_setaffinity(0, a.cpus)
    state["affinity"] = sorted(os.sched_getaffinity(0))
    try:
        drv = Driver.open()
        dev = drv.device(0)
        state["ctx_before"] = drv.primary_state(dev)
        if arm.sched is not None:
            drv.set_primary_flags(dev, arm.sched)
            state["ctx_set"] = drv.primary_state(dev)
        return drv
    except (Unavailable, DriverError) as exc:
        state["driver_error"] = str(exc)
        _say(a, f"skipped: {exc}")
        if arm.sched is not None:
            raise SystemExit(3) from None
        return None


class SyncProbe:
    """A torch-only host-syncing call shaped like problem 23's (the host reads 8 lengths, then one kernel sized by
    them), which also splits its window: an event just before the read and one just after it, so `sync_us` (the
    device-to-host copy and the host's wake-up, as the GPU's clock sees them) and `host_sync_us` (perf_counter around
    the read) are kept per call beside the window. The rest of the window is the host's work after the sync, the
    launch and the kernel. The events cost the host a few microseconds inside the window: a diagnostic, not a
    baseline."""

    def __init__(self, torch: Any | None) -> None:
        self.torch = torch  # None: on the CPU, no events (host times only)
        self.marks: list[tuple[Any, Any, float]] = []

    def __call__(self, lens: Any, x: Any) -> Any:
        e0 = e1 = None
        if self.torch is not None:
            e0, e1 = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        n = sum(lens.tolist())
        t1 = time.perf_counter()
        if e1 is not None:
            e1.record()
        self.marks.append((e0, e1, (t1 - t0) * 1e6))
        return x[:n].mul(2.0)

    def take(self, last: int) -> dict[str, list[float]]:
        """The last `last` calls' split (the timed ones), after the loop has synchronised; forgets every mark."""
        marks, self.marks = self.marks[-last:] if last else [], []
        return {"sync_us": [round(a.elapsed_time(b) * 1000.0, 3) for a, b, _ in marks if a is not None],
                "host_sync_us": [round(h, 2) for _, _, h in marks]}


def _child(a: argparse.Namespace) -> None:
    t_start = time.monotonic()
    state: dict[str, Any] = {"process": a.child, "arm": a.arm, "arm_label": ARMS[a.arm].label, "pid": os.getpid(),
                             "cpu_start": current_cpu(), "gradings": [], "errors": []}
    drv = _setup_host(a, state)

    import gc

    import torch

    from mkb.dsl import get_backend
    from mkb.measure import InputStream, L2Flusher, gpu_state, perf_window, sm_hold, stream_window, timed_loop
    from mkb.problems import baselines, find_problem, load_problem

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"  # the CPU runs the same bookkeeping without the window (tests: `--device cpu`)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.zeros(1, device=dev)
    sync()
    if drv is not None:
        state["ctx_after_torch"] = drv.primary_state(drv.device(0))
    state["torch"] = torch.__version__
    fns: dict[str, Callable[..., Any]] = {}
    probe: SyncProbe | None = None
    makes: dict[str, Callable[[int], tuple]] = {}
    for spec in a.kernels:
        try:
            p, name = spec.split("/")
            if spec == "probe/sync":
                m23 = load_problem(find_problem(23)).module
                makes[spec] = lambda s, m=m23: (m.make_inputs(s, device=dev, size="full")[2],
                                                torch.randn(4096, 576, device=dev))
                fns[spec] = probe = SyncProbe(torch if cuda else None)
            else:
                mod = load_problem(find_problem(int(p))).module
                makes[spec] = lambda s, mod=mod: tuple(mod.make_inputs(s, device=dev, size="full"))
                if name == "eager":
                    fns[spec] = getattr(mod, "eager", None) or mod.reference
                else:
                    b = next((b for b in baselines([int(p)]) if b.dsl == name), None)
                    if b is None:
                        raise LookupError(f"problem {p} has no {name} baseline")
                    backend = get_backend(name)
                    os.environ.update(backend.environment(a.arch))
                    fns[spec] = backend.load(b.path).solve
            x = makes[spec](1)
            fns[spec](*x)  # compile outside every timing
            sync()
            del x
        except Exception as exc:  # noqa: BLE001 - the other kernels still answer the question
            msg = f"{spec}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            state["errors"].append(msg)
            fns.pop(spec, None)
            _say(a, f"kernel unavailable: {msg}")
    if cuda:
        hold = sm_hold(dev)
        flusher = L2Flusher(dev)
        state["hold"] = {"grid": hold.grid, "block": hold.block, "mhz": hold.mhz}
        window: Callable[[Callable[[], Any]], tuple[Any, float, float]] = lambda f: stream_window(  # noqa: E731
            f, flush=flusher.flush, device=dev)
    else:
        hold, window = None, perf_window
    state["setup_s"] = time.monotonic() - t_start
    out = Path(a.child_out)
    out.write_text(json.dumps(state))  # the host state and flags are kept even if no grading finishes

    def warm_clocks(seconds: float) -> None:  # the grader's clock warm-up (without its NVML early exit)
        if not cuda:
            return
        w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(8):
                w = (w @ w).clamp_(-1, 1)
            sync()
        del w

    seed = 10_000_000 * (a.child + 1)
    for rep in range(a.reps):
        for spec in a.kernels:
            if spec not in fns:
                continue
            seed += 1000
            stream = InputStream(makes[spec], n_calls=a.warm + a.n, base_seed=seed,
                                 max_bytes=torch.cuda.mem_get_info(dev)[0] // 4 if cuda else None)
            warm_clocks(CLOCK_WARM_S)
            cpu0, ru0, t0 = current_cpu(), resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
            mhz0 = cpu_mhz(cpu0)
            rec = timed_loop(fns[spec], stream, warmup=a.warm, timed=a.n, hold=hold, window=window)
            wall = time.perf_counter() - t0
            ru1, cpu1 = resource.getrusage(resource.RUSAGE_THREAD), current_cpu()
            calls = rec.calls
            times = [round(t, 3) for t in rec.times_us]
            g = {"kernel": spec, "rep": rep, "median_us": statistics.median(times),
                 "q10_us": _quantile(times, 0.10), "q90_us": _quantile(times, 0.90), "times_us": times,
                 "host_us": [round(h, 2) for h in rec.host_us], "host_us_median": statistics.median(rec.host_us),
                 "tail_us_median": statistics.median(rec.tails_us), "hold_us": rec.hold_us,
                 "input_sets": stream.capacity, "cpu_before": cpu0, "cpu_after": cpu1, "cpu_mhz_before": mhz0,
                 "cpu_mhz_after": cpu_mhz(cpu1), "loop_wall_s": round(wall, 4),
                 "loop_cpu_s": round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 4),
                 "vol_switches_per_call": (ru1.ru_nvcsw - ru0.ru_nvcsw) / calls,
                 "invol_switches_per_call": (ru1.ru_nivcsw - ru0.ru_nivcsw) / calls}
            if fns[spec] is probe:
                split = probe.take(len(times))
                g.update(split, sync_us_median=statistics.median(split["sync_us"]) if split["sync_us"] else None)
            del stream
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            state["gradings"].append(g)
            state["wall_s"] = time.monotonic() - t_start
            out.write_text(json.dumps(state))  # after every grading: a process cut short keeps what it made
            _say(a, f"{spec:10s} rep {rep}  median {g['median_us']:9.3f} us  host {g['host_us_median']:8.1f} us  "
                    f"hold {rec.hold_us or 0:6.0f} us  cpu {cpu0}->{cpu1}  vcsw/call {g['vol_switches_per_call']:.2f}")
    if drv is not None:
        state["ctx_end"] = drv.primary_state(drv.device(0))
    state["cpu_end"] = current_cpu()
    state["gpu_after"] = gpu_state(dev).as_dict()
    state["wall_s"] = time.monotonic() - t_start
    out.write_text(json.dumps(state))


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    return statistics.quantiles(s, n=100, method="inclusive")[round(q * 100) - 1]


# ----------------------------------------------------------------------------------------------------------------
# the run: processes in sequence
# ----------------------------------------------------------------------------------------------------------------

class _Tee:
    """Prints to stdout and to the run's log."""

    def __init__(self, log: TextIO) -> None:
        self.log = log

    def __call__(self, *parts: Any) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()


def gpu_main(a: argparse.Namespace, *, open_driver: Callable[[], Driver] = Driver.open,
             local_cpus: Callable[[str | None], dict[str, Any]] = gpu_local_cpus,
             spawn: Callable[..., Any] = subprocess.run, clock: Callable[[], float] = time.monotonic) -> int:
    """The run: the host's facts, then one fresh process per planned arm while the budget lasts (the keywords are
    the host, replaced in the tests)."""
    try:
        drv = open_driver()
        dev = drv.device(0)
    except (Unavailable, DriverError) as exc:
        print(f"host_sync_levels: skipped: {exc}\nhint: --gpu runs on a host with an NVIDIA GPU and its driver; "
              f"--summary FILE prints a finished run's table anywhere", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "hostsync.log").open("a")
    say = _Tee(log)
    try:
        bus = drv.pci_bus_id(dev)
    except DriverError as exc:
        bus = None
        say(f"PCI address unknown: {exc}")
    local = local_cpus(bus)
    skipped = {}
    arms = []
    for x in a.arms:
        if ARMS[x].pin and not local["usable"]:
            skipped[x] = local["why"]
            say(f"arm {x} ({ARMS[x].label}) skipped: {local['why']}")
        else:
            arms.append(x)
    res: dict[str, Any] = {"args": {k: v for k, v in vars(a).items() if k != "out"}, "driver_version": drv.version(),
                           "host": host_facts(), "gpu_local_cpus": local, "skipped_arms": skipped,
                           "plan": plan_arms(a.processes, arms, start=a.start), "processes": [], "errors": [],
                           "elapsed_s": 0.0}
    say(f"host_sync_levels: driver {res['driver_version']}, GPU {bus}, local CPUs {local['source']}: "
        f"{_ranges(local['local'] or [])}, usable {_ranges(local['usable'])} of {_ranges(local['allowed'])}"
        f"{' (' + local['why'] + ')' if local['why'] else ''}; plan {' '.join(res['plan'])}")
    budget = Budget(start_by_s=a.budget_s, child_timeout_s=a.child_timeout_s, total_s=a.total_s)
    t0 = clock()
    for i, arm in enumerate(res["plan"]):
        limit = budget.timeout(clock() - t0)
        if limit is None:
            res["errors"].append(f"processes {a.start + i}.. not started: budget ({clock() - t0:.0f} s)")
            say(res["errors"][-1])
            break
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--gpu", "--child", str(a.start + i), "--arm", arm,
               "--child-out", path, "--kernels", *a.kernels, "--reps", str(a.reps), "--n", str(a.n), "--warm",
               str(a.warm), "--arch", a.arch]
        if ARMS[arm].pin:
            cmd += ["--cpus", *map(str, local["usable"])]
        try:
            r = spawn(cmd, timeout=limit, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            rc: int | str = r.returncode
            text_out = r.stdout
        except subprocess.TimeoutExpired as exc:
            rc = f"stopped after {limit:.0f} s"
            text_out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log.write(text_out)
        log.flush()
        text = Path(path).read_text() if Path(path).stat().st_size else ""
        Path(path).unlink(missing_ok=True)
        proc = json.loads(text) if text else None
        if proc is not None:
            res["processes"].append(proc)
        if rc != 0:
            tail = text_out.strip().splitlines()[-1:] if text_out.strip() else []
            how = f"exited {rc}" if isinstance(rc, int) else rc
            first = "" if proc and proc["gradings"] else " before its first grading"
            res["errors"].append(f"process {a.start + i} (arm {arm}) {how}{first}" + (f": {tail[0]}" if tail else ""))
            say(res["errors"][-1])
        else:
            p = res["processes"][-1]
            say(f"process {a.start + i} arm {arm}: {len(p['gradings'])} gradings in {p['wall_s']:.0f} s")
        res["elapsed_s"] = clock() - t0
        (out / "hostsync.json").write_text(json.dumps(res))
    res["elapsed_s"] = clock() - t0
    (out / "hostsync.json").write_text(json.dumps(res))
    summarise(res, say=say)
    log.close()
    return 0 if res["processes"] else 1


def _ranges(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (a CPU set the way sysfs writes it)."""
    s = sorted(cpus)
    if not s:
        return "-"
    parts, lo = [], s[0]
    for prev, cur in zip(s, s[1:] + [None]):
        if cur is None or cur != prev + 1:
            parts.append(f"{lo}-{prev}" if prev != lo else f"{lo}")
            lo = cur
    return ",".join(parts)


# ----------------------------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One kernel under one arm: the spread of its gradings' medians and where it sits (process or grading)."""

    kernel: str
    arm: str
    n: int
    processes: int
    mean_us: float
    sd_pct: float  # sd of the gradings' medians / mean
    tau_pct: float  # between-grading component beyond each grading's own noise
    sd_process_pct: float  # sd of the process means
    sd_reps_pct: float  # pooled sd of the gradings within a process
    se_within_pct: float  # rms bootstrap se of a grading's median
    host_us: float  # median over gradings of the median host time per call
    vcsw_per_call: float  # mean voluntary context switches per call (a host that sleeps in its waits: ~1 or more)
    min_us: float
    max_us: float
    sync_us: float | None = None  # probe/sync only: median copy + wake-up inside the window (the GPU's clock)


def table(res: dict) -> list[Row]:
    """Per kernel and arm, from the processes' gradings (stdlib: the GPU host summarises its own run)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for p in res["processes"]:
        for g in p["gradings"]:
            groups.setdefault((g["kernel"], p["arm"]), []).append(dict(g, process=p["process"]))
    order = {k: i for i, k in enumerate(res.get("args", {}).get("kernels") or KERNELS)}
    rows = []
    for (k, arm), gs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][0], kv[0][1])):
        s = spread(gs)
        rows.append(Row(
            kernel=k, arm=arm, n=s.n, processes=s.processes, mean_us=s.mean_us, sd_pct=s.sd_pct, tau_pct=s.tau_pct,
            sd_process_pct=s.sd_process_pct, sd_reps_pct=s.sd_reps_pct, se_within_pct=s.se_within_pct,
            host_us=statistics.median(g["host_us_median"] for g in gs),
            vcsw_per_call=statistics.fmean(g["vol_switches_per_call"] for g in gs),
            min_us=s.min_us, max_us=s.max_us,
            sync_us=statistics.median(syncs) if (syncs := [g["sync_us_median"] for g in gs
                                                           if g.get("sync_us_median") is not None]) else None))
    return rows


def summarise(res: dict, *, say: Callable[..., None] = print) -> list[Row]:
    """Prints the run's processes and the table; returns the rows."""
    say(f"\n# host-sync levels: {len(res['processes'])} fresh processes, {res['elapsed_s']:.0f} s; "
        f"errors: {res['errors'] or 'none'}; skipped arms: {res.get('skipped_arms') or 'none'}")
    for p in res["processes"]:
        ctx = p.get("ctx_after_torch") or {}
        cpus = sorted({c for g in p["gradings"] for c in (g["cpu_before"], g["cpu_after"]) if c is not None})
        say(f"  process {p['process']} arm {p['arm']} ({p['arm_label']}): context {ctx.get('sched', 'unknown')} "
            f"(0x{ctx.get('flags', 0):x}{', set ' + p['ctx_set']['sched'] if p.get('ctx_set') else ''}), affinity "
            f"{_ranges(p['affinity'])}, ran on CPUs {_ranges(cpus)}, {len(p['gradings'])} gradings, "
            f"{p.get('wall_s') or 0:.0f} s{'; ' + '; '.join(p['errors']) if p.get('errors') else ''}")
    rows = table(res)
    say("\nkernel      arm  n  procs   mean us   sd(all)   tau    sd(process means)  sd(reps in a process)  se_within"
        "  host us  vcsw/call  min..max us   (probe: sync us)")
    for r in rows:
        say(f"{r.kernel:11s} {r.arm:3s} {r.n:2d} {r.processes:3d}  {r.mean_us:9.2f}  {r.sd_pct:6.2f}%  {r.tau_pct:6.2f}%  "
            f"{r.sd_process_pct:8.2f}%           {r.sd_reps_pct:8.2f}%              {r.se_within_pct:5.2f}%  "
            f"{r.host_us:7.1f}  {r.vcsw_per_call:8.2f}   {r.min_us:.2f}..{r.max_us:.2f}"
            + (f"   {r.sync_us:.1f}" if r.sync_us is not None else ""))
    say("\narms: " + ", ".join(f"{a.name} {a.label}" for a in ARMS.values()))
    say("Reading (docs/timing-repeatability.md, 'Host-syncing kernels'): the 23 rows' tau under b/e against a; c the"
        "\ncontrast (a host that sleeps); probe/sync is the same sync without a DSL; 28/cute must not move with the arm.")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="run the GPU experiment (see the module docstring)")
    ap.add_argument("--summary", default=None, help="print the table again from a run's hostsync.json")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-host-sync"))
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--start", type=int, default=0, help="continue the arm rotation of an earlier call from here")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--budget-s", type=float, default=START_BY_S, help="start no new process after this many seconds")
    ap.add_argument("--child-timeout-s", type=float, default=CHILD_TIMEOUT_S, help="a process is stopped after this")
    ap.add_argument("--total-s", type=float, default=TOTAL_S, help="the whole run ends within this")
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), help="PROBLEM/DSL, PROBLEM/eager or probe/sync")
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--n", type=int, default=N)
    ap.add_argument("--warm", type=int, default=WARM)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--arm", default="a", choices=list(ARMS), help=argparse.SUPPRESS)
    ap.add_argument("--cpus", nargs="*", type=int, default=[], help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # a process on the CPU: its tests
    a = ap.parse_args(argv)
    if a.summary:
        path = Path(a.summary)
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"error: cannot read {path}: {exc}\nhint: --summary takes the hostsync.json a --gpu run wrote",
                  file=sys.stderr)
            return 2
        summarise(res)
    elif a.gpu and a.child is not None:
        _child(a)
    elif a.gpu:
        return gpu_main(a)
    else:
        ap.print_usage(sys.stderr)
        print("error: nothing to do\nhint: --gpu runs the experiment, --summary FILE prints a run's table",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
