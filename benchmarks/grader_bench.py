"""Grader benchmark through a `GradingQueue`: overhead per evaluation with a warm queue, the spread of one
kernel's median over repeated gradings, and gradings per GPU-hour on the memory-bound baselines.

overhead = request-to-verdict wall time minus the kernel's own compile time and timed-call time
(what the grader adds: trusted phase, checks, clock warm-up, profiler, hand-over). Targets on the
H200 (issue #10): overhead < 0.5 s with a warm queue; >= 1,500 gradings per GPU-hour on the
memory-bound baselines; spread (max - min) / median of the candidate median < 2% over 5 gradings.

- `overhead`: one kernel (problem 28's baselines by default) graded `--repeats` times per DSL, one
  job at a time, each submitted once the queue's spares are warm (a queue in steady state).
- `backlog`: one kernel (`--problem`) per DSL graded once, then `--repeats` times submitted at once, so the queue
  has a backlog and prefetches each next job's trusted plan on the spare that will grade it (grader 2.5); prints
  how each plan was made (`prefetch` state, the prepare's own seconds, the job's wait for it).
- `throughput`: every memory-bound baseline (speed-of-light bound "memory", discovered in the
  problem folders) submitted `--rounds` times at once from two producer threads; gradings per
  GPU-hour = gradings / (first submit to last verdict), the spares warm when the clock starts.

Both sections print the overhead by phase (grader 2.4: each verdict's `phases_s` names every second of its
wall time, mkb.grader._phases): median, mean and max seconds per phase, largest first.

    python benchmarks/grader_bench.py --sections overhead,throughput --json out.json
    # the recorded H200 run (<= 200 s): a budget, the store packed as events.tar.gz under $OUT
    python benchmarks/grader_bench.py --sections overhead,backlog,throughput --problem 72 --repeats 4 --rounds 2 \
        --depth 4 --low-water 2 --budget-s 170 --out $OUT --name h200-grader-bench-2-5 2>&1 | tee $OUT/grader_bench.log
    # issue #10's next run: spares for a backlog of 4 plus the one graded first (--depth 6), refilled 4 at a time
    timeout 280 python3 benchmarks/grader_bench.py --sections backlog,throughput --problem 72 --repeats 4 --rounds 2 \
        --depth 6 --low-water 2 --budget-s 150 --out $OUT --name h200-grader-bench-tput > $OUT/grader_bench.log 2>&1

Each section also prints the quiet rule's record (`FIGURE ... quiet rule`): how long spares' GPU warm-ups and
prefetches ran and how many spares' `go` waited for a grading's timing phase to end (mkb.grader._pool).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import tempfile
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _spread(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return None
    return (max(xs) - min(xs)) / statistics.median(xs)


def _row(v) -> dict:
    comp, tim = v.stage("compile"), v.stage("timing")
    return {
        "problem": v.problem, "dsl": v.dsl, "passed": v.passed, "reason": v.reason, "wall_s": v.wall_s,
        "overhead_s": v.overhead_s, "queue_wait_s": v.queue_wait_s, "worker_wait_s": v.worker_wait_s,
        "compile_s": comp.figures.get("compile_s") if comp else None, "timed_s": tim.figures.get("timed_s") if tim else None,
        "trusted_s": comp.figures.get("trusted_s") if comp else None,
        "candidate_median_us": v.candidate_median_us, "eager_median_us": v.eager_median_us,
        "cv": tim.figures.get("cv") if tim else None, "speedup": v.speedup,
        "eager_cached": tim.figures.get("eager_cached") if tim else None,
        "reference_cached": tim.figures.get("reference_cached") if tim else None,
        "trusted_phases_s": comp.figures.get("trusted_phases_s") if comp else None,
        "run_phases_s": tim.figures.get("run_phases_s") if tim else None,
        "hold_wait_s": (tim.figures.get("quiet_wait_s") if tim else None),
        "warm_start_s": comp.figures.get("warm_start_s") if comp else None,
        "hold_build": comp.figures.get("hold_build") if comp else None,
        "phases_s": v.phases_s,
        "first_pass_segments": tim.figures.get("input_sets_first_pass_segments") if tim else None,
        "inputs_made": tim.figures.get("input_sets_made") if tim else None,
        "device_code": comp.figures.get("device_code") if comp else None,
        "loop_split_s": tim.figures.get("loop_split_s") if tim else None,
        "recheck_s": tim.figures.get("recheck_s") if tim else None,
        "timing_loop_s": (v.phases_s or {}).get("worker.run.timing_loop"),
    }


def loop_split_table(rows: list[dict]) -> dict[int, dict]:
    """The candidate loop's wall by part (grader 2.21, mkb.measure.LOOP_PARTS), medians by problem beside the
    `timing_loop` phase and the timed calls' own seconds. Why: on the H200 (grader 2.20) the phase took 0.15-0.18 s per
    grading where the windows' device work is about a third of that, the largest piece of a warm grading's overhead
    left; this says whether the rest is the windows' host side, making sets in a ring, or the hooks' checks."""
    out: dict[int, dict] = {}
    for r in rows:
        if r.get("loop_split_s"):
            out.setdefault(r["problem"], []).append(r)
    table = {}
    for prob, rs in sorted(out.items()):
        parts = {k: statistics.median(r["loop_split_s"].get(k, 0.0) for r in rs) for k in rs[0]["loop_split_s"]}
        table[prob] = {"n": len(rs), "median_s": parts,
                       "timing_loop_s": statistics.median(r["timing_loop_s"] or 0.0 for r in rs),
                       "timed_s": statistics.median(r["timed_s"] or 0.0 for r in rs),
                       # grader 2.22: the part of "after" spent comparing re-checked outputs (None before 2.22)
                       "recheck_s": (statistics.median(r["recheck_s"] for r in rs)
                                     if all(r.get("recheck_s") is not None for r in rs) else None)}
    return table


def _loop_split_line(head: str, tab: dict | None) -> list[str]:
    if not tab:
        return []
    return [f"{head}: " + "; ".join(
        f"{prob}: " + " ".join(f"{k} {v:.3f}" for k, v in c["median_s"].items())
        + f" (phase timing_loop {c['timing_loop_s']:.3f}, timed calls {c['timed_s']:.3f}"
        + (f", re-check compares {c['recheck_s']:.3f}" if c.get("recheck_s") is not None else "") + f"; n {c['n']})"
        for prob, c in tab.items())]


def device_code_table(rows: list[dict]) -> dict:
    """Per DSL: what the queue made ahead (grader 2.17's states), the worker's reads, and the candidate compile's mean
    with builds read against without (the phase a precompile takes off)."""
    from mkb.grader._precompile import tally_device_code

    tally = tally_device_code((r["dsl"], r.get("device_code"), r.get("compile_s")) for r in rows)
    return {dsl: t.as_dict() for dsl, t in tally.items()}


def inputs_table(rows: list[dict]) -> dict[int, dict]:
    """`worker.run.timing_inputs` by problem, with the segments the first pass created (grader 2.14; 0: the worker had
    the blocks cached): the figures that tell a grading whose timed sets missed the worker's cached blocks (problem 1:
    1.65 s mean where its prepare had paused for a timing phase, graders 2.13-2.15, against 1.04 s not paused;
    h200-grader-bench-2-15)."""
    out: dict[int, dict] = {}
    for r in rows:
        cell = out.setdefault(r["problem"], {"n": 0, "inputs_s": [], "first_pass_segments": [], "made": []})
        cell["n"] += 1
        cell["inputs_s"].append((r.get("phases_s") or {}).get("worker.run.timing_inputs", 0.0))
        if r.get("first_pass_segments") is not None:
            cell["first_pass_segments"].append(r["first_pass_segments"])
        if r.get("inputs_made"):
            cell["made"].append((round(cell["inputs_s"][-1], 2), r["inputs_made"]))
    for cell in out.values():
        cell["mean_s"] = statistics.fmean(cell["inputs_s"])
        cell["over_1s"] = sum(x > 1.0 for x in cell["inputs_s"])
    return dict(sorted(out.items()))


def _inputs_line(head: str, tab: dict | None) -> list[str]:
    if not tab:
        return []
    parts = []
    for prob, c in tab.items():
        seg = f", first-pass segments {sorted(c['first_pass_segments'])}" if c["first_pass_segments"] else ""
        if c.get("made"):  # grader 2.19: per grading, the phase's seconds against where they went
            seg += ", made [" + ", ".join(
                f"{t} s: first pass {m['first_pass_s']:.2f} + sets {m['make_s']:.2f}, cpu {m['cpu_s']:.2f}, "
                f"mallocs {m['device_mallocs']} frees {m['device_frees']} retries {m['alloc_retries']}"
                for t, m in sorted(c["made"], key=lambda x: x[0])) + "]"
        parts.append(f"{prob}: {c['mean_s']:.3f} s ({c['over_1s']} of {c['n']} over 1 s{seg})")
    return [f"{head}: " + "; ".join(parts)]


def warm_start_table(rows: list[dict]) -> dict:
    """Median seconds of each step of the graded workers' GPU warm starts (grader 2.10; the warm-up a spare holds the
    device for under the quiet rule, `warm_ups` in `quiet_table`), so the warm-up's cost is attributed to its steps.
    Since 2.11 the hold's NVRTC build before `imported` is a step too (`hold_nvrtc_before_go`, not under the quiet
    rule), and `hold_builds` counts how the workers got the hold ("prebuilt", else "compiled (why)")."""
    steps = [r["warm_start_s"] for r in rows if r.get("warm_start_s")]
    names = list(dict.fromkeys(k for st in steps for k in st))
    builds = Counter(r["hold_build"] for r in rows if r.get("warm_start_s") and r.get("hold_build"))
    return {"n": len(steps), "median_s": {k: statistics.median([st.get(k, 0.0) for st in steps]) for k in names},
            "hold_builds": dict(builds.most_common())}


def phase_table(rows: list[dict]) -> list[dict]:
    """Median seconds per named phase over `rows` (a phase a grading did not have counts 0 there), largest first.

    The phases of one grading sum to its wall_s and those outside kernel.* to its overhead_s (mkb.grader._phases),
    so the medians say where the overhead goes; the sums of the per-grading values are given beside them.
    """
    rows = [r for r in rows if r.get("phases_s")]
    names = list(dict.fromkeys(k for r in rows for k in r["phases_s"]))
    out = []
    for k in names:
        xs = [r["phases_s"].get(k, 0.0) for r in rows]
        out.append({"phase": k, "median_s": statistics.median(xs), "mean_s": statistics.fmean(xs), "max_s": max(xs)})
    return sorted(out, key=lambda d: -d["mean_s"])


def format_phases(table: list[dict], *, top: int = 40) -> str:
    lines = [f"    {'phase':40s} {'median s':>9s} {'mean s':>9s} {'max s':>9s}"]
    for d in table[:top]:
        if d["max_s"] < 0.0005:
            continue
        lines.append(f"    {d['phase']:40s} {d['median_s']:9.4f} {d['mean_s']:9.4f} {d['max_s']:9.4f}")
    ovh = sum(d["mean_s"] for d in table if not d["phase"].startswith("kernel."))
    lines.append(f"    {'(mean overhead = sum of the non-kernel means)':40s} {'':9s} {ovh:9.4f}")
    return "\n".join(lines)


def memory_bound_baselines(dsls: tuple[str, ...] | None = None) -> list:
    """The baselines (discovered) of problems whose speed of light is bandwidth-bound on the H200."""
    from mkb.measure import speed_of_light
    from mkb.problems import baselines, find_problem, load_problem

    out = []
    bound: dict[int, str] = {}
    for b in baselines(dsls=dsls):
        if b.problem not in bound:
            m = load_problem(find_problem(b.problem)).meta
            bound[b.problem] = speed_of_light(flops=m.flops, bytes=m.bytes, peak=m.peak).bound
        if bound[b.problem] == "memory":
            out.append(b)
    return out


def overhead(*, problem: int = 28, dsls: tuple[str, ...] | None = None, repeats: int = 5, config=None, writer=None,
             store: str | None = None, device: str = "cuda:0", log=print, deadline: float | None = None) -> dict:
    """One job at a time through a warm queue; the pool holds a spare for every grading (none imports while one times).

    Past `deadline` (time.monotonic()) no further grading starts."""
    from mkb.grader import GradeJob, GraderConfig, GradingQueue
    from mkb.problems import baselines

    found = {b.dsl: b.path for b in baselines([problem], dsls=dsls)}
    cfg = config or GraderConfig()
    out: dict = {"problem": problem, "repeats": repeats, "config": cfg.as_dict(), "dsls": {}}
    with GradingQueue(device=device, store=store, writer=writer, config=cfg, dsls=tuple(found),
                      depth=repeats + 1, low_water=0) as q:
        q.pool.refill_on_take = False  # every grading has its spare already: none spawns (imports) while another is graded
        for dsl, path in found.items():
            rows = []
            for r in range(repeats + 1):  # the first grading measures the eager baseline and is not counted
                if deadline is not None and time.monotonic() > deadline:
                    log(f"[bench] {dsl}: budget spent, {repeats + 1 - r} gradings not started")
                    break
                q.pool.wait_warm(cfg.start_limit_s)
                v = q.submit(GradeJob(problem, dsl, path, experiment="bench-overhead")).result()
                row = _row(v)
                log(f"[bench] {dsl} #{r}{' (eager, not counted)' if r == 0 else ''}: passed={v.passed} reason={v.reason} "
                    f"wall={v.wall_s:.2f}s overhead={v.overhead_s:.2f}s compile={row['compile_s']} median={v.candidate_median_us} "
                    f"eager_cached={row['eager_cached']}")
                if r:
                    rows.append(row)
            ovh = [r["overhead_s"] for r in rows if r["overhead_s"] is not None]
            med = [r["candidate_median_us"] for r in rows]
            out["dsls"][dsl] = {
                "kernel": _rel(path), "runs": rows,
                "overhead_s_median": statistics.median(ovh) if ovh else None, "overhead_s_max": max(ovh) if ovh else None,
                "candidate_median_us": statistics.median([m for m in med if m is not None]) if any(med) else None,
                "candidate_spread": _spread(med), "all_passed": all(r["passed"] for r in rows),
                "phases": phase_table(rows),
            }
            log(f"[bench] overhead by phase, problem {problem} {dsl} ({len(rows)} counted gradings):\n"
                + format_phases(out["dsls"][dsl]["phases"]))
    return out


def backlog(*, problem: int = 72, dsls: tuple[str, ...] | None = None, repeats: int = 4, config=None, writer=None,
            store: str | None = None, device: str = "cuda:0", depth: int = 4, low_water: int = 2, log=print,
            deadline: float | None = None) -> dict:
    """One kernel per DSL graded once (the eager timing, the plan's footprint; not counted), then `repeats` times
    submitted at once: with a backlog the queue prefetches each next job's trusted plan on the spare that grades it
    (grader 2.5, mkb.grader._prefetch). Prints the overhead by phase and how each plan was made."""
    from mkb.grader import GradeJob, GraderConfig, GradingQueue
    from mkb.problems import baselines

    from mkb.grader._pool import quiet_for

    found = {b.dsl: b.path for b in baselines([problem], dsls=dsls)}
    cfg = config or GraderConfig()
    out: dict = {"problem": problem, "repeats": repeats, "dsls": {}}
    since = time.monotonic()
    with GradingQueue(device=device, store=store, writer=writer, config=cfg, dsls=tuple(found),
                      depth=depth, low_water=low_water) as q:
        for dsl, path in found.items():
            if deadline is not None and time.monotonic() > deadline:
                log(f"[bench] backlog {dsl}: budget spent, not started")
                break
            q.pool.wait_warm(cfg.start_limit_s)
            first = q.submit(GradeJob(problem, dsl, path, experiment="bench-backlog")).result()
            log(f"[bench] backlog {dsl} #0 (eager and footprint, not counted): passed={first.passed} reason={first.reason} "
                f"wall={first.wall_s:.2f}s overhead={first.overhead_s:.2f}s")
            q.pool.wait_warm(cfg.start_limit_s)
            futs = [q.submit(GradeJob(problem, dsl, path, experiment="bench-backlog")) for _ in range(repeats)]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, not_done = concurrent.futures.wait(futs, timeout=left)
            cancelled = sum(f.cancel() for f in not_done)
            rows = []
            for k, f in enumerate(futs):
                if f.cancelled():
                    continue
                v = f.result()
                row = {**_row(v), "prefetch": v.prefetch, "device_idle_s": v.device_idle_s,
                       "clock_warm": (v.stage("timing").figures.get("clock_warm") if v.stage("timing") else None)}
                rows.append(row)
                p = v.prefetch or {}
                cw = row["clock_warm"] or {}
                log(f"[bench] backlog {dsl} #{k + 1}: passed={v.passed} reason={v.reason} wall={v.wall_s:.2f}s "
                    f"overhead={v.overhead_s:.2f}s prefetch={p.get('state')} prepare_s={p.get('prepare_s')} "
                    f"wait_s={p.get('wait_s')} median={v.candidate_median_us} device_idle_s={_f(v.device_idle_s, '.3f')} "
                    f"clock_warm: first {cw.get('first_mhz')} of {cw.get('max_mhz')} MHz, {cw.get('s')} s, by {cw.get('by')}")
            ovh = [r["overhead_s"] for r in rows if r["overhead_s"] is not None]
            states: dict[str, int] = {}
            for r in rows:
                st = (r["prefetch"] or {}).get("state") or "none"
                states[st] = states.get(st, 0) + 1
            med = [r["candidate_median_us"] for r in rows]
            used = [r for r in rows if (r["prefetch"] or {}).get("plan_used")]
            out["dsls"][dsl] = {
                "kernel": _rel(path), "runs": rows, "cancelled": cancelled, "prefetch_states": states,
                "overhead_s_median": statistics.median(ovh) if ovh else None, "overhead_s_max": max(ovh) if ovh else None,
                "overhead_s_median_prefetched": statistics.median([r["overhead_s"] for r in used]) if used else None,
                "prepare_s_median": statistics.median([r["prefetch"]["prepare_s"] for r in used
                                                       if r["prefetch"].get("prepare_s") is not None] or [0.0]) if used else None,
                "candidate_median_us": statistics.median([m for m in med if m is not None]) if any(med) else None,
                "candidate_spread": _spread(med), "all_passed": all(r["passed"] for r in rows), "phases": phase_table(rows),
                "eager": {"passed": first.passed, "wall_s": first.wall_s, "overhead_s": first.overhead_s},
                "clock_warm": clock_warm_table(rows), "loop_split": loop_split_table(rows),
            }
            log(f"[bench] backlog, problem {problem} {dsl}: prefetch {states}; overhead by phase ({len(rows)} gradings):\n"
                + format_phases(out["dsls"][dsl]["phases"]))
    out["quiet"] = quiet_table(quiet_for(device).history, since)
    return out


def quiet_table(history, since: float) -> dict:
    """The device's quiet coordinator's record (mkb.grader._pool.GpuQuiet.history: (monotonic, event, pid)) from
    `since`: how long spares' GPU warm-ups (`go` -> `warmed`) and prefetches (`prepare` -> `warmed`) ran, which a
    timing phase waits behind (`run.quiet_wait`), and how many spares' `go` waited for a grading's timing phase to
    end (`deferred`; from their imports to their `go`). The data for judging the warm-up schedule, not a decision."""
    warm, prep, deferred = [], [], []
    started: dict[int, tuple[str, float]] = {}
    imported: dict[int, float] = {}
    waits_deferred: set[int] = set()
    at_once = 0  # the most warm-ups and prefetches on the device at one time
    history = sorted(history, key=lambda e: e[0])  # in time order (stable: one instant keeps its order of notes)
    for t, event, pid in history:
        if t < since:
            continue
        if event == "imported":
            imported[pid] = t
        elif event == "deferred":
            waits_deferred.add(pid)
        elif event in ("go", "prepare"):
            started[pid] = (event, t)
            if event == "go" and pid in waits_deferred and pid in imported:
                deferred.append(t - imported[pid])
        elif event == "warmed" and pid in started:
            kind, t0 = started.pop(pid)
            (warm if kind == "go" else prep).append(t - t0)
        elif event == "forgotten":  # killed while warming: no longer on the device, and no duration to count
            started.pop(pid, None)
        at_once = max(at_once, len(started))

    def stats(xs: list[float]) -> dict:
        return {"n": len(xs), "median_s": statistics.median(xs) if xs else None, "max_s": max(xs) if xs else None}

    # the record itself too (seconds from `since`, event, pid), so the warm-up schedule can be read offline against the
    # gradings' phases: which warm-up a timing phase waited behind, and how many ran at once
    timeline = [[round(t - since, 4), event, pid] for t, event, pid in history if t >= since]
    return {"warm_ups": stats(warm), "prepares": stats(prep), "deferred_go": stats(deferred), "at_once_max": at_once,
            "timeline": timeline}


def _quiet_line(head: str, q: dict | None) -> list[str]:
    if not q:
        return []
    w, p, d = q["warm_ups"], q["prepares"], q["deferred_go"]
    return [f"{head}: spares' GPU warm-ups {w['n']} (median {_f(w['median_s'], '.3f')} s, max {_f(w['max_s'], '.3f')}), "
            f"prefetches {p['n']} (median {_f(p['median_s'], '.3f')} s, max {_f(p['max_s'], '.3f')}); go deferred behind a "
            f"grading's timing phase for {d['n']} spares (imports to go: median {_f(d['median_s'], '.3f')} s, "
            f"max {_f(d['max_s'], '.3f')}); at most {q.get('at_once_max', '-')} warm-ups and prefetches at once"]


def clock_warm_table(rows: list[dict]) -> dict:
    """The candidate loops' clock warm-ups (grader 2.5's timing `clock_warm`) beside the device's idle time before each
    grading: how often the SM clock already read its maximum before any work, and what the warm-up cost then. The data
    for deciding whether a warm-up right after another grading can be cut (DESIGN, Grader), not a decision."""
    cw = [(r.get("device_idle_s"), r["clock_warm"]) for r in rows if r.get("clock_warm")]
    at_max = [(idle, c) for idle, c in cw if c.get("first_mhz") and c.get("max_mhz") and c["first_mhz"] >= 0.95 * c["max_mhz"]]
    return {"n": len(cw), "first_at_max": len(at_max),
            "s_median": statistics.median([c["s"] for _, c in cw]) if cw else None,
            "s_median_first_at_max": statistics.median([c["s"] for _, c in at_max]) if at_max else None,
            "idle_s_max_first_at_max": max((i for i, _ in at_max if i is not None), default=None),
            "by_clock": sum(1 for _, c in cw if c.get("by") == "clock")}


def throughput(*, rounds: int = 3, dsls: tuple[str, ...] | None = None, config=None, writer=None, store: str | None = None,
               device: str = "cuda:0", depth: int = 4, low_water: int = 1, log=print, deadline: float | None = None) -> dict:
    """All memory-bound baselines x `rounds`, pushed at once by two producers; gradings per GPU-hour.

    Past `deadline` (time.monotonic()) the gradings not yet started are cancelled; the figures count the finished
    ones over the time to the last of them. Beside the measured rate, `steady_gradings_per_gpu_hour` is 3600 over
    the mean wall of the gradings that found the eager and reference timings cached (a long-running queue's case:
    a session times each problem's eager baseline once)."""
    from mkb.grader import GradeJob, GraderConfig, GradingQueue

    from mkb.grader._pool import quiet_for, replay_phases

    base = memory_bound_baselines(dsls)
    cfg = config or GraderConfig()
    since = time.monotonic()
    jobs = [GradeJob(b.problem, b.dsl, b.path, experiment=f"producer{i % 2}") for r in range(rounds) for i, b in enumerate(base)]
    with GradingQueue(device=device, store=store, writer=writer, config=cfg, dsls=tuple(dict.fromkeys(b.dsl for b in base)),
                      depth=depth, low_water=low_water) as q:
        q.pool.wait_warm(cfg.start_limit_s)
        futs: list = []
        lock = threading.Lock()
        t0 = time.monotonic()

        def produce(k: int) -> None:
            mine = [q.submit(j) for j in jobs if j.experiment == f"producer{k}"]
            with lock:
                futs.extend(mine)

        producers = [threading.Thread(target=produce, args=(k,)) for k in range(2)]
        for p in producers:
            p.start()
        for p in producers:
            p.join()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        _, not_done = concurrent.futures.wait(futs, timeout=left)
        cancelled = sum(f.cancel() for f in not_done)  # all at once; the one running finishes (never cut short)
        verdicts, t_last = [], t0
        for f in concurrent.futures.as_completed([f for f in futs if not f.cancelled()]):
            verdicts.append(f.result())
            t_last = time.monotonic()
        elapsed = t_last - t0
        precompiler = getattr(q, "precompiler", None)
        made_ahead = precompiler.figures().as_dict() if precompiler is not None else None
    if cancelled:
        log(f"[bench] throughput: budget spent, {cancelled} gradings cancelled before they started")
    rows = [{**_row(v), "prefetch": v.prefetch} for v in verdicts]
    states: dict[str, int] = {}
    for r in rows:
        st = (r["prefetch"] or {}).get("state") or "none"
        states[st] = states.get(st, 0) + 1
    steady = [r["wall_s"] for r in rows if r["eager_cached"] and r["reference_cached"]]
    ovh = [r["overhead_s"] for r in rows if r["overhead_s"] is not None]
    per_hour = 3600.0 * len(rows) / elapsed if elapsed > 0 else None
    res = {"problems": sorted({b.problem for b in base}), "kernels": [_rel(b.path) for b in base],
           "rounds": rounds, "gradings": len(rows), "elapsed_s": elapsed, "gradings_per_gpu_hour": per_hour,
           "overhead_s_median": statistics.median(ovh) if ovh else None, "all_passed": all(r["passed"] for r in rows),
           "busy_s": q.busy_s, "depth": depth, "low_water": low_water, "runs": rows,
           "wall_s_median": statistics.median([r["wall_s"] for r in rows]) if rows else None,
           "worker_wait_s_median": statistics.median([r["worker_wait_s"] or 0.0 for r in rows]) if rows else None,
           "phases": phase_table(rows), "cancelled": cancelled, "prefetch_states": states,
           "steady_gradings": len(steady),
           "steady_gradings_per_gpu_hour": 3600.0 / statistics.fmean(steady) if steady else None,
           "quiet": quiet_table(quiet_for(device).history, since), "warm_start": warm_start_table(rows),
           "timing_inputs": inputs_table(rows), "loop_split": loop_split_table(rows),
           "device_code": device_code_table(rows), "precompiler": made_ahead,
           "quiet_replayed": dataclasses.asdict(replay_phases(list(quiet_for(device).history), since=since))}
    log("[bench] throughput: overhead by phase (every grading):\n" + format_phases(res["phases"]))
    log(f"[bench] throughput: {len(rows)} gradings of {len(base)} memory-bound baselines in {elapsed:.1f} s: "
        f"{_f(per_hour, '.0f')} gradings per GPU-hour; overhead median {_f(res['overhead_s_median'], '.3f')} s")
    return res


def committed(store: str, *, log=print) -> dict:
    """Overhead by phase from a store graded before grader 2.4 (no `phases_s`): what its events already attribute.

    Such a verdict's wall splits into its worker wait (verdict details), the trusted phase (`trusted_s` with its
    `trusted_phases_s`, compile event), the run's phases (`run_phases_s`, timing event: compile through the final
    draw) with the candidate's compile_s and timed_s taken out, and `rest` (the parent's steps, the problem load
    before the trusted clock started, the integrity stage, IPC, teardown). Passed verdicts only (a failed one has
    no timing event).
    """
    import glob

    import pyarrow.parquet as pq

    def rows(kind: str) -> dict[str, dict]:
        out = {}
        for f in sorted(glob.glob(f"{store}/kind={kind}/*.parquet")):
            for r in pq.read_table(f).to_pylist():
                out[r["evaluation_id"]] = r
        return out

    verdicts, comps, tims = rows("verdict"), rows("compile"), rows("timing")
    out_rows = []
    for eid, v in verdicts.items():
        if not v["passed"] or eid not in comps or eid not in tims:
            continue
        d, cd, td = (json.loads(x or "{}") for x in (v["details"], comps[eid]["details"], tims[eid]["details"]))
        if "phases_s" in d or not td.get("run_phases_s"):
            continue
        ph = {"parent.worker_wait": d.get("worker_wait_s") or 0.0}
        ph.update({f"worker.trusted.{k}": x for k, x in (cd.get("trusted_phases_s") or {}).items()})
        ph.update({f"worker.run.{k}": x for k, x in td["run_phases_s"].items()})
        compile_s, timed_s = comps[eid]["compile_s"] or 0.0, td.get("timed_s") or 0.0
        ph["worker.run.compile"] = ph.get("worker.run.compile", 0.0) - compile_s
        ph["worker.run.timing_loop"] = ph.get("worker.run.timing_loop", 0.0) - timed_s
        ph["kernel.compile"], ph["kernel.timed"] = compile_s, timed_s
        ph["rest"] = d["wall_s"] - sum(ph.values())
        out_rows.append({"problem": v["problem"], "dsl": v["dsl"], "wall_s": d["wall_s"], "overhead_s": d["overhead_s"],
                         "worker_wait_s": d.get("worker_wait_s"), "eager_cached": td.get("eager_cached"),
                         "reference_cached": td.get("reference_cached"), "phases_s": ph})
    warm = [r for r in out_rows if r["eager_cached"] and r["reference_cached"] and (r["worker_wait_s"] or 0.0) < 0.05]
    res = {"store": store, "passed": len(out_rows), "warm": len(warm),
           "overhead_s_median": statistics.median([r["overhead_s"] for r in out_rows]) if out_rows else None,
           "warm_overhead_s_median": statistics.median([r["overhead_s"] for r in warm]) if warm else None,
           "phases": phase_table(out_rows), "warm_phases": phase_table(warm)}
    log(f"[bench] {store}: {len(out_rows)} passed verdicts, overhead median {_f(res['overhead_s_median'], '.3f')} s; "
        f"{len(warm)} with eager and reference cached and a worker ready (wait < 50 ms): overhead median "
        f"{_f(res['warm_overhead_s_median'], '.3f')} s, by phase:\n" + format_phases(res["warm_phases"]))
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default="overhead,throughput",
                    help="overhead, backlog, throughput (GPU); committed (CPU: phases of the stores named by --committed)")
    ap.add_argument("--committed", nargs="*", default=[], help="stores graded before grader 2.4, for --sections committed")
    ap.add_argument("--problem", type=int, nargs="+", default=[28], help="one or more problems for the overhead section")
    ap.add_argument("--dsl", action="append", default=None, help="only these DSLs (default: every registered one)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--low-water", type=int, default=1)
    ap.add_argument("--n-timed", type=int, default=100)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--store", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no grading after this many seconds (the one running finishes); figures count what finished")
    ap.add_argument("--out", default=None, help="a folder for grader_bench.json and events.tar.gz (the store, folder --name)")
    ap.add_argument("--name", default="h200-grader-bench-2-5", help="the dataset folder name inside events.tar.gz")
    ap.add_argument("--floor-hold-us", type=float, default=None, help="GraderConfig.floor_hold_us (an A/B arm: the SM hold "
                    "behind the side-work check's empty calls; recorded as a config override on every verdict)")
    ap.add_argument("--precompile", choices=("on", "off"), default=None, help="GraderConfig.precompile (an A/B arm: "
                    "'off' compiles every TIRx kernel in its worker, as before grader 2.17; recorded as a config override)")
    ap.add_argument("--prefetch-fraction", type=float, default=None, help="GraderConfig.prefetch_fraction (an A/B arm: the "
                    "share of the free memory a plan made ahead may take, 1/16 as shipped; recorded as a config override)")
    ap.add_argument("--read-guard", choices=("off", "landlock"), default=None, help="GraderConfig.read_guard (recorded as "
                    "a config override where it is not the shipped 'landlock')")
    ap.add_argument("--smoke", action="store_true", help="GraderConfig.quick at smoke size (a CPU check of this script; never a figure)")
    a = ap.parse_args(argv)
    from mkb.grader import GraderConfig

    deadline = time.monotonic() + a.budget_s if a.budget_s else None
    store, out = a.store, Path(a.out) if a.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        store = store or str(Path(tempfile.mkdtemp(prefix="mkb-grader-bench-")) / a.name)
    cfg = GraderConfig(n_timed=a.n_timed) if not a.smoke else GraderConfig.quick(
        device=a.device.split(":")[0], size="smoke", start_limit_s=120.0, wall_limit_s=60.0, compile_limit_s=30.0)
    if a.floor_hold_us is not None:
        cfg = dataclasses.replace(cfg, floor_hold_us=a.floor_hold_us)
    if a.precompile is not None:
        cfg = dataclasses.replace(cfg, precompile=a.precompile)
    if a.prefetch_fraction is not None:
        cfg = dataclasses.replace(cfg, prefetch_fraction=a.prefetch_fraction)
    if a.read_guard is not None:
        cfg = dataclasses.replace(cfg, read_guard=a.read_guard)
    dsls = tuple(a.dsl) if a.dsl else None
    res: dict = {"budget_s": a.budget_s, "config_overrides": cfg.overrides()}  # an A/B arm's figures say so
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    if not a.smoke:  # the packages, grader, timing policy and code that ran (the GPU scripts' one record of them)
        from gpu_grader_run import versions

        res["versions"] = versions()
    sections = a.sections.split(",")
    if not a.smoke and a.device.startswith("cuda") and set(sections) - {"committed"}:
        from gpu_grader_run import preflight

        preflight(dsls)  # one line, before any grading, when a DSL's toolchain is missing here
    t0 = time.monotonic()
    if "committed" in sections:
        res["committed"] = [committed(s) for s in a.committed]
    if "overhead" in sections:
        res["overhead"] = [overhead(problem=p, dsls=dsls, repeats=a.repeats, config=cfg, store=store, device=a.device,
                                    deadline=deadline) for p in a.problem]
    if "backlog" in sections:
        res["backlog"] = [backlog(problem=p, dsls=dsls, repeats=a.repeats, config=cfg, store=store, device=a.device,
                                  depth=a.depth, low_water=a.low_water, deadline=deadline) for p in a.problem]
    if "throughput" in sections and (deadline is None or time.monotonic() < deadline):
        res["throughput"] = throughput(rounds=a.rounds, dsls=dsls, config=cfg, store=store, device=a.device,
                                       depth=a.depth, low_water=a.low_water, deadline=deadline)
    res["elapsed_s"] = time.monotonic() - t0
    print(summary(res))
    print(f"[bench] done in {res['elapsed_s']:.0f} s")
    text = json.dumps(res, indent=1, default=str)
    if a.json:
        Path(a.json).write_text(text)
    if out is not None:
        (out / "grader_bench.json").write_text(text)
        if store and os.path.isdir(store):
            from mkb.events import pack_dataset
            pack_dataset(store, out / "events.tar.gz", arcname=a.name)


def _f(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _largest_phases(head: str, d: dict) -> list[str]:
    """One line naming the six largest overhead phases of a section's DSL (nothing when it has no phases)."""
    top = [p for p in d.get("phases", []) if not p["phase"].startswith("kernel.")][:6]
    return [f"{head}, largest phases (median s): " + ", ".join(f"{p['phase']} {p['median_s']:.3f}" for p in top)] if top else []


def summary(res: dict) -> str:
    """The figures the issue's targets name, one line each (an A/B arm's run says so first: not the shipped grader's)."""
    lines = []
    if res.get("config_overrides"):
        lines.append(f"FIGURE config: NOT the grader as shipped: overrides {res['config_overrides']}")
    runs = res.get("overhead") or []
    for o, dsl, d in [(o, dsl, d) for o in (runs if isinstance(runs, list) else [runs]) for dsl, d in o.get("dsls", {}).items()]:
        lines.append(f"FIGURE overhead per evaluation, warm queue, problem {o['problem']} {dsl}: "
                     f"median {_f(d['overhead_s_median'], '.3f')} s (max {_f(d['overhead_s_max'], '.3f')}; target < 0.5 s); "
                     f"candidate median {d['candidate_median_us']} us, spread {100 * (d['candidate_spread'] or 0):.2f}%")
        lines += _largest_phases(f"FIGURE overhead, problem {o['problem']} {dsl}", d)
    for o, dsl, d in [(o, dsl, d) for o in res.get("backlog") or [] for dsl, d in o.get("dsls", {}).items()]:
        lines.append(f"FIGURE overhead per evaluation, warm queue with a backlog of {o['repeats']}, problem {o['problem']} "
                     f"{dsl}: median {_f(d['overhead_s_median'], '.3f')} s (max {_f(d['overhead_s_max'], '.3f')}; target "
                     f"< 0.5 s); with the plan prefetched {_f(d['overhead_s_median_prefetched'], '.3f')} s; prefetch "
                     f"{d['prefetch_states']}, prepare median {_f(d['prepare_s_median'], '.3f')} s (outside the wall); "
                     f"candidate spread {100 * (d['candidate_spread'] or 0):.2f}%; all passed: {d['all_passed']}")
        c = d.get("clock_warm") or {}
        if c.get("n"):
            lines.append(f"FIGURE clock warm-up, problem {o['problem']} {dsl}: {c['first_at_max']} of {c['n']} found the SM "
                         f"clock at >= 95% of its maximum before any work (longest idle before such: "
                         f"{_f(c['idle_s_max_first_at_max'], '.3f')} s); warm-up median {_f(c['s_median'], '.3f')} s, "
                         f"{_f(c['s_median_first_at_max'], '.3f')} s when at max; ended by the clock reading {c['by_clock']}")
        lines += _largest_phases(f"FIGURE backlog overhead, problem {o['problem']} {dsl}", d)
        lines += _loop_split_line(f"FIGURE backlog candidate loop by part (median s), {dsl}", d.get("loop_split"))
    for o in res.get("backlog") or []:
        lines += _quiet_line(f"FIGURE backlog quiet rule, problem {o['problem']}", o.get("quiet"))
    for c in res.get("committed") or []:
        top = sorted((d for d in c["warm_phases"] if not d["phase"].startswith("kernel.")), key=lambda d: -d["median_s"])[:6]
        lines.append(f"FIGURE committed {c['store']}: overhead median {_f(c['overhead_s_median'], '.3f')} s over "
                     f"{c['passed']} passed; {_f(c['warm_overhead_s_median'], '.3f')} s over the {c['warm']} with eager "
                     f"and reference cached and a worker ready; largest phases (median s): "
                     + ", ".join(f"{d['phase']} {d['median_s']:.3f}" for d in top))
    if res.get("throughput"):
        lines += _throughput_lines(res["throughput"])
    return "\n".join(lines)


def _throughput_lines(t: dict) -> list[str]:
    """One throughput run's figures."""
    lines = []
    lines.append(f"FIGURE gradings per GPU-hour, memory-bound baselines {t['problems']}: {_f(t['gradings_per_gpu_hour'], '.0f')} "
                 f"({t['gradings']} gradings in {t['elapsed_s']:.1f} s, {t['cancelled']} cancelled by the budget; "
                 f"target >= 1500); all passed: {t['all_passed']}; overhead median {_f(t['overhead_s_median'], '.3f')} s, "
                 f"wall median {_f(t['wall_s_median'], '.3f')} s, worker wait median {_f(t['worker_wait_s_median'], '.3f')} s; "
                 f"prefetch {t.get('prefetch_states')}")
    if t.get("steady_gradings_per_gpu_hour"):
        lines.append(f"FIGURE gradings per GPU-hour with the eager and reference timings cached (3600 / mean wall of "
                     f"{t['steady_gradings']} such gradings): {t['steady_gradings_per_gpu_hour']:.0f}")
    top = [d for d in t.get("phases", []) if not d["phase"].startswith("kernel.")][:6]
    if top:
        lines.append("FIGURE throughput overhead, largest phases (mean s): "
                     + ", ".join(f"{d['phase']} {d['mean_s']:.3f}" for d in top))
    for dsl, d in (t.get("device_code") or {}).items():
        lines.append(f"FIGURE throughput device code made ahead, {dsl}: states {d['states']}; worker reads: {d['hits']} "
                     f"hits, {d['misses']} misses, {d['uncacheable']} uncacheable; candidate compile mean "
                     f"{_f(d['compile_s_mean_read'], '.3f')} s over {d['n_read']} gradings that read a build, "
                     f"{_f(d['compile_s_mean_not_read'], '.3f')} s over {d['n_not_read']} that did not")
    pc = t.get("precompiler")
    if pc:
        lines.append(f"FIGURE throughput precompiler: stopped for {pc['pauses']} timing phases, {pc['paused_s']:.1f} s in all; "
                     f"servers " + ", ".join(f"{dsl} ready in {i.get('seconds')} s" for dsl, i in sorted(pc["servers"].items())))
    lines += _quiet_line("FIGURE throughput quiet rule", t.get("quiet"))
    lines += _inputs_line("FIGURE throughput timing_inputs by problem (mean)", t.get("timing_inputs"))
    lines += _loop_split_line("FIGURE throughput candidate loop by part (median s)", t.get("loop_split"))
    r = t.get("quiet_replayed")
    if r:
        lines.append(f"FIGURE throughput quiet rule replayed: {r['timing_phases']} timing phases, "
                     f"{len(r['beside_timing'])} beside another's, {len(r['go_beside_timing'])} spares' warm-ups or "
                     f"prefetches started beside one, {r['warm_ups_beside_timing']} entered while a warm-up ran on "
                     f"(its wait ran out), {r.get('beside_teardown', 0)} while a finished worker was still torn down")
    w = t.get("warm_start") or {}
    if w.get("n"):
        lines.append(f"FIGURE throughput workers' GPU warm starts by step (median s over {w['n']}; "
                     f"hold_nvrtc_before_go is before `imported`, not under the quiet rule): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in w["median_s"].items())
                     + (f"; hold builds {w['hold_builds']}" if w.get("hold_builds") else ""))
    return lines


if __name__ == "__main__":
    main()
