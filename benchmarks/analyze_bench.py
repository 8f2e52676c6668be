"""Benchmark: `mkb-analyze lift` end to end (every figure it prints, 10,000 resamples) on synthetic stores of 1M and 10M events.

Targets (issue #11 item 8): as a whole process, 1M events <= 1.5 s and 10M events <= 10 s, peak memory
under 1 GiB. For each size it prints the wall time, CPU time (user + sys, all threads) and peak RSS of
whole-process runs (`resource`/`wait4` of the child), then one more whole-process run of the same command
with timers around its phases: interpreter start and imports, reading the store (mkb.events.read_batches: the
event files' batches, each reduced to what the tables keep), deriving the attempts and pairs tables from what was
read (joins, pairs), the bootstrap (every resample of every CI), the rest of the tables (group-bys, tests,
shrinkage) and printing/JSON. The timers only wrap functions (no code of mkb changes); that run's total is printed beside
the plain runs' so their overhead shows.

Usage: python benchmarks/analyze_bench.py [--events 1000000,10000000] [--runs K] [--runs-large K] [--dir DIR]
Each dataset is generated once (not timed) under DIR (default: the temp dir) and reused while its
`.complete` marker is there (the 10M store takes several minutes to write). Every tree measured has its mkb's
bytecode written first, as an installed mkb has (a checkout run with PYTHONDONTWRITEBYTECODE set would otherwise
compile mkb from source in every timed process). The machine may be shared:
K runs, min and median reported, with the load average before and after.

`--against ROOT` (a checkout of another mkb, e.g. `git worktree add /tmp/main main`) runs that code and this one
alternately, run for run, on the same stores in the same minutes (each figure beside the other's), and first checks
that both print the same bytes: `mkb-analyze lift` on every committed store under events/ and on the benchmark's
stores, stdout and `--json` compared (an optimisation must change no figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EVENTS_PER_MODEL = 74 * 10 * 5  # problems x attempts per (problem, replicate) x events per attempt (started, skill, finished, 2 verdicts)


def ensure_store(events: int, replicates: int, folder: str) -> tuple[str, int]:
    """The synthetic store of about `events` events (generated here once), and its exact event count."""
    from mkb.analysis.synthetic import SynthSpec, write_synthetic

    n_models = max(1, round(events / (EVENTS_PER_MODEL * replicates)))
    store = os.path.join(folder, f"mkb-bench-{n_models}m-r{replicates}")
    marker = Path(store) / ".complete"
    if not marker.exists():
        shutil.rmtree(store, ignore_errors=True)
        spec = SynthSpec(models=tuple(f"bench/model-{i:03d}" for i in range(n_models)), replicates=replicates,
                         model_means=tuple(0.4 + 0.6 * i / max(1, n_models - 1) for i in range(n_models)),
                         p_infra=0.005, p_unfinished=0.002, n_annotated=50, seed=1)
        t0 = time.perf_counter()
        res = write_synthetic(spec, store, chunk=250_000)
        marker.write_text(str(res.events))
        print(f"generated {res.events:,} events ({n_models} models) in {len(res.files)} files, "
              f"{time.perf_counter() - t0:.0f} s (not timed)", flush=True)
    return store, int(marker.read_text())


def run_child(cmd: list[str], env: dict, cwd: str | None = None) -> tuple[float, float, float, str, str, int]:
    """(wall s, CPU s, peak RSS MiB, stdout, stderr, exit code) of one whole-process run (in `cwd`: `python -m` imports
    mkb from its working directory before PYTHONPATH, so a tree's runs start in that tree)."""
    # output to files, not pipes: the tables outgrow a pipe's buffer and the child would block writing them
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        fo.seek(0), fe.seek(0)
        return (wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, fo.read(), fe.read(),
                os.waitstatus_to_exitcode(status))


def phases_child(argv: list[str]) -> None:
    """Run `mkb-analyze` in this process with timers around its phases; print them as JSON on stderr at the end."""
    t_start, c_start = time.perf_counter(), time.process_time()
    import mkb.cli.analyze as cli  # first, as `mkb-analyze` starts (it sets polars' allocator up before polars loads)
    import mkb.analysis as A
    import mkb.analysis._stats as S
    import mkb.analysis._tables as T

    import resource

    spent = {k: [0.0, 0.0] for k in ("read", "events", "bootstrap", "output")}
    peak = {"imports": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def timed(fn, key):
        def wrapper(*a, **k):
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                spent[key][0] += time.perf_counter() - t
                spent[key][1] += time.process_time() - c
                peak[key] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak by the end of its last call
        return wrapper

    A.load_tables = timed(A.load_tables, "read")
    T.read_batches = timed(T.read_batches, "events")  # inside load_tables: "read" is split into it and the rest below
    S.cluster_bootstrap_many = timed(S.cluster_bootstrap_many, "bootstrap")
    for name in ("print_lift", "print_rates", "print_contrast", "_emit", "_header"):
        setattr(cli, name, timed(getattr(cli, name), "output"))
    t_main, c_main = time.perf_counter(), time.process_time()
    sys.argv = ["mkb-analyze", *argv]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code or 0
    t_end, c_end = time.perf_counter(), time.process_time()
    read = spent.pop("read")
    spent["derive"] = [read[0] - spent["events"][0], read[1] - spent["events"][1]]
    out = {"imports": [t_main - t_start, c_main - c_start], **spent}
    out["tables"] = [(t_end - t_main) - sum(v[0] for v in spent.values()), (c_end - c_main) - sum(v[1] for v in spent.values())]
    peak["derive"] = peak.pop("read", peak.get("events", 0))
    sys.stdout.flush()
    print("PHASES " + json.dumps({"time": out, "peak": peak}), file=sys.stderr, flush=True)
    sys.exit(code)


def same_output(stores: list[str], envs: dict[str, tuple[dict, str]]) -> bool:
    """Whether every code tree ({name: (env, root)}) prints the same bytes for `mkb-analyze lift` (stdout, --json and
    exit code) on each store (absolute paths: each tree runs in its own root)."""
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for store in stores:
            got = {}
            for name, (env, root) in envs.items():
                js = os.path.join(tmp, f"{name}.json")
                proc = subprocess.run([sys.executable, "-m", "mkb.cli.analyze", "lift", "--store", store, "--json", js],
                                      capture_output=True, env=env, cwd=root)
                got[name] = (proc.returncode, proc.stdout, Path(js).read_bytes() if os.path.exists(js) else b"")
                Path(js).unlink(missing_ok=True)
            first, *rest = got.values()
            same = all(r == first for r in rest)
            ok &= same
            print(f"  {'same' if same else 'DIFFERENT'}: {store} (exit {first[0]}, stdout {len(first[1]):,} bytes, json {len(first[2]):,} bytes)",
                  flush=True)
    return ok


def bench(store: str, events: int, runs: int, env: dict) -> None:
    size = sum(f.stat().st_size for f in Path(store).rglob("*.parquet"))
    print(f"\n== store {store}: {events:,} events, {size / 2**20:.0f} MiB; cpus {os.cpu_count()}, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (the machine's other work slows every figure below)", flush=True)
    cmd = [sys.executable, "-m", "mkb.cli.analyze", "lift", "--store", store, "--json", os.devnull]
    walls, cpus, peaks = [], [], []
    out = ""
    for _ in range(runs):
        wall, cpu, peak, out, err, code = run_child(cmd, env)
        if code != 0:
            print(out[-3000:], err[-3000:])
            raise SystemExit(f"mkb-analyze lift failed (exit {code})")
        walls.append(wall), cpus.append(cpu), peaks.append(peak)
    lines = out.splitlines()
    print("\n".join(lines[:3]))
    print(next((ln for ln in lines if ln.startswith("95% CIs")), ""))
    target_s = 1.5 if events <= 1_500_000 else 10.0
    print(f"`mkb-analyze lift` whole process (start to exit, 10,000 resamples, every figure), {runs} runs: wall "
          f"{', '.join(f'{t:.2f}' for t in walls)} s (min {min(walls):.2f}, median {statistics.median(walls):.2f}); CPU user + sys "
          f"min {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s; peak RSS max {max(peaks):.0f} MiB; "
          f"target <= {target_s:g} s: {'MET' if min(walls) <= target_s else 'MISSED'}, < 1024 MiB: "
          f"{'MET' if max(peaks) < 1024 else 'MISSED'}", flush=True)
    wall, cpu, peak, _, err, code = run_child([sys.executable, __file__, "--phases-child", "lift", "--store", store, "--json", os.devnull], env)
    line = next((ln for ln in err.splitlines() if ln.startswith("PHASES ")), None)
    if code != 0 or line is None:
        print(err[-3000:])
        raise SystemExit("the phase-timed run failed")
    got = json.loads(line[len("PHASES "):])
    ph, rss = got["time"], got["peak"]
    names = {"imports": "interpreter start + imports", "events": "read the store (batches, each reduced)",
             "derive": "derive the attempts and pairs tables (joins)",
             "bootstrap": "bootstrap (10,000 resamples, every CI)", "tables": "rest of the tables (group-bys, tests, shrinkage)",
             "output": "print + JSON"}
    start = wall - sum(v[0] for v in ph.values())  # before the first line of the child: interpreter start-up
    ph["imports"][0] += start
    print(f"phases of one more whole-process run (wall {wall:.2f} s, CPU {cpu:.2f} s, peak {peak:.0f} MiB): wall / CPU s, "
          "the process's peak RSS by the end of the phase's last call")
    for k in ("imports", "events", "derive", "bootstrap", "tables", "output"):
        print(f"  {names[k]:<52} {ph[k][0]:6.2f} / {ph[k][1]:5.2f}" + (f"   {rss[k]:5.0f} MiB" if k in rss else ""))
    print(f"load average now {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


def alternate(store: str, events: int, runs: int, envs: dict[str, tuple[dict, str]]) -> None:
    """Whole-process runs of each code tree in turn (A B A B ...): the machine's load falls on both alike."""
    cmd = [sys.executable, "-m", "mkb.cli.analyze", "lift", "--store", store, "--json", os.devnull]
    got = {name: [] for name in envs}
    print(f"\n== store {store}: {events:,} events; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    for _ in range(runs):
        for name, (env, root) in envs.items():
            wall, cpu, peak, out, err, code = run_child(cmd, env, cwd=root)
            if code != 0:
                raise SystemExit(f"{name}: mkb-analyze lift failed (exit {code}): {err[-2000:]}")
            got[name].append((wall, cpu, peak))
    for name, rows in got.items():
        walls, cpus, peaks = zip(*rows)
        print(f"  {name:<8} wall min {min(walls):.2f} median {statistics.median(walls):.2f} s; CPU min {min(cpus):.2f} median "
              f"{statistics.median(cpus):.2f} s; peak RSS max {max(peaks):.0f} MiB ({runs} runs: wall {', '.join(f'{w:.2f}' for w in walls)})")
    print(f"load average now {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


def compiled_like_installed(tree: Path) -> None:
    """Bytecode for `tree`'s mkb, as pip writes at install: a user's `mkb-analyze` never compiles mkb from source, but
    a checkout run with PYTHONDONTWRITEBYTECODE set (some sandboxes set it) would on every run (~0.04-0.05 s, a few %
    of the 1M figure). The packages in the environment already have theirs."""
    import compileall

    ok = compileall.compile_dir(str(tree / "mkb"), quiet=1, workers=1)
    print(f"bytecode of {tree / 'mkb'} {'written or current' if ok else 'NOT all written'} "
          f"(PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r})", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--phases-child":
        return phases_child(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", default="1000000,10000000", help="comma-separated dataset sizes")
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5, help="whole-process runs per dataset up to 1.5M events")
    ap.add_argument("--runs-large", type=int, default=2, help="whole-process runs per larger dataset")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the datasets are generated (once) and kept")
    ap.add_argument("--against", default=None, help="another mkb checkout: check the same output, then alternate runs with it")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for tree in [ROOT] + ([Path(args.against).resolve()] if args.against else []):
        compiled_like_installed(tree)
    stores = [ensure_store(int(x), args.replicates, args.dir) for x in args.events.split(",")]
    if args.against:
        other = str(Path(args.against).resolve())
        envs = {"this": (env, str(ROOT)),
                "against": (dict(os.environ, PYTHONPATH=other + os.pathsep + os.environ.get("PYTHONPATH", "")), other)}
        committed = sorted(str(p) for p in (ROOT / "events").iterdir() if p.is_dir())
        print(f"`mkb-analyze lift`, this tree ({ROOT}) against {other}: the same bytes on every store?", flush=True)
        if not same_output(committed + [s for s, _ in stores], envs):
            raise SystemExit("the outputs differ: the figures below would compare different computations")
    for store, n in stores:
        runs = args.runs if n <= 1_500_000 else args.runs_large
        if args.against:
            alternate(store, n, runs, envs)
        else:
            bench(store, n, runs, env)
    print(f"\n(datasets kept under {args.dir} for re-runs; delete the mkb-bench-* folders when done)")


if __name__ == "__main__":
    main()
