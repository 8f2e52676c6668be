"""The recorded H200 grader run: the DSL baselines, the red-team suite in both DSLs with its controls, and the
grader benchmark, with every event written to one store that is packed into $OUT/events.tar.gz.

    export PYTHONPATH=/tmp/mkb-site/nvidia_cutlass_dsl/dsl_packages:/tmp/mkb-site:$PWD CUDA_PATH=/usr/local/cuda \
           CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
    python3 scripts/gpu_grader_run.py 2>&1 | tee $OUT/log

$OUT gets: log (from tee), events.tar.gz (the store: events/kind=<kind>/*.parquet), summary.json (every
verdict, the red-team table, the benchmark). The parent never imports a DSL: workers do.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "redteam"), str(REPO / "benchmarks")]


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def versions() -> dict:
    out = {"python": platform.python_version()}
    for d in ("torch", "nvidia-cutlass-dsl", "apache-tvm", "apache-tvm-ffi", "pyarrow", "fsspec"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = None
    try:
        out["nvidia-smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        out["nvidia-smi"] = f"unavailable: {exc}"
    return out


def row_of(v, **extra) -> dict:
    t = v.stage("timing")
    i = v.stage("integrity")
    c = v.stage("compile")
    return {
        "problem": v.problem, "dsl": v.dsl, "passed": v.passed, "reason": v.reason, "speedup": v.speedup,
        "candidate_median_us": v.candidate_median_us, "eager_median_us": v.eager_median_us,
        "cv": t.figures.get("cv") if t else None, "launch_floor_us": t.figures.get("launch_floor_us") if t else None,
        "compile_s": c.figures.get("compile_s") if c else None, "wall_s": v.wall_s, "overhead_s": v.overhead_s,
        "kernels_seen": (i.figures.get("kernels_seen") if i else None), "evaluation_id": v.evaluation_id,
        "message": (v.message or "")[:1500], **extra,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-gpu-out"))
    ap.add_argument("--budget-s", type=float, default=540.0, help="start nothing new after this many seconds")
    ap.add_argument("--sections", default="baselines,bench,redteam")
    ap.add_argument("--bench-repeats", type=int, default=5)
    ap.add_argument("--redteam-timed", type=int, default=50)
    ap.add_argument("--name", default="h200-grader", help="dataset name: the store's folder and the tar's top folder")
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    store_root = Path("/tmp/mkb-grader-events")
    store = store_root / a.name
    store.mkdir(parents=True, exist_ok=True)

    from mkb.grader import GraderConfig, WorkerPool, grade

    import redteam_hacks as R

    summary: dict = {"versions": versions(), "baselines": [], "redteam": [], "bench": None, "skipped": [], "errors": []}
    log("versions", json.dumps(summary["versions"]))
    try:
        from mkb.events import EventWriter

        writer = EventWriter(str(store), flush_every=500)
        jsonl = None
    except ImportError as exc:  # no pyarrow on this host: JSON lines, converted to Parquet where pyarrow is
        from mkb.grader._jsonl import JsonlWriter

        jsonl = out / "events.jsonl"
        writer = JsonlWriter(jsonl)
        log(f"no Parquet writer here ({exc}); events go to {jsonl}")
    sections = set(a.sections.split(","))

    def time_left() -> float:
        return a.budget_s - (time.monotonic() - t_start)

    def guarded(label: str, fn):
        if time_left() <= 0:
            summary["skipped"].append(label)
            log(f"SKIP {label}: out of time budget")
            return None
        try:
            return fn()
        except Exception:  # noqa: BLE001 - one broken grading must not lose the rest of the run
            tb = traceback.format_exc()
            summary["errors"].append({"what": label, "traceback": tb})
            log(f"ERROR {label}\n{tb}")
            return None

    pool = WorkerPool(device="cuda", depth=2)  # every registered DSL
    try:
        # ---- baselines (the DSL helper's kernels for the four problems) ----
        if "baselines" in sections:
            from mkb.problems import baselines

            for b in baselines():  # every baseline the problem folders hold
                n, dsl = b.problem, b.dsl
                v = guarded(f"baseline {n} {dsl}", lambda: grade(n, dsl, b.path, writer=writer, config=GraderConfig(),
                                                               pool=pool, scope="attempt"))
                if v is not None:
                    summary["baselines"].append(row_of(v, kernel=str(b.path.relative_to(REPO))))
                    log(f"BASELINE {n:02d} {dsl}: passed={v.passed} reason={v.reason} speedup={v.speedup} "
                        f"cand={v.candidate_median_us} eager={v.eager_median_us} wall={v.wall_s:.1f}s\n{v.message[:1500] if not v.passed else ''}")
            writer.flush()

        # ---- red team: controls and every hack form, both DSLs ----
        if "redteam" in sections:
            rt_dir = Path("/tmp/mkb-redteam")
            paths = {dsl: R.write_all(rt_dir, dsl) for dsl in R.DSLS}
            cfg = GraderConfig(n_timed=a.redteam_timed)
            names = ["control"] + [h.name for h in R.HACKS]
            for name in names:
                h = R.BY_NAME.get(name)
                for dsl in R.DSLS:
                    v = guarded(f"redteam {name} {dsl}", lambda: grade(R.PROBLEM, dsl, paths[dsl][name], writer=writer,
                                                                       config=cfg, pool=pool, scope="submission"))
                    if v is None:
                        continue
                    if h is None:
                        expected, ok = ["pass"], v.passed
                    elif h.static:
                        expected = [f"static_{h.static}"]
                        ok = v.reason == expected[0]
                    else:
                        expected = list(h.runtime)
                        ok = (not v.passed) and v.reason in expected
                    summary["redteam"].append(row_of(v, hack=name, expected=expected, ok=ok))
                    log(f"REDTEAM {name:30s} {dsl:5s} -> {v.reason or 'passed'} (expected {expected}) {'OK' if ok else 'MISMATCH'}"
                        + ("" if ok else f"\n{v.message[:2000]}"))
            writer.flush()
    finally:
        pool.close()

    # ---- benchmark: overhead with a warm queue, spread of one kernel's median over 5 gradings ----
    if "bench" in sections:
        import grader_bench

        summary["bench"] = guarded("bench", lambda: grader_bench.overhead(
            problem=28, repeats=a.bench_repeats, config=GraderConfig(), log=log, writer=writer))
        b = summary["bench"] or {}
        for dsl, d in (b.get("dsls") or {}).items():
            log(f"BENCH {dsl}: overhead median {d['overhead_s_median']:.2f} s (max {d['overhead_s_max']:.2f}), "
                f"candidate median {d['candidate_median_us']:.1f} us, spread {100 * (d['candidate_spread'] or 0):.2f}%, "
                f"medians {[round(r['candidate_median_us'] or 0, 1) for r in d['runs']]}")
        writer.flush()

    writer.close()
    # ---- pack ----
    table = {}
    for r in summary["redteam"]:
        table.setdefault(r["hack"], {})[r["dsl"]] = {"reason": r["reason"] or "passed", "ok": r["ok"]}
    summary["redteam_table"] = table
    summary["redteam_all_ok"] = all(r["ok"] for r in summary["redteam"]) if summary["redteam"] else None
    summary["elapsed_s"] = time.monotonic() - t_start
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if jsonl is None:
        with tarfile.open(out / "events.tar.gz", "w:gz") as tar:
            tar.add(store, arcname=a.name)
    log("RED-TEAM TABLE")
    for name, cells in table.items():
        log(f"  {name:30s} " + "  ".join(f"{d}: {c['reason']}{'' if c['ok'] else ' (MISMATCH)'}" for d, c in cells.items()))
    log(f"done in {summary['elapsed_s']:.0f} s; errors {len(summary['errors'])}; skipped {summary['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
