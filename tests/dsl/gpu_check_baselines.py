"""GPU check of the baseline kernels found in the problem folders (run by hand on the H200, not collected by pytest).

For each problem and DSL: full-size inputs on the GPU, the kernel's output against the fp32
reference and the fp64 anchor (the grader's rule: error vs anchor <= 3 x max(reference error,
eps x max|anchor|); exact outputs must be equal), end-to-end time per call (sync, event, call,
sync, event; median) against eager, and the profiler's kernel names against the backend's
kernel_name_patterns. Writes $OUT/baselines.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mkb.dsl import dsl_names, get_backend  # noqa: E402

for _dsl in dsl_names():
    os.environ.update(get_backend(_dsl).environment("sm_90a"))

import torch  # noqa: E402

from mkb.problems import baselines, load_problem_module  # noqa: E402

# MKB_PROBLEMS / MKB_DSLS narrow the run; by default every baseline the problem folders hold
_ONLY = [int(a) for a in os.environ["MKB_PROBLEMS"].split(",")] if os.environ.get("MKB_PROBLEMS") else None
BASELINES = baselines(_ONLY, dsls=os.environ["MKB_DSLS"].split(",") if os.environ.get("MKB_DSLS") else None)
EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def clone(inputs):
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)


def to64(inputs):
    return tuple(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs)


def time_calls(fn, inputs, n):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*inputs)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    return statistics.median(times)


def check(num: int, dsl: str, path: Path) -> dict:
    backend = get_backend(dsl)
    prob = load_problem_module(num)
    meta = prob.META
    rec = {"problem": num, "dsl": dsl}
    t0 = time.perf_counter()
    mod = backend.load(path)
    rec["import_s"] = round(time.perf_counter() - t0, 2)
    inputs = prob.make_inputs(1, device="cuda", size="full")
    expected = as_tuple(prob.reference(*clone(inputs)))
    anchor = as_tuple(prob.reference(*to64(clone(inputs))))
    got_in = clone(inputs)
    t0 = time.perf_counter()
    got = as_tuple(mod.solve(*got_in))
    torch.cuda.synchronize()
    rec["first_call_s"] = round(time.perf_counter() - t0, 2)
    outs = []
    ok = True
    for o, g, r, a in zip(meta.outputs, got, expected, anchor):
        if o.compare == "exact":
            good = bool(torch.equal(g, r))
            outs.append({"name": o.name, "exact": good})
        else:
            a64 = a.double()
            err = (g.double() - a64).abs().max().item()
            ref_err = (r.double() - a64).abs().max().item()
            tol = 3 * max(ref_err, EPS[r.dtype] * a64.abs().max().item())
            good = bool(torch.isfinite(g).all()) and err <= tol
            diff = (g.double() - r.double()).abs()
            outs.append({"name": o.name, "err_vs_fp64": err, "ref_err_vs_fp64": ref_err, "tol": tol, "ok": good,
                         "max_diff_vs_ref": diff.max().item(), "frac_differs_from_ref": (diff > 0).double().mean().item()})
        ok = ok and good
    rec["outputs"] = outs
    rec["correct"] = ok
    n = 10 if num == 29 else 50
    eager = getattr(prob, "eager", prob.reference)
    for _ in range(3):
        mod.solve(*got_in)
        eager(*got_in)
    rec["kernel_us"] = round(time_calls(mod.solve, got_in, n), 1)
    rec["eager_us"] = round(time_calls(eager, got_in, n), 1)
    rec["speedup"] = round(rec["eager_us"] / rec["kernel_us"], 3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        mod.solve(*got_in)
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
    pats = backend.kernel_name_patterns(mod)
    rec["profiler_kernels"] = names
    rec["patterns"] = list(pats)
    rec["names_match"] = bool(names) and all(any(re.search(p, nm) for p in pats) for nm in names)
    return rec


def main() -> None:
    out = Path(os.environ.get("OUT", "."))
    results = []
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for b in BASELINES:
        num, dsl = b.problem, b.dsl
        try:
            rec = check(num, dsl, b.path)
        except Exception as e:  # noqa: BLE001
            rec = {"problem": num, "dsl": dsl, "error": f"{type(e).__name__}: {str(e)[-1500:]}", "tb": traceback.format_exc()[-3000:]}
        results.append(rec)
        short = {k: v for k, v in rec.items() if k not in ("tb",)}
        print(json.dumps(short), flush=True)
        (out / "baselines.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
