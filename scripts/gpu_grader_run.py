"""The recorded H200 grader run: the DSL baselines, the red-team suite in both DSLs with its controls, and the
grader benchmark, with every event written to one store that is packed into $OUT/events.tar.gz.

Baselines are found in the problem folders (every problems/*/NN_*/<dsl>.py). Each baseline's median is
printed beside the committed one (--compare, default events/h200-grader-bench/logs/summary.json) with
the relative change, flagged when it exceeds 0.5% (meaningful only for a problem unchanged since that
run: each row records the problem's hash); and beside it the integrity margins the grader
checked (allowlisted launches and device time against the DSL kernels', host syncs, device-to-host
bytes, the share of the output copies produced), so a bound that a legitimate kernel comes near is
seen. `--sections` may add `early_stop`: a correct but deliberately slow kernel (the problem-28
baseline called 64 times per solve) that must pass with S = 20 and fewer timed calls than planned.

    export PYTHONPATH=/tmp/mkb-site/nvidia_cutlass_dsl/dsl_packages:/tmp/mkb-site:$PWD CUDA_PATH=/usr/local/cuda \
           CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
    python3 scripts/gpu_grader_run.py 2>&1 | tee $OUT/log

$OUT gets: log (from tee), events.tar.gz (the store: events/kind=<kind>/*.parquet), summary.json (every
verdict, the red-team table, the benchmark). The parent never imports a DSL: workers do.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "redteam"), str(REPO / "benchmarks")]

DEFAULT_COMPARE = REPO / "events" / "h200-grader-bench" / "logs" / "summary.json"
SPREAD_LIMIT = 0.005  # a baseline's median may move at most 0.5% against the committed one


def committed_medians(path: Path) -> dict[tuple[int, str], float]:
    try:
        rows = json.loads(path.read_text()).get("baselines", [])
    except (OSError, ValueError):
        return {}
    return {(r["problem"], r["dsl"]): r["candidate_median_us"] for r in rows if r.get("candidate_median_us")}


def margins(v) -> dict:
    """The integrity figures of a verdict's profiled calls (worst over the calls) and its write check."""
    i, ver = v.stage("integrity"), v.stage("verification")
    prof = (i.typed.profiled or []) if i else []
    worst = lambda k: max((p.get(k) or 0) for p in prof) if prof else None  # noqa: E731
    return {"allowlisted_launches": worst("allowlisted_launches"), "allowlisted_device_us": worst("allowlisted_device_us"),
            "dsl_device_us": min((p.get("dsl_device_us") or 0) for p in prof) if prof else None,
            "host_syncs": worst("host_syncs"), "d2h_bytes": worst("d2h_bytes"), "limits": prof[0].get("limits") if prof else None,
            "copied_fraction_max": ver.typed.copied_fraction_max if ver else None}


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def source_digest(root: Path) -> str:
    """sha256 over every `.py` file under `mkb/` and `problems/` of `root`, tracked or not (relative path and bytes, in
    path order): the grader and the problems it times, named where the copy's `git rev-parse HEAD` cannot be trusted
    (the device host's copy kept a session's first .git while its files moved on: h200-grader-2-11-queue recorded a
    commit two merges old). Not the scripts or the red-team forms. A checkout's own figure, to match a dataset's
    `mkb_source_sha256` against: `python scripts/gpu_grader_run.py --source-digest`."""
    h = hashlib.sha256()
    for f in sorted(p for top in ("mkb", "problems") for p in (root / top).rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def versions() -> dict:
    out = {"python": platform.python_version()}
    for d in ("torch", "nvidia-cutlass-dsl", "apache-tvm", "apache-tvm-ffi", "pyarrow", "fsspec"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = None
    from mkb.grader import GRADER_VERSION
    from mkb.measure import TIMING_POLICY

    out["mkb_grader"], out["timing_policy"] = GRADER_VERSION, TIMING_POLICY
    out["mkb_source_sha256"] = source_digest(Path(__file__).resolve().parents[1])
    try:
        out["mkb_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                                           capture_output=True, text=True, timeout=20).stdout.strip() or None
    except Exception:  # noqa: BLE001 - a copy without its .git (the device host) has no commit to name
        out["mkb_commit"] = None
    try:
        out["gpu_uuid"] = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                                         text=True, timeout=20).stdout.strip() or None
    except Exception:  # noqa: BLE001
        out["gpu_uuid"] = None
    try:
        out["nvidia-smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        out["nvidia-smi"] = f"unavailable: {exc}"
    return out


def preflight(dsls: tuple[str, ...] | None = None, *, timeout_s: float = 300.0) -> None:
    """Stop before any grading when a DSL's toolchain does not import as a worker imports it, in one line naming the DSL
    and the error: without it every grading is an `infra_error`, and a GPU call would spend its minutes recording them
    (one did: the wheels' first part never reached the host). Each DSL's modules are imported in a child process with
    the worker's environment (`environment(arch)` where a GPU is found), all DSLs at once, so the parent stays light
    and a package that is there but broken (a library missing) is caught as surely as one that is absent."""
    from mkb.dsl import backend_target, dsl_names
    from mkb.grader._backends import backend_from_target

    try:
        from mkb.measure._device import detect_arch

        arch: str | None = detect_arch()
    except Exception:  # noqa: BLE001 - no GPU here: the plain environment (CPU runs and tests)
        arch = None
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)"
    children = {}
    for dsl in dsls or dsl_names():
        backend = backend_from_target(backend_target(dsl), dsl)
        env = dict(os.environ, **(backend.environment(arch) if arch else {}))
        children[dsl] = subprocess.Popen([sys.executable, "-c", code, *backend.import_modules], env=env,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    failed = []
    for dsl, child in children.items():
        try:
            _, err = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            failed.append(f"{dsl}: its imports took more than {timeout_s:.0f} s")
            continue
        if child.returncode != 0:
            failed.append(f"{dsl}: {(err.strip().splitlines() or ['exit code ' + str(child.returncode)])[-1]}")
    if failed:
        raise SystemExit(f"cannot grade: a DSL toolchain does not import here ({'; '.join(failed)}); hint: install the "
                         "DSL wheels (on the device host: every part of .gpu/, then bash .gpu/pN/unpack-wheels) and "
                         "export the PYTHONPATH it prints")


def row_of(v, **extra) -> dict:
    t = v.stage("timing")
    i = v.stage("integrity")
    c = v.stage("compile")
    return {
        "problem": v.problem, "dsl": v.dsl, "passed": v.passed, "reason": v.reason, "speedup": v.speedup,
        "candidate_median_us": v.candidate_median_us, "eager_median_us": v.eager_median_us,
        "cv": t.typed.cv if t else None, "launch_floor_us": t.typed.launch_floor_us if t else None,
        "compile_s": c.typed.compile_s if c else None, "wall_s": v.wall_s, "overhead_s": v.overhead_s,
        "kernels_seen": (i.typed.kernels_seen if i else None), "evaluation_id": v.evaluation_id,
        "gpu": v.gpu, "gpu_model": v.gpu_model, "gpu_arch": v.gpu_arch, "timed_calls": v.timed_calls,
        "reference_median_us": v.reference_median_us, "speedup_upstream": v.speedup_upstream, "s": v.s,
        "s_upstream": v.s_upstream, "message": (v.message or "")[:1500], **extra,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-gpu-out"))
    ap.add_argument("--source-digest", action="store_true", help="print this checkout's mkb_source_sha256 (what a "
                    "dataset's versions record) and exit; no GPU")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start nothing new after this many seconds")
    ap.add_argument("--sections", default="baselines,redteam,early_stop,bench")
    ap.add_argument("--compare", default=str(DEFAULT_COMPARE), help="summary.json whose baseline medians this run is compared with")
    ap.add_argument("--bench-repeats", type=int, default=5)
    ap.add_argument("--redteam-timed", type=int, default=50)
    ap.add_argument("--name", default="h200-grader", help="dataset name: the store's folder and the tar's top folder")
    a = ap.parse_args(argv)
    if a.source_digest:
        print(source_digest(Path(__file__).resolve().parents[1]))
        return 0
    t_start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    store_root = Path("/tmp/mkb-grader-events")
    store = store_root / a.name
    store.mkdir(parents=True, exist_ok=True)

    from mkb.grader import GraderConfig, WorkerPool, grade

    import redteam_hacks as R

    preflight()
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
        # ---- baselines (every committed DSL kernel), each median beside the committed one ----
        if "baselines" in sections:
            from mkb.grader._session import problem_identity
            from mkb.problems import baselines

            before = committed_medians(Path(a.compare))
            for b in baselines():  # every baseline the problem folders hold
                n, dsl = b.problem, b.dsl
                v = guarded(f"baseline {n} {dsl}", lambda: grade(n, dsl, b.path, writer=writer, config=GraderConfig(),
                                                               pool=pool, scope="attempt"))
                if v is None:
                    continue
                old = before.get((n, dsl))
                change = (v.candidate_median_us / old - 1.0) if (old and v.candidate_median_us) else None
                m = margins(v)
                summary["baselines"].append(row_of(v, kernel=str(b.path.relative_to(REPO)), committed_median_us=old,
                                                   problem_hash=problem_identity(n),
                                                   median_change=change, within_spread=None if change is None else abs(change) <= SPREAD_LIMIT,
                                                   margins=m))
                log(f"BASELINE {n:02d} {dsl}: passed={v.passed} reason={v.reason} speedup={v.speedup} "
                    f"speedup_upstream={v.speedup_upstream} cand={v.candidate_median_us} eager={v.eager_median_us} "
                    f"reference={v.reference_median_us} timed_calls={v.timed_calls} gpu={v.gpu_model}/{v.gpu_arch} "
                    f"wall={v.wall_s:.1f}s\n  committed median {old} -> change "
                    f"{'n/a' if change is None else f'{100 * change:+.2f}%'}{'' if change is None or abs(change) <= SPREAD_LIMIT else '  (OVER 0.5%)'}"
                    f"\n  margins {json.dumps(m)}\n{v.message[:1500] if not v.passed else ''}")
            writer.flush()

        # ---- red team: controls and every hack form, both DSLs ----
        if "redteam" in sections:
            rt_dir = Path("/tmp/mkb-redteam")
            paths = {dsl: R.write_all(rt_dir, dsl) for dsl in R.DSLS}
            cfg = GraderConfig(n_timed=a.redteam_timed)
            controls = sorted({n for p in paths.values() for n in p if n.startswith("control")})
            names = controls + [h.name for h in R.HACKS]
            for name in names:
                h = R.BY_NAME.get(name)
                problem = h.problem if h else (R.PROBLEM if name == "control" else int(name.split("_")[1]))
                for dsl in R.DSLS:
                    if name not in paths[dsl]:
                        summary["skipped"].append(f"redteam {name} {dsl}: no baseline of problem {problem} it fits")
                        continue
                    v = guarded(f"redteam {name} {dsl}", lambda: grade(problem, dsl, paths[dsl][name], writer=writer,
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
                    summary["redteam"].append(row_of(v, hack=name, expected=expected, ok=ok, margins=margins(v)))
                    log(f"REDTEAM {name:30s} {dsl:5s} -> {v.reason or 'passed'} (expected {expected}) {'OK' if ok else 'MISMATCH'}"
                        + ("" if ok else f"\n{v.message[:2000]}"))
            writer.flush()

        # ---- early stop: a correct kernel too slow for any threshold above 0 stops after half its calls ----
        if "early_stop" in sections:
            summary["early_stop"] = []
            for dsl in R.DSLS:
                try:
                    base = R.baseline_path(dsl).read_text()
                except FileNotFoundError:
                    continue
                slow = R.Hack("slow_repeat", "the baseline called 64 times per solve", "def solve(x, residual, weight):\n"
                              "    for _ in range(63):\n        _real_solve(x, residual, weight)\n"
                              "    return _real_solve(x, residual, weight)\n", None, ())
                p = Path("/tmp/mkb-redteam") / dsl / "slow_repeat.py"
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(R.render(base, slow))
                v = guarded(f"early_stop {dsl}", lambda: grade(R.PROBLEM, dsl, p, writer=writer, config=GraderConfig(),
                                                               pool=pool, scope="submission"))
                if v is None:
                    continue
                ok = v.passed and v.s == 20.0 and (v.timed_calls or 0) < GraderConfig().n_timed
                summary["early_stop"].append(row_of(v, ok=ok))
                log(f"EARLY_STOP {dsl}: passed={v.passed} speedup={v.speedup} s={v.s} timed_calls={v.timed_calls} "
                    f"of {GraderConfig().n_timed} wall={v.wall_s:.1f}s {'OK' if ok else 'MISMATCH'}")
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
    summary["baselines_all_pass"] = all(r["passed"] for r in summary["baselines"]) if summary["baselines"] else None
    summary["baselines_within_spread"] = (all(r["within_spread"] for r in summary["baselines"] if r["within_spread"] is not None)
                                          if summary["baselines"] else None)
    summary["elapsed_s"] = time.monotonic() - t_start
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if jsonl is None:
        from mkb.events import pack_dataset
        pack_dataset(store, out / "events.tar.gz", arcname=a.name)
    log("RED-TEAM TABLE")
    for name, cells in table.items():
        log(f"  {name:30s} " + "  ".join(f"{d}: {c['reason']}{'' if c['ok'] else ' (MISMATCH)'}" for d, c in cells.items()))
    log("BASELINE MEDIANS (committed -> now)")
    for r in summary["baselines"]:
        ch = r.get("median_change")
        log(f"  {r['problem']:02d} {r['dsl']:5s} {r.get('committed_median_us') or float('nan'):10.2f} -> "
            f"{r['candidate_median_us'] or float('nan'):10.2f} us  {'n/a' if ch is None else f'{100 * ch:+.2f}%'}"
            f"{'' if ch is None or abs(ch) <= SPREAD_LIMIT else '  OVER 0.5%'}  passed={r['passed']}")
    log(f"red team all ok: {summary['redteam_all_ok']}; baselines all pass: {summary['baselines_all_pass']}; "
        f"within 0.5%: {summary['baselines_within_spread']}")
    log(f"done in {summary['elapsed_s']:.0f} s; errors {len(summary['errors'])}; skipped {summary['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
