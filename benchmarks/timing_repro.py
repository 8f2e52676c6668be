"""Why a kernel's median moves between gradings on problems where it does (25, 72): host, device or clocks.

`benchmarks/timing_probe.py` settled the window for problem 28 (one ~80 us kernel). The grading-queue run
(events/h200-grading-queue) then saw problem 25's TIRx baseline (~20 us) and both problem-72 baselines
(~300 us) move 7-21% between two gradings, and problem 72's eager 10%. This script times each kernel
(the problem's discovered baselines and its eager) in `--reps` independent "gradings" with the grader's
own primitives (`mkb.measure`: pre-made fresh input sets, the read flush, `stream_window`) under variants
that each remove one suspect:

- `policy`: exactly the grader's window.
- `nohold`: the v2 window (flush only, ~100 us, then start): the host's dispatch of the call is in the
  window wherever it outruns the flush.
- `sleep`: a single-thread GPU sleep (~1 ms) instead of the SM hold: device time too, but the rest of
  the GPU is idle before the window opens.
With `--side`, a pseudo-kernel `side` (a bf16 GEMM launched on a second stream that the current stream
then waits for) shows what the hold is for: under `sleep` its GEMM runs before the window opens and is
not timed; under `policy` it is.

Every grading reads the SM clock, temperature and power (nvidia-smi) before and after its calls: if the
medians follow the clock, the spread is the GPU's clock state.

`--phases` repeats the table after changing the process the way a grader worker is changed before it
times anything: `harness` imports the grader's harness (torch._dynamo and one dispatch mode), `profiler`
runs one call under torch.profiler (CUPTI) as the worker's warm start does. If the kernels slow down
after a phase, the grader's own process state is part of every timing it makes.

Per grading it records the median, CV, the host dispatch time (perf_counter around the call inside the
window), and the clock readings; the table gives the spread (max - min) / median of the medians.

    python benchmarks/timing_repro.py --problems 25 72 --out $OUT --budget-s 200
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mkb.measure import InputStream, L2Flusher, stream_window  # noqa: E402
from mkb.measure._timing import summarize  # noqa: E402

DEV = torch.device("cuda")


def pr(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def smi() -> dict:
    """SM clock (MHz), temperature (C), power (W) right now, outside any window."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active",
                              "--format=csv,noheader,nounits", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                             capture_output=True, text=True, timeout=10).stdout.strip().split(", ")
        return {"sm_mhz": float(out[0]), "temp_c": float(out[1]), "power_w": float(out[2]), "throttle": out[3]}
    except Exception as exc:  # noqa: BLE001 - a diagnostic; never stop the probe for it
        return {"error": str(exc)[:80]}


def grading(fn, make, *, n: int, warm: int, seed0: int, variant: str, flusher: L2Flusher) -> dict:
    """One independent grading-like timing: fresh pre-made input sets, `warm` + `n` calls."""
    stream = InputStream(make, n_calls=warm + n, base_seed=seed0, max_bytes=torch.cuda.mem_get_info(DEV)[0] // 4, first_pass=None)  # as recorded before policy v5
    host: list[float] = []
    times: list[float] = []

    def call(args):
        t0 = time.perf_counter()
        out = fn(*args)
        host.append((time.perf_counter() - t0) * 1e6)
        return out

    hold = {"policy": True, "nohold": None, "sleep": lambda: torch.cuda._sleep(2_000_000)}[variant]

    before = smi()
    for i in range(warm + n):
        args = stream(i)
        out, us, _tail = stream_window(lambda: call(args), flush=flusher.flush, device=DEV, hold=hold)
        del out
        if i >= warm:
            times.append(us)
    after = smi()
    t = summarize(times)
    res = {"median_us": t.median_us, "cv": t.cv, "min_us": t.min_us, "host_us": statistics.median(host[warm:]),
           "premade": stream.premade, "sets": stream.capacity, "times_us": [round(x, 2) for x in times]}
    res.update(clock_before=before, clock_after=after)
    del stream
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, nargs="+", default=[25, 72])
    ap.add_argument("--variants", default="policy,nohold")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/timing-repro"))
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--kernels", default=None, help="only these (eager, cute, tirx); default all")
    ap.add_argument("--side", action="store_true", help="also time the side-stream pseudo-kernel (see the docstring)")
    ap.add_argument("--phases", default="base", help="base[,harness][,profiler]: process states, in this order")
    a = ap.parse_args(argv)
    from mkb.dsl import get_backend
    from mkb.problems import baselines, find_problem, load_problem

    t_start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    flusher = L2Flusher(DEV)
    # clocks up before anything is timed (as the grader's clock warm-up does)
    w = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        w = (w @ w).clamp_(-1, 1)
    torch.cuda.synchronize()
    del w
    rows, raw = [], {}
    seed = 50_000
    fns_of: dict[int, dict] = {}
    makes: dict[int, object] = {}
    for p in a.problems:
        mod = load_problem(find_problem(p))
        make = lambda s, mod=mod: tuple(mod.make_inputs(s, device=DEV, size="full"))  # noqa: E731
        fns = {"eager": getattr(mod, "eager", None) or mod.reference}
        x = make(1)
        for b in [b for b in baselines([p]) if a.kernels is None or b.dsl in a.kernels.split(",")]:
            backend = get_backend(b.dsl)
            os.environ.update(backend.environment("sm_90a"))
            m = backend.load(b.path)
            m.solve(*x)  # compile outside every timing
            fns[b.dsl] = m.solve
        torch.cuda.synchronize()
        del x
        fns_of[p] = {k: f for k, f in fns.items() if a.kernels is None or k in a.kernels.split(",")}
        makes[p] = make
    if a.side:
        def side(x, w):
            s2 = torch.cuda.Stream()
            with torch.cuda.stream(s2):
                y = x @ w
            torch.cuda.current_stream().wait_stream(s2)
            return y

        makes[0] = lambda s: (torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(s)),
                              torch.randn(8192, 4096, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(s + 1)))
        fns_of[0] = {"side": side}
    for phase in a.phases.split(","):
        if phase == "harness":
            import mkb.grader._harness  # noqa: F401  - what a worker imports before any timing
        elif phase == "profiler":
            from mkb.grader._trace import profile_call

            buf = torch.empty(1024, device=DEV)
            profile_call(lambda: buf.fill_(1.0), torch.cuda.synchronize)
        elif phase != "base":
            raise SystemExit(f"unknown phase {phase!r}")
        for p in ([0] if a.side else []) + a.problems:
            make = makes[p]
            for name, fn in fns_of[p].items():
                for variant in a.variants.split(","):
                    if time.monotonic() - t_start > a.budget_s:
                        pr("SKIP", p, name, variant, "(budget)")
                        continue
                    gs = []
                    for r in range(a.reps):
                        seed += 1000
                        gs.append(grading(fn, make, n=a.n, warm=a.warm, seed0=seed, variant=variant, flusher=flusher))
                    meds = [g["median_us"] for g in gs]
                    mm = statistics.median(meds)
                    row = {"phase": phase, "problem": p, "kernel": name, "variant": variant, "median_us": mm,
                           "spread": (max(meds) - min(meds)) / mm, "medians": [round(m, 2) for m in meds],
                           "cv": statistics.median(g["cv"] for g in gs), "host_us": statistics.median(g["host_us"] for g in gs),
                           "premade": all(g["premade"] for g in gs),
                           "clocks": [(g["clock_before"].get("sm_mhz"), g["clock_after"].get("sm_mhz")) for g in gs]}
                    rows.append(row)
                    raw[f"{phase}/{p}/{name}/{variant}"] = gs
                    pr(f"{phase:8s} {p} {name:6s} {variant:7s} med {mm:9.2f} us spread {100 * row['spread']:5.2f}% cv {100 * row['cv']:5.1f}% "
                       f"host {row['host_us']:6.1f} us premade {row['premade']} meds {row['medians']}"
                       + f" clocks {row['clocks']}")
    (out / "timing_repro.json").write_text(json.dumps({"rows": rows, "raw": raw}, default=str))
    pr("TABLE (spread = (max - min) / median of", a.reps, "gradings' medians,", a.n, "timed calls each)")
    for r in rows:
        pr(f"  {r['phase']:8s} {r['problem']} {r['kernel']:6s} {r['variant']:13s} {r['median_us']:9.2f} us  spread {100 * r['spread']:5.2f}%  "
           f"cv {100 * r['cv']:5.1f}%  host {r['host_us']:6.1f} us")
    pr("done in", round(time.monotonic() - t_start), "s")


if __name__ == "__main__":
    main()
