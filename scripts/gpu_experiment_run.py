"""The #13 done-when run on a GPU host: the scripted experiment through the real grader, pair re-grade included, and the replay index.

What it runs: `configs/demo.toml` (problems 28 and 72 x solo, transfer, placebo, same, wrong x cute, tirx x 2 replicates
= 40 attempts), each attempt the agent's real loop driven by the scripted model (it submits the problem's baseline
kernel once and writes a fixed SKILL.md), graded by one GradingQueue per GPU of the host; then every
(model, problem, replicate) is re-graded as one exclusive interleaved batch against one eager timing (scope=pair).
Every arm submits the same kernel, so the lift is zero by construction: this records the pipeline, not a finding.
It then indexes its own per-submission verdicts as the replay dataset (by problem hash and kernel sha256).

On the GPU host (no polars, litellm or DSLs there by default): ship wheels of polars, litellm==1.110.1 and its
dependencies, and the two DSLs, install them, then (about 4-7 minutes; it starts no attempt after --launch-budget-s):
    python3 scripts/gpu_experiment_run.py --out $OUT 2>&1 | tee $OUT/log
$OUT gets (4 files): log (from tee), events.tar.gz (the store: kind=<kind>/*.parquet), replay.json, summary.json.
Commit: unpack events.tar.gz as events/h200-experiment-demo/ with logs/ (log, summary.json) and a README; copy
replay.json to events/replay-demo/replay.json (its `source` is events/h200-experiment-demo). Then, anywhere:
    mkb-analyze lift --store events/h200-experiment-demo
`--grader replay:events/replay-demo` runs the same flow on a CPU (the CPU test of this script).
On a host with two GPUs, `--executor ray --dataset-name h200x2-experiment-ray` records the Ray run (one grader actor
per GPU; ship a `ray` wheel too); commit it the same way (its replay.json is not needed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.toml")
    ap.add_argument("--grader", default="gpu", help="gpu (every GPU of this host) or replay:DATASET (the CPU test)")
    ap.add_argument("--launch-budget-s", type=float, default=360.0, help="start no attempt after this many seconds")
    ap.add_argument("--dataset-name", default="h200-experiment-demo", help="where the store will be committed under events/")
    ap.add_argument("--executor", default="local", choices=("local", "ray"),
                    help="local (one process, a grading queue per GPU) or ray (a local Ray: attempt tasks, one grader actor per GPU)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="mkb-exp-gpu-"))
    store = str(scratch / "store")

    missing = [m for m in ("polars", "litellm") if __import__("importlib.util").util.find_spec(m) is None]
    if args.executor == "ray" and __import__("importlib.util").util.find_spec("ray") is None:
        missing.append("ray")
    if missing:
        print(f"error: {', '.join(missing)} not installed on this host\nhint: ship their wheels (see this script's docstring)")
        return 2
    import polars as pl

    from mkb.events import read
    from mkb.experiment import build_plan, estimate, load_config
    from mkb.experiment._executor import Executor
    from mkb.experiment._replay import build_index
    from mkb.experiment._scripted import ScriptedRunner, baseline_path

    plan = build_plan(load_config(args.config))
    if args.executor == "ray":
        from mkb.experiment._ray import RayExecutor

        if args.grader == "gpu":
            import torch

            gpu = torch.cuda.get_device_name(0)
        else:
            gpu = f"none ({args.grader})"
        grader = None
        devices = []
    elif args.grader == "gpu":
        import torch

        from mkb.experiment._graders import LocalGpuGrader

        gpu = torch.cuda.get_device_name(0)
        grader = LocalGpuGrader(store=store)
        devices = [q.device for q in grader.queues]
    else:
        from mkb.experiment._replay import ReplayGrader

        grader = ReplayGrader.load(args.grader.split(":", 1)[1], store=store)
        gpu, devices = f"none ({args.grader})", []
    runner = ScriptedRunner()
    print(f"plan {plan.sha256[:12]}: {len(plan.coordinates)} attempts; grader {args.grader} on {gpu} {devices}; "
          f"sandbox {'none (--unsafe-no-sandbox, recorded)' if runner.unsafe else 'bubblewrap'}", flush=True)
    log = lambda s: print(f"[{time.monotonic() - t0:6.1f}s] {s}", flush=True)  # noqa: E731
    if args.executor == "ray":
        ex = RayExecutor(plan, store=store, grader_spec=args.grader, runner=runner, workdir=scratch / "runs", log=log,
                         n_graders=None if args.grader == "gpu" else 1, gpus_per_grader=1.0 if args.grader == "gpu" else 0.0)
        devices = [f"ray grader actor {i}" for i in range(len(ex.actors))]
        print(f"ray: {len(ex.actors)} grader actor(s)", flush=True)
    else:
        ex = Executor(plan, store=store, grader=grader, runner=runner, workdir=scratch / "runs", log=log)
    try:
        rep = ex.run(stop_launching_after_s=args.launch_budget_s)
    finally:
        (ex.close if args.executor == "ray" else grader.close)()
    for line in rep.lines():
        print(line, flush=True)

    started = read("attempt_started", store)
    fin = read("attempt_finished", store)
    ver = read("verdict", store)
    summary: dict = {
        "gpu": gpu, "devices": devices, "grader": args.grader, "plan_sha256": plan.sha256, "seconds": round(time.monotonic() - t0, 1),
        "coordinates": rep.total, "done": rep.done, "excluded": rep.excluded, "pair_batches": rep.pair_batches,
        "orchestration_overhead_s_per_attempt": round(rep.overhead_s / max(rep.ran, 1), 3),
        "attempts": started.height, "finished": fin["status"].value_counts().to_dicts(),
        "verdicts": ver.group_by("scope", "dsl", "problem", "passed").agg(pl.len().alias("n"), pl.col("speedup").median().alias("median_speedup"))
                      .sort("scope", "problem", "dsl").to_dicts(),
        "estimate_vs_measured": {e.name: {"estimate": e.value, "how": e.how} for e in estimate(plan)},
    }
    summary["estimate_vs_measured"]["attempts"]["measured"] = started.height
    summary["estimate_vs_measured"]["gradings"]["measured"] = ver.height
    summary["estimate_vs_measured"]["output tokens"]["measured"] = int(fin["output_tokens"].fill_null(0).sum())
    if args.grader == "gpu":
        kernels = [(p, d, baseline_path(p, d).relative_to(ROOT)) for p in sorted(plan.problems) for d in plan.config.dsls]
        doc = build_index(store, out, kernels=kernels,
                          note=f"Recorded by scripts/gpu_experiment_run.py on {gpu}, plan {plan.sha256[:12]}.")
        doc["source"] = f"events/{args.dataset_name}"
        (out / "replay.json").write_text(json.dumps(doc, indent=1) + "\n")
    ok = rep.complete and not rep.excluded and ver.filter(pl.col("scope") == "pair").height == rep.done
    summary["ok"] = ok
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    from mkb.events import pack_dataset
    pack_dataset(store, out / "events.tar.gz", arcname="events")
    print(f"{'OK' if ok else 'INCOMPLETE'}: {rep.done}/{rep.total} attempts, {ver.height} verdicts "
          f"({ver.filter(pl.col('scope') == 'pair').height} pair), {summary['seconds']} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
