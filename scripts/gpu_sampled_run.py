"""The H200 run of grader 2.3's sampled expectations at full size: problems 50, 34 and 38 through the grader's own
trusted plan, every kept expectation checked against known-good outputs, with time and peak memory.

None of the three has a DSL baseline, so no full grading can pass (the integrity stage demands the DSL's kernels):
this runs the part of a grading that sampling changes. For each problem: `mkb.grader._harness._Plan` with the shipped
GraderConfig (full size, 17 expectations, "auto": it must pick "sampled"), its peak device memory; then for each of
the 17 (seed, expectation) pairs the inputs made again from the seed, the poison blocks (`_poison`), and two
candidates compared as the grader compares them: the problem's reference (the known-good control: it must pass) and
its eager (the speed baseline; it should pass, and is recorded either way). Then the negative controls on the final
draw's eager output: many elements wrong, all zeros, one NaN, each with the reason the grader must give; and, with
the plan released, draw 0's expectation again whole and the whole comparison of the same eager output beside the
sampled one (same verdict; the sampled max error at most the whole one).

    export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
    python3 scripts/gpu_sampled_run.py [--problems 50,34,38] 2>&1 | tee $OUT/log

$OUT gets: log (from tee) and summary.json (per problem: the plan's choice and figures, every check, the controls,
seconds and peak GiB per phase). Expected: ~1-2 min per problem; peak
(benchmarks/full_size_memory.py, a bound from shapes) ~95 GiB for 50, ~69 for 34, ~60 for 38: the plan's compile set,
the 17 sampled expectations and one whole expectation being computed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

GiB = 2**30


CUDA = True  # False only for the CPU dry run (--device cpu)


def _peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / GiB, 2) if CUDA else None


def _reset_peak() -> None:
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _checks(cmp) -> list[dict]:
    return [{"name": c.name, "ok": c.ok, "reason": str(c.reason) if c.reason else None, "max_abs_err": c.max_abs_err,
             "tolerance": c.tolerance, "message": c.message[:200]} for c in cmp.checks]


def run_problem(number: int, log, cfg) -> dict:
    from mkb.grader._harness import _Plan, _poison
    from mkb.grader._problems import load_problem
    from mkb.measure import as_tuple, compare, expect
    from mkb.reasons import Reason

    mod = load_problem(number)
    meta = mod.META
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    make = lambda s: tuple(mod.make_inputs(s, device=torch.device(cfg.device), size=cfg.size))  # noqa: E731
    eager = getattr(mod, "eager", None) or mod.reference
    row: dict = {"problem": number, "slug": getattr(meta, "name", str(number))}
    _reset_peak()
    t0 = time.perf_counter()
    plan = _Plan(mod, cfg, rng, make, lambda: rng.getrandbits(62), device=cfg.device)
    if CUDA:
        torch.cuda.synchronize()
    row["plan"] = {"expectations": plan.expectations, "sampled_positions": plan.sampled_positions,
                   "n_expectations": len(plan.draws) + len(plan.recheck_sets) + 1,
                   "kept_gib": round(plan.kept_bytes / GiB, 3), "whole_gib": round(plan.whole_bytes / GiB, 2),
                   "working_gib": round((plan.working_bytes or 0) / GiB, 2),
                   "free_gib_before": round((plan.free_bytes or 0) / GiB, 2),
                   "seconds": round(time.perf_counter() - t0, 2), "peak_gib": _peak_gib(),
                   "allocated_after_gib": round(torch.cuda.memory_allocated() / GiB, 2) if CUDA else None}
    log(f"[{number}] plan: {row['plan']}")
    kept = ([("draw", k, s, e) for k, (s, e) in enumerate(plan.draws)]
            + [("recheck", k, s, e) for k, (s, e) in sorted(plan.recheck_sets.items())]
            + [("final", 0, plan.final_seed, plan.final_expected)])
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    rows, last_out, last_inputs = [], None, ()
    for kind, k, seed, exp in kept:
        for who, fn in (("reference", mod.reference), ("eager", eager)):
            inputs = make(seed)
            _poison(exp)
            out = fn(*inputs)
            if CUDA:
                torch.cuda.synchronize()
            cmp = compare(exp, out, inputs_after=inputs, input_names=meta.inputs)
            rows.append({"set": kind, "index": k, "candidate": who, "ok": cmp.ok,
                         "reason": str(cmp.reason) if cmp.reason else None, "checks": _checks(cmp)})
            if not cmp.ok:
                log(f"[{number}] {kind} {k} {who}: {cmp.reason}: {cmp.message[:300]}")
            if kind == "final" and who == "eager":
                last_out, last_inputs = out, inputs
            del out, inputs
    row["checks"] = rows
    row["checks_seconds"] = round(time.perf_counter() - t0, 2)
    row["checks_peak_gib"] = _peak_gib()
    ref_ok = all(r["ok"] for r in rows if r["candidate"] == "reference")
    eager_ok = all(r["ok"] for r in rows if r["candidate"] == "eager")
    log(f"[{number}] reference passes all {len(kept)}: {ref_ok}; eager passes all: {eager_ok} "
        f"({row['checks_seconds']} s, peak {row['checks_peak_gib']} GiB)")

    # negative controls on the final draw: (name, how the output is spoiled, the reason the grader must give)
    fexp = plan.final_expected
    big = [j for j in fexp.sampled] or [0]

    def spoil(how):
        outs = [o.clone(memory_format=torch.contiguous_format) if isinstance(o, torch.Tensor) else o
                for o in as_tuple(last_out)]
        for j in big:
            if j < len(outs) and isinstance(outs[j], torch.Tensor):
                flat = outs[j].view(-1)
                if how == "many":
                    flat[::3] += 1.0
                elif how == "zeros":
                    flat.zero_()
                elif how == "nan":
                    flat[flat.numel() // 2] = float("nan")
        return tuple(outs) if isinstance(last_out, (tuple, list)) else outs[0]

    controls = []
    for how, want in (("many", Reason.WRONG_OUTPUT), ("zeros", Reason.ALL_ZERO), ("nan", Reason.NAN)):
        bad = spoil(how)
        cmp = compare(fexp, bad, inputs_after=last_inputs, input_names=meta.inputs)
        controls.append({"spoiled": how, "want": str(want), "got": str(cmp.reason) if cmp.reason else None,
                         "rejected_as_wanted": (not cmp.ok) and cmp.reason == want})
        del bad
    row["negative_controls"] = controls
    log(f"[{number}] negative controls: {[(c['spoiled'], c['got'], c['rejected_as_wanted']) for c in controls]}")

    # the whole comparison beside the sampled one, on draw 0 (the plan released first: one whole expectation fits)
    seed0, exp0 = plan.draws[0]
    del plan, kept, last_out, last_inputs, fexp
    _reset_peak()
    try:
        inputs = make(seed0)
        out = eager(*inputs)
        sampled_cmp = compare(exp0, out, inputs_after=inputs, input_names=meta.inputs)
        whole = expect(mod, make(seed0))
        whole_cmp = compare(whole, out, inputs_after=inputs, input_names=meta.inputs)
        row["whole_vs_sampled_draw0"] = {
            "sampled": {"ok": sampled_cmp.ok, "checks": _checks(sampled_cmp)},
            "whole": {"ok": whole_cmp.ok, "checks": _checks(whole_cmp)},
            "same_verdict": sampled_cmp.ok == whole_cmp.ok and sampled_cmp.reason == whole_cmp.reason,
            "peak_gib": _peak_gib()}
        del whole, out, inputs
    except torch.cuda.OutOfMemoryError as exc:
        row["whole_vs_sampled_draw0"] = {"error": f"OutOfMemoryError: {str(exc).splitlines()[0]}"}
    log(f"[{number}] whole vs sampled on draw 0: "
        f"{ {k: v for k, v in row['whole_vs_sampled_draw0'].items() if k in ('same_verdict', 'peak_gib', 'error')} }")
    row["ok"] = (row["plan"]["expectations"] == "sampled" and ref_ok
                 and all(c["rejected_as_wanted"] for c in controls)
                 and row["whole_vs_sampled_draw0"].get("same_verdict", False))
    row["eager_ok"] = eager_ok
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="50,34,38")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-gpu-out"))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script's logic (with --size smoke)")
    ap.add_argument("--size", default="full")
    ap.add_argument("--expectations", default="auto", help="GraderConfig.expectations (the H200 run keeps 'auto')")
    ap.add_argument("--sample-positions", type=int, default=None, help="GraderConfig.sample_positions (dry run only)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    global CUDA
    CUDA = a.device == "cuda"
    if CUDA and not torch.cuda.is_available():
        raise SystemExit("gpu_sampled_run: no CUDA device\nhint: run it on the H200 host, or --device cpu --size smoke "
                         "--expectations sampled --sample-positions 64 for a dry run")
    from mkb.grader import GraderConfig

    cfg = GraderConfig(device=a.device, size=a.size, expectations=a.expectations,
                       **({"sample_positions": a.sample_positions} if a.sample_positions else {}))

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    from mkb.grader import GRADER_VERSION

    summary = {"grader_version": GRADER_VERSION, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name() if CUDA else "cpu", "config_overrides": cfg.overrides(),
               "python": platform.python_version(), "problems": []}
    log(f"grader {GRADER_VERSION} on {summary['gpu']}, torch {torch.__version__}")
    for n in [int(x) for x in a.problems.split(",") if x.strip()]:
        t0 = time.perf_counter()
        try:
            row = run_problem(n, log, cfg)
        except Exception as exc:  # noqa: BLE001 - one problem's failure is recorded, the others still run
            row = {"problem": n, "ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                   "traceback": traceback.format_exc()[-4000:]}
            log(f"[{n}] FAILED: {row['error']}")
        row["seconds"] = round(time.perf_counter() - t0, 1)
        summary["problems"].append(row)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        _reset_peak()
    for r in summary["problems"]:
        p = r.get("plan", {})
        log(f"SUMMARY {r['problem']}: ok={r['ok']} eager_ok={r.get('eager_ok')} {p.get('expectations')} "
            f"kept {p.get('kept_gib')} GiB (whole {p.get('whole_gib')} GiB), plan peak {p.get('peak_gib')} GiB, "
            f"checks peak {r.get('checks_peak_gib')} GiB, {r['seconds']} s")


if __name__ == "__main__":
    main()
