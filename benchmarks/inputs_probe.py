"""Times how one problem's timed input sets are made on the GPU, in fresh processes, alone and beside a busy CPU.

Why: problem 1's `timing_inputs` phase took ~0.2 s in some gradings and ~1.9 s in others with the same sets and the
same first pass (benchmarks/timing_inputs_split.py). Each trial here is a fresh process that makes the candidate
loop's sets exactly as the grader does (mkb.measure.InputStream over the problem's make_inputs, a quarter of the free
memory as the budget) and reports where the seconds went (InputsMade), then makes them again in the same process (its
blocks now cached). Trials beside a CPU hog (one spinning process per core) show what a starved host does to it.
Needs torch and a GPU only (no DSL).

    python benchmarks/inputs_probe.py --out DIR [--problem 1] [--n-calls 113] [--fresh 3] [--hogged 2] [--arms default,one]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(problem: int, n_calls: int, arm: str) -> dict:
    t0 = time.perf_counter()
    import torch

    from mkb.measure import InputStream, one_cpu_thread
    from mkb.problems import get_problem

    t_import = time.perf_counter() - t0
    torch.cuda.init()
    torch.empty(1, device="cuda")
    prob = get_problem(problem)
    out: dict = {"problem": problem, "n_calls": n_calls, "arm": arm, "torch_threads": torch.get_num_threads(),
                 "import_s": round(t_import, 3), "runs": []}
    for run in ("fresh", "cached"):
        free, _ = torch.cuda.mem_get_info()
        t1 = time.perf_counter()
        def make(seed: int) -> tuple:
            if arm == "one":  # as the grader's worker makes them since 2.20
                with one_cpu_thread():
                    return prob.make_inputs(seed, device="cuda")
            return prob.make_inputs(seed, device="cuda")

        s = InputStream(make, n_calls=n_calls, base_seed=0, max_bytes=free // 4)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t1
        out["runs"].append({"run": run, "wall_s": round(wall, 4), "capacity": s.capacity, "premade": s.premade,
                            "set_bytes": s.set_bytes, "first_pass_segments": s.first_pass_new_segments,
                            "new_segments": s.new_segments, "made": s.made.as_dict()})
        del s
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print("PROBE " + json.dumps(child(int(argv[1]), int(argv[2]), argv[3])), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--problem", type=int, default=1)
    ap.add_argument("--n-calls", type=int, default=113)
    ap.add_argument("--fresh", type=int, default=3)
    ap.add_argument("--hogged", type=int, default=2)
    ap.add_argument("--trial-limit-s", type=float, default=60.0)
    ap.add_argument("--arms", default="default", help="comma-separated: 'default' makes the sets with torch's thread "
                    "pool as it is, 'one' with one_cpu_thread (grader 2.20); each trial runs every arm in turn")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    results = a.out / "inputs_probe.jsonl"
    arms = [x for x in a.arms.split(",") if x]
    if not arms or set(arms) - {"default", "one"}:
        ap.error(f"--arms takes 'default' and 'one', not {a.arms!r}")
    trials = [(hog, arm) for hog in [False] * a.fresh + [True] * a.hogged for arm in arms]
    for i, (hog, arm) in enumerate(trials):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] if hog else []
        try:
            r = subprocess.run([sys.executable, __file__, "--child", str(a.problem), str(a.n_calls), arm], env=env,
                               capture_output=True, text=True, timeout=a.trial_limit_s)
            line = next((x for x in r.stdout.splitlines() if x.startswith("PROBE ")), None)
            rec = json.loads(line[6:]) if line else {"error": f"exit {r.returncode}: {r.stderr[-1500:]}"}
        except subprocess.TimeoutExpired:
            rec = {"error": f"over {a.trial_limit_s:.0f} s"}
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        rec.update(trial=i, cpu_hog=len(hogs), arm=arm)
        with results.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        for run in rec.get("runs", []):
            m = run["made"]
            print(f"[probe] trial {i} hog {len(hogs)} arm {arm} {run['run']}: {run['wall_s']:.3f} s (first pass {m['first_pass_s']:.3f} + "
                  f"sets {m['make_s']:.3f}, cpu {m['cpu_s']:.3f}; mallocs {m['device_mallocs']} frees {m['device_frees']} "
                  f"retries {m['alloc_retries']}; {run['capacity']} sets premade {run['premade']}, first-pass segments "
                  f"{run['first_pass_segments']})", flush=True)
        if "error" in rec:
            print(f"[probe] trial {i}: {rec['error']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
