"""Why one kernel's median moves between gradings: the timing policy's variants side by side on problem 28.

One process times the problem-28 baselines (CuTe, TIRx) and eager under variants of the DESIGN window
(sync; event; solve; device-wide sync; event) that differ in one thing each: the L2 flush (add_ on
2 x L2 = current, memset, a read-only pass, none), the input placement (every set pre-made, a ring of
3 sets, one arena), the host (gc off), and a device-only diagnostic (`queued`: a GPU sleep before
the window hides the host dispatch). Each variant is repeated as `reps` independent "gradings"
(fresh input sets each); the table gives the spread of the median across them, the per-call CV, the
fraction of slow calls and the host dispatch time. It also prices the trusted phase's pieces
(make_inputs, expect, gpu_state, profiler first use, empty kernels) for the overhead work.

    python benchmarks/timing_probe.py --out $OUT --budget-s 150
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mkb.grader._backends import backend_from_target, backend_target  # noqa: E402
from mkb.grader._problems import load_problem  # noqa: E402
from mkb.measure import InputStream, expect, gpu_state, l2_bytes, tensor_bytes  # noqa: E402

P = 28
DEV = torch.device("cuda")


def pr(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Flush:
    def __init__(self, kind: str):
        self.kind = kind
        n = 2 * l2_bytes()
        if kind in ("add", "zero"):
            self.buf = torch.empty(n, dtype=torch.uint8, device=DEV)
        elif kind == "read":
            self.buf = torch.ones(n // 4, dtype=torch.float32, device=DEV)
            self.acc = torch.empty((), dtype=torch.float32, device=DEV)

    def __call__(self):
        if self.kind == "add":
            self.buf.add_(1)
        elif self.kind == "zero":
            self.buf.zero_()
        elif self.kind == "read":
            torch.sum(self.buf, dim=(0,), out=self.acc)


def sources(kind: str, make, n: int, seed0: int):
    """(inputs(i), seconds to build up front)."""
    t0 = time.perf_counter()
    if kind == "premade":
        sets = [make(seed0 + i) for i in range(n)]
        torch.cuda.synchronize()
        return (lambda i: sets[i]), time.perf_counter() - t0
    if kind == "ring3":
        first = make(seed0)
        s = InputStream(make, n_calls=n, base_seed=seed0, max_bytes=3 * tensor_bytes(first), first_pass=None)  # as recorded before policy v5
        del first
        return s, time.perf_counter() - t0
    if kind == "same":
        one = make(seed0)
        return (lambda i: one), time.perf_counter() - t0
    if kind == "arena":  # every set in one allocation, same relative layout, values from one normal_ pass
        x0 = make(seed0)
        shapes = [t.shape for t in x0]
        numels = [t.numel() for t in x0]
        per = sum(numels)
        arena = torch.empty(n, per, dtype=torch.bfloat16, device=DEV)
        arena.normal_()
        arena[:, numels[0] + numels[1]:] += 1.0  # weight around 1

        def get(i):
            out, o = [], 0
            for sh, k in zip(shapes, numels):
                out.append(arena[i, o:o + k].view(sh))
                o += k
            return tuple(out)

        torch.cuda.synchronize()
        return get, time.perf_counter() - t0
    raise ValueError(kind)


def loop(fn, inputs, *, n: int, warm: int, flush: Flush, queued=False, gc_off=False, record_ptrs=False, passes=1, spin=False):
    s_ev = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    e_ev = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    res = []
    if gc_off:
        gc.collect()
        gc.disable()
    try:
        for p in range(passes):
            host, ptrs = [], []
            for i in range(warm + n):
                args = inputs(i)
                flush()
                torch.cuda.synchronize()
                k = i - warm
                if queued:
                    torch.cuda._sleep(400_000)  # ~200 us at 1.98 GHz: the host enqueues the call meanwhile
                if k >= 0:
                    s_ev[k].record()
                t0 = time.perf_counter()
                out = fn(*args)
                t1 = time.perf_counter()
                if not queued:
                    if spin:  # keep the host thread busy while the GPU works: no idle vCPU to wake up
                        st = torch.cuda.current_stream()
                        while not st.query():
                            pass
                    torch.cuda.synchronize()
                if k >= 0:
                    e_ev[k].record()
                torch.cuda.synchronize()
                if k >= 0:
                    host.append((t1 - t0) * 1e6)
                    if record_ptrs:
                        ptrs.append([args[0].data_ptr(), args[1].data_ptr(), out.data_ptr()])
                del out
            times = [a.elapsed_time(b) * 1000.0 for a, b in zip(s_ev, e_ev)]
            res.append((times, host, ptrs))
    finally:
        if gc_off:
            gc.enable()
    return res


def stats(runs: list[list[float]]) -> dict:
    meds = [statistics.median(t) for t in runs]
    means = [statistics.fmean(t) for t in runs]
    allt = [x for t in runs for x in t]
    lo = min(statistics.quantiles(t, n=10)[0] for t in runs)
    slow = sum(1 for x in allt if x > 1.12 * lo) / len(allt)
    mm = statistics.median(meds)
    return {
        "median_us": mm, "spread": (max(meds) - min(meds)) / mm, "mean_spread": (max(means) - min(means)) / statistics.median(means),
        "medians": [round(m, 1) for m in meds], "cv": statistics.median(statistics.stdev(t) / statistics.fmean(t) for t in runs),
        "slow_frac": slow, "p10": lo,
        "min_spread": (max(min(t) for t in runs) - min(min(t) for t in runs)) / mm,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/probe"))
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=100)
    a = ap.parse_args()
    t_start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for dsl in ("cute", "tirx"):
        os.environ.update(backend_from_target(backend_target(dsl), dsl).environment("sm_90a"))
    mod = load_problem(P)
    make = lambda s: tuple(mod.make_inputs(s, device=DEV, size="full"))  # noqa: E731
    eager = getattr(mod, "eager", None) or mod.reference
    costs = {}
    # ---- the trusted phase's pieces ----
    t0 = time.perf_counter(); torch.empty(1, device=DEV).fill_(0); torch.cuda.synchronize(); costs["cuda_init_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); st = gpu_state(); costs["gpu_state_s"] = time.perf_counter() - t0; costs["gpu_state_source"] = st.source
    t0 = time.perf_counter(); x = make(1); torch.cuda.synchronize(); costs["make_first_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); keep = [make(2 + i) for i in range(20)]; torch.cuda.synchronize(); costs["make_fresh_alloc_s"] = (time.perf_counter() - t0) / 20
    del keep
    t0 = time.perf_counter(); keep = [make(30 + i) for i in range(20)]; torch.cuda.synchronize(); costs["make_cached_alloc_s"] = (time.perf_counter() - t0) / 20
    del keep
    t0 = time.perf_counter(); e = expect(mod, x); torch.cuda.synchronize(); costs["expect_first_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(5):
        e = expect(mod, make(100 + i))
    torch.cuda.synchronize(); costs["expect_s"] = (time.perf_counter() - t0) / 5
    del e
    from mkb.grader._trace import profile_call
    buf = torch.empty(1024, device=DEV)
    for tag in ("profile_first_s", "profile_next_s"):
        t0 = time.perf_counter(); profile_call(lambda: buf.fill_(1.0), torch.cuda.synchronize); costs[tag] = time.perf_counter() - t0
    pr("costs", json.dumps(costs))

    solves = {"eager": eager}
    for dsl in ("cute", "tirx"):
        b = backend_from_target(backend_target(dsl), dsl)
        m = b.load(next((REPO / "problems").glob(f"*/{P:02d}_*/{dsl}.py")))
        t0 = time.perf_counter(); m.solve(*x); torch.cuda.synchronize(); costs[f"{dsl}_compile_s"] = time.perf_counter() - t0
        solves[dsl] = m.solve
        ek = getattr(b, "empty_kernel", None)
        if ek is not None:
            try:
                t0 = time.perf_counter(); f = ek(); f(); torch.cuda.synchronize(); costs[f"{dsl}_empty_kernel_s"] = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001
                costs[f"{dsl}_empty_kernel_s"] = f"failed: {exc}"
    del x
    # clocks up
    w = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        w = (w @ w).clamp_(-1, 1)
    torch.cuda.synchronize(); del w

    variants = [
        # name, fn, source, flush, extra
        ("cute current (add_ 2xL2, premade)", "cute", "premade", "add", {}),
        ("cute flush=memset", "cute", "premade", "zero", {}),
        ("cute flush=read", "cute", "premade", "read", {}),
        ("cute flush=none", "cute", "premade", "none", {}),
        ("cute ring3 add_", "cute", "ring3", "add", {}),
        ("cute arena add_", "cute", "arena", "add", {}),
        ("cute same-set add_", "cute", "same", "add", {}),
        ("cute spin-sync add_", "cute", "premade", "add", {"spin": True}),
        ("cute spin-sync read", "cute", "premade", "read", {"spin": True}),
        ("tirx spin-sync add_", "tirx", "premade", "add", {"spin": True}),
        ("eager spin-sync add_", "eager", "premade", "add", {"spin": True}),
        ("cute gc-off add_", "cute", "premade", "add", {"gc_off": True}),
        ("cute queued add_ (device only)", "cute", "premade", "add", {"queued": True}),
        ("cute queued read (device only)", "cute", "premade", "read", {"queued": True}),
        ("cute ring3 read", "cute", "ring3", "read", {}),
        ("tirx current", "tirx", "premade", "add", {}),
        ("tirx flush=read", "tirx", "premade", "read", {}),
        ("tirx ring3 read", "tirx", "ring3", "read", {}),
        ("eager current", "eager", "premade", "add", {}),
        ("eager flush=read", "eager", "premade", "read", {}),
        ("cute arena read", "cute", "arena", "read", {}),
        ("cute ring3 read spin", "cute", "ring3", "read", {"spin": True}),
        ("tirx ring3 read spin", "tirx", "ring3", "read", {"spin": True}),
    ]
    table, raw = [], {}
    seed = 10_000
    for name, which, src, fl, extra in variants:
        if time.monotonic() - t_start > a.budget_s:
            pr("SKIP", name)
            continue
        flush = Flush(fl)
        runs, hosts, gen = [], [], []
        corr = None
        for r in range(a.reps):
            seed += 1000
            inp, g = sources(src, make, 10 + a.n, seed)
            gen.append(g)
            res = loop(solves[which], inp, n=a.n, warm=10, flush=flush, record_ptrs=(r == 0), passes=2 if r == 0 else 1, **extra)
            runs.append(res[0][0])
            hosts.append(statistics.median(res[0][1]))
            if r == 0:
                raw[name] = {"pass0": res[0][0], "pass1": res[1][0], "ptrs": res[0][2], "host": res[0][1]}
                t0s, t1s = res[0][0], res[1][0]
                try:
                    corr = statistics.correlation(t0s, t1s)
                except statistics.StatisticsError:
                    corr = None
            del inp
            gc.collect()
            torch.cuda.empty_cache()
        s = stats(runs)
        s.update(name=name, host_us=statistics.median(hosts), gen_s=statistics.median(gen), pass_corr=corr)
        table.append(s)
        pr(f"{name:36s} med {s['median_us']:7.1f} spread {100*s['spread']:5.1f}% meanspr {100*s['mean_spread']:5.1f}% "
           f"cv {100*s['cv']:5.1f}% slow {100*s['slow_frac']:4.0f}% host {s['host_us']:5.1f} corr {corr if corr is None else round(corr, 2)} "
           f"gen {s['gen_s']:.2f}s meds {s['medians']}")
        del flush
    (out / "probe.json").write_text(json.dumps({"costs": costs, "table": table, "gpu": gpu_state().as_dict()}, indent=1))
    (out / "probe_raw.json").write_text(json.dumps(raw))
    pr("COSTS", json.dumps(costs))
    pr("TABLE (spread = (max-min)/median of the per-grading medians over", a.reps, "gradings of", a.n, "timed calls)")
    pr(f"{'variant':36s} {'median':>8s} {'spread':>7s} {'meanspr':>7s} {'cv':>6s} {'slow':>5s} {'host':>6s} {'corr':>5s}")
    for s in table:
        pr(f"{s['name']:36s} {s['median_us']:8.1f} {100*s['spread']:6.1f}% {100*s['mean_spread']:6.1f}% {100*s['cv']:5.1f}% "
           f"{100*s['slow_frac']:4.0f}% {s['host_us']:6.1f} {'' if s['pass_corr'] is None else round(s['pass_corr'], 2)!s:>5s}")
    pr("done in", round(time.monotonic() - t_start), "s")


if __name__ == "__main__":
    main()
