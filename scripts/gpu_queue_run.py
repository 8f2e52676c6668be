"""The recorded H200 run for issue #10's "done when": one grading queue fed by two concurrent producers, checked
against one-at-a-time gradings, plus the grader benchmark's figures through the queue.

1. serial: every job graded one at a time with `grade()` on a warm `WorkerPool` (no queue): the reference.
2. queue: the same jobs pushed at once through one `GradingQueue` by two producers (a thread and an asyncio
   task), then one exclusive pair batch (problem 28's baselines, `scope="pair"`).
3. compare: per job the same `passed` and `reason`, and for passing kernels the candidate median within
   0.5% of the serial one; every red-team form rejected with its expected reason.
4. bench: `benchmarks/grader_bench.py` overhead (problem 28, warm queue) and throughput (memory-bound baselines).

Jobs: every baseline the problem folders hold (discovered), the red-team controls and every red-team form of
tests/redteam (both DSLs): 98 gradings per pass today (92 before grader 2.14 added the form that rewrites its own source, 94 before 2.15 added the ones that leave a helper process running and hang a hook on the interpreter).

    export PYTHONPATH=/tmp/mkb-site/nvidia_cutlass_dsl/dsl_packages:/tmp/mkb-site:$PWD CUDA_PATH=/usr/local/cuda \
           CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
    python3 scripts/gpu_queue_run.py 2>&1 | tee $OUT/log

$OUT gets: log (from tee), summary.json (every verdict of both passes, the comparison, the red-team table, the
figures), bench.json, events.tar.gz (the store, dataset folder `--name`), the summary and the store rewritten after
every section, so a run its call's limit kills keeps the sections it finished. Expect about 10 minutes for
`--sections serial,queue` (the serial pass 5-6, the queue about 0.8 of it), more than one device call's 600 s: run
`--sections serial` in one call and `--sections queue --serial-from <that call's summary.json>` in the next (refused
when the next call got another GPU, which happens). Or in one call, on one GPU, the jobs that must pass only (the
red-team suite's serial pass then runs on its own):

    timeout 590 python3 scripts/gpu_queue_run.py --sections serial,queue --serial-jobs passing --queue-jobs passing \
        --serial-rounds 2 --queue-rounds 2 --budget-s 500

which grades the 16 baselines and 4 controls twice each way (80 gradings: 357 s in h200-grader-2-10-queue, 180 s
serial and 162 s queued with the pair batch; past `--budget-s` the serial pass starts no grading and the queue cancels what has not started,
naming each in `skipped`, so the call's limit never loses a section) and adds the pooled
comparison (`POOLED` lines, `summary["pooled"]`): per job the mean of its queue gradings against the mean of its serial
ones, with the standard error from both sides' spread; and the queue's effect over every job that only works on the
device (`EFFECT` line, `summary["queue_effect"]`), the reading the queue is judged by (DESIGN). With `--order abba` the
rounds alternate in blocks serial, queue, queue, serial (equal rounds each way), so the machine's drift over the call
lands on both sides instead of reading as the queue's effect:

    timeout 480 python3 scripts/gpu_queue_run.py --sections serial,queue --serial-jobs passing --queue-jobs passing \
        --serial-rounds 2 --queue-rounds 2 --order abba --budget-s 400

A recorded run is judged
again on a CPU, alone or pooled with others (`POOLED EFFECT`), from its summary and its dataset's events:

    python scripts/gpu_queue_run.py --rejudge A/logs/summary.json B/logs/summary.json --store A B
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import concurrent.futures
import json
import os
import re
import statistics
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "redteam"), str(REPO / "benchmarks"), str(REPO / "scripts")]

MEDIAN_TOL = 0.005


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


@dataclass(frozen=True)
class Case:
    key: str
    problem: int
    dsl: str
    path: Path
    expected: tuple[str, ...] | None  # None: must pass; else acceptable reasons (red-team forms)


def cases(tmp: Path) -> list[Case]:
    import redteam_hacks as R

    from mkb.problems import baselines

    out = [Case(f"baseline/{b.problem}/{b.dsl}", b.problem, b.dsl, b.path, None) for b in baselines()]
    for dsl in R.DSLS:
        paths = R.write_all(tmp, dsl)  # forms whose target problem has no baseline they fit are left out
        for name in sorted(n for n in paths if n.startswith("control")):
            problem = R.PROBLEM if name == "control" else int(name.split("_")[1])
            out.append(Case(f"redteam/{name}/{dsl}", problem, dsl, paths[name], None))
        for h in R.HACKS:
            if h.name not in paths:
                continue
            exp = (f"static_{h.static}",) if h.static else tuple(h.runtime)
            out.append(Case(f"redteam/{h.name}/{dsl}", h.problem, dsl, paths[h.name], exp))
    return out


def row(c: Case, v) -> dict:
    from mkb._secrets import redact

    t = v.stage("timing")
    return {"key": c.key, "problem": v.problem, "dsl": v.dsl, "passed": v.passed, "reason": v.reason,
            "candidate_median_us": v.candidate_median_us, "eager_median_us": v.eager_median_us, "speedup": v.speedup,
            "cv": t.figures.get("cv") if t else None, "wall_s": v.wall_s, "overhead_s": v.overhead_s,
            "queue_wait_s": v.queue_wait_s, "evaluation_id": v.evaluation_id, "message": redact(v.message or "")[:800],
            "host_syncs": host_syncs(v.stage("integrity").figures if v.stage("integrity") else None),
            "guards": guards_of(v.stage("compile").figures if v.stage("compile") else None),
            "device_code": (v.stage("compile").figures.get("device_code") if v.stage("compile") else None),
            "compile_s": v.stage("compile").figures.get("compile_s") if v.stage("compile") else None}


def guards_of(compile_figures: dict | None) -> str | None:
    """What the worker's guards were (grader 2.14+), its scratch folder's path left out so that workers compare."""
    if not compile_figures or compile_figures.get("fs_guard") is None:
        return None
    fs = re.sub(r"/\S*mkb-worker-[^,; ]*", "<scratch>", compile_figures["fs_guard"])
    return f"{fs} | {compile_figures.get('syscall_guard')}"


def host_syncs(integrity: dict | None) -> int | None:
    """The most times one profiled call made the host wait for the device (None when nothing was profiled): a call
    that reads device data on the host repeats only within its measured spread (DESIGN, the repeat promise), so the
    queue's effect is read over the calls that only work on the device."""
    seen = [p.get("host_syncs") for p in (integrity or {}).get("profiled") or [] if isinstance(p, dict)]
    seen = [int(x) for x in seen if x is not None]
    return max(seen) if seen else None


def write_outputs(out: Path, summary: dict, *, stage: str, store: Path | None, name: str) -> None:
    """What the run has so far, written after every section: a run killed by its call's limit keeps what it finished
    (h200-grader-2-8-serial lost a whole serial pass's events to a kill in the queue section). Each file is written
    beside the last one and renamed over it, so a kill mid-write keeps the previous complete copy."""
    summary["saved_after"] = stage
    (out / "summary.json.tmp").write_text(json.dumps(summary, indent=1, default=str))
    os.replace(out / "summary.json.tmp", out / "summary.json")
    if store is not None:
        from mkb.events import pack_dataset
        pack_dataset(store, out / "events.tar.gz", arcname=name)


def job_of(key: str) -> str:
    """The job a round's key names: "baseline/28/cute#s1" (serial round 2) and "...#r0" (queue round 1) are both
    "baseline/28/cute"."""
    return key.split("#")[0]


def serial_jobs(all_cases: list[Case], *, jobs: str = "all", rounds: int = 1,
                only: list[int] | None = None) -> list[tuple[str, Case]]:
    """The serial pass's (key, case) in grading order: every job once per round, round after round (so a drift lands on
    every job alike); the first round keeps the bare key, which `--serial-from` and the per-grading comparison read.
    `only` picks some of the rounds (one step of an interleaved plan), their keys as in the whole pass."""
    picked = [c for c in all_cases if jobs == "all" or c.expected is None]
    return [(c.key if r == 0 else f"{c.key}#s{r}", c) for r in range(rounds) if only is None or r in only for c in picked]


def merged_replays(before: dict | None, step: dict) -> dict:
    """The quiet rule's replay over every queue step of a run (one per step of an interleaved plan): counts added, the
    lists of broken rules joined, so one figure still says whether any timing phase shared the device."""
    if not before:
        return step
    return {k: (before.get(k) or 0) + v if isinstance(v, int) else [*(before.get(k) or []), *v] for k, v in step.items()}


def pass_plan(*, serial_rounds: int, queue_rounds: int, order: str = "passes") -> list[tuple[str, list[int]]]:
    """The order the serial and queue rounds run in, as steps of (side, rounds), a side's rounds in one step sharing one
    pool or queue. `passes`: every serial round, then every queue round (one open each). `abba`: the rounds alternate
    in blocks serial, queue, queue, serial, so a drift of the machine that is linear in time lands on both sides alike
    (h200-grader-2-20-queue ran the serial pass first and the queue after it; its effect, -0.37%, and the runs before it,
    -0.18% .. +0.27%, change sign run to run, as a drift between the two passes would). Needs as many rounds each way."""
    if order == "passes":
        return [(side, list(range(n))) for side, n in (("serial", serial_rounds), ("queue", queue_rounds)) if n > 0]
    if order != "abba":
        raise SystemExit(f"--order {order!r}: unknown; hint: passes or abba")
    if serial_rounds != queue_rounds or serial_rounds < 1:
        raise SystemExit(f"--order abba needs as many serial as queue rounds, at least one each (got {serial_rounds} and "
                         f"{queue_rounds}); hint: --serial-rounds 2 --queue-rounds 2 with --sections serial,queue")
    seq = [step for r in range(serial_rounds) for step in ((("serial", r), ("queue", r)) if r % 2 == 0 else
                                                            (("queue", r), ("serial", r)))]
    plan: list[tuple[str, list[int]]] = []
    for side, r in seq:  # neighbours of one side run as one step: S0 Q0 Q1 S1 S2 Q2 -> S[0] Q[0,1] S[1,2] Q[2]
        if plan and plan[-1][0] == side:
            plan[-1][1].append(r)
        else:
            plan.append((side, [r]))
    return plan


def as_expected(c: Case, v: dict) -> bool:
    """The verdict is what the job must get: a pass for a baseline or control, an expected reason for a red-team form."""
    return v["passed"] if c.expected is None else (not v["passed"] and v["reason"] in c.expected)


def _all_or_none(flags) -> bool | None:
    """all(flags), or None when there is none: an empty pass proves nothing either way."""
    seen = list(flags)
    return all(seen) if seen else None


def conclude(summary: dict, all_cases: list[Case], *, log=None) -> None:
    """The comparison and the result from what the sections have recorded so far (called after each one)."""
    summary["compare"] = []
    by_key = {c.key: c for c in all_cases}
    for qkey, qv in summary["queue"].items():
        c = by_key[job_of(qkey)]
        s = summary["serial"].get(c.key)
        if s is None:
            continue
        same = s["passed"] == qv["passed"] and s["reason"] == qv["reason"]
        rel = None
        if s["passed"] and qv["passed"] and s["candidate_median_us"] and qv["candidate_median_us"]:
            rel = abs(qv["candidate_median_us"] - s["candidate_median_us"]) / s["candidate_median_us"]
        expected_ok = as_expected(c, qv)
        summary["compare"].append({"key": qkey, "same_verdict": same, "median_rel_diff": rel,
                                   "median_within_tol": rel is None or rel <= MEDIAN_TOL, "expected_ok": expected_ok,
                                   "serial": s["reason"] or "passed", "queue": qv["reason"] or "passed"})
    cmp = summary["compare"]
    # the queue's own verdicts judged against what each job must get, whether or not the serial pass graded the job
    # (`--serial-jobs passing` with `--queue-jobs all`, or `--serial-from` such a pass): a hole never hides behind a
    # missing comparison
    queued = [(qkey, by_key[job_of(qkey)], qv) for qkey, qv in summary["queue"].items() if job_of(qkey) in by_key]
    summary["result"] = {
        "gradings_per_pass": len(all_cases), "serial_gradings": len(summary["serial"]), "queue_gradings": len(summary["queue"]),
        "compared": len(cmp),
        "same_verdict": sum(r["same_verdict"] for r in cmp),
        "medians_compared": sum(r["median_rel_diff"] is not None for r in cmp),
        "medians_within_0_5pct": sum(r["median_rel_diff"] is not None and r["median_within_tol"] for r in cmp),
        # None, not True, while the queue pass has no such job (after the serial section, or with --queue-jobs passing)
        "redteam_all_rejected": _all_or_none(as_expected(c, qv) for _, c, qv in queued if c.expected is not None),
        "controls_and_baselines_pass": _all_or_none(as_expected(c, qv) for _, c, qv in queued if c.expected is None),
        "pair_one_eager": (len({p["eager_median_us"] for p in summary["pair"]}) == 1 and
                           [p["eager_cached"] for p in summary["pair"]][1:] == [True] * (len(summary["pair"]) - 1))
        if summary["pair"] else None,
    }
    # every serial grading of a red-team form, in every round (a form that slips through once is a hole)
    red = [(k, by_key[job_of(k)], v) for k, v in summary["serial"].items()
           if job_of(k) in by_key and by_key[job_of(k)].expected is not None]
    summary["result"]["redteam_serial_rejected"] = sum(1 for _, c, v in red if as_expected(c, v))
    summary["result"]["redteam_serial_forms"] = len(red)
    summary["result"]["redteam_serial_all_rejected"] = (summary["result"]["redteam_serial_rejected"] == summary["result"]["redteam_serial_forms"]
                                                        if summary["result"]["redteam_serial_forms"] else None)
    must_pass = {c.key for c in all_cases if c.expected is None}
    summary["result"]["serial_must_pass_passed"] = _all_or_none(v["passed"] for k, v in summary["serial"].items()
                                                                if job_of(k) in must_pass)
    # how every grading's worker was confined: one line each, expected to be one and the same line
    summary["result"]["guards"] = dict(Counter(r.get("guards") or "not recorded"
                                               for r in [*summary["serial"].values(), *summary["queue"].values()]))
    # what the queue made ahead for its gradings (grader 2.17): per DSL, each state's count and the worker's reads
    from mkb.grader._precompile import tally_device_code

    made = tally_device_code((r["dsl"], r.get("device_code"), r.get("compile_s")) for r in summary["queue"].values() if r.get("dsl"))
    summary["result"]["device_code"] = {dsl: t.as_dict() for dsl, t in made.items()}
    summary["pooled"] = pooled(summary, must_pass)
    summary["result"]["medians_pooled_compared"] = sum(r["a_vs_b"] is not None for r in summary["pooled"])
    summary["result"]["medians_pooled_within_0_5pct"] = sum(r["within_tol"] for r in summary["pooled"])
    summary["queue_effect"] = queue_effect(summary)
    summary["result"]["queue_effect_within_0_5pct"] = summary["queue_effect"]["within_tol"] if summary["queue_effect"] else None
    for k, c, v in red:
        if log and not as_expected(c, v):
            log(f"HOLE   {k:55s} serial={v['reason'] or 'passed'} expected one of {c.expected}")
    for r in cmp:
        if log and not (r["same_verdict"] and r["median_within_tol"] and r["expected_ok"]):
            log(f"DIFF   {r['key']:55s} serial={r['serial']} queue={r['queue']} median_rel_diff={r['median_rel_diff']} "
                f"expected_ok={r['expected_ok']}")
    compared = {r["key"] for r in cmp}
    for qkey, c, qv in queued:
        if log and qkey not in compared and not as_expected(c, qv):
            log(f"HOLE   {qkey:55s} queue={qv['reason'] or 'passed'} expected "
                f"{'a pass' if c.expected is None else 'one of ' + str(c.expected)} (no serial grading to compare)")
    for r in summary["pooled"] if log else ():
        if r["a_vs_b"] is not None and (len(r["a_us"]) > 1 or len(r["b_us"]) > 1):
            se = f"{r['a_vs_b_se'] * 100:.2f}%" if r["a_vs_b_se"] is not None else "-"
            log(f"POOLED {r['key']:55s} serial {len(r['a_us'])} queue {len(r['b_us'])} gradings, means "
                f"{r['a_vs_b'] * 100:.2f}% apart (se {se}) {'within 0.5%' if r['within_tol'] else 'OUTSIDE 0.5%'}")
    e = summary["queue_effect"]
    if log and e:
        unknown = f"; not known to: {e['left_out_unknown']}" if e.get("left_out_unknown") else ""
        unknown += f"; missing a planned round: {e['left_out_unbalanced']}" if e.get("left_out_unbalanced") else ""
        log(f"EFFECT over {e['jobs']} jobs that only work on the device (left out, reading the host: {e['left_out_host'] or 'none'}{unknown}): "
            f"{_effect_text(e)}; one grading against one: serial-serial "
            f"median {'-' if e['same_arm_median'] is None else format(e['same_arm_median'] * 100, '.2f')}% "
            f"({e['same_arm_over_tol']} of {e['same_arm_pairs']} over 0.5%), "
            f"serial-queue median {e['cross_median'] * 100:.2f}% ({e['cross_over_tol']} of {e['cross_pairs']} over 0.5%)")
    if log:
        log("RESULT " + json.dumps(summary["result"]))


def made_text(v) -> str:
    """What the queue made ahead for one grading, for its log line: state, where the time went, the worker's reads."""
    st = v.stage("compile")
    d = st.figures.get("device_code") if st else None
    if not isinstance(d, dict):
        return ""
    times = " ".join(f"{k[:-2]} {d[k]:.1f}s" for k in ("waited_s", "sandbox_s", "build_s") if d.get(k) is not None)
    return (f" code={d.get('state')}" + (f" ({times})" if times else "") +
            (f" hits {d['hits']}" if d.get("hits") is not None else "") + (f" [{d['note'][:80]}]" if d.get("note") else ""))


def planned_rounds(plan: list | None) -> dict[str, int] | None:
    """Rounds per side of an interleaved plan (more than one step on a side), None for one pass each way (whose
    comparison takes whatever rounds ran, as before) or a summary written before plans were recorded."""
    if not plan:
        return None
    steps = [side for side, _ in plan]
    if steps.count("serial") < 2 and steps.count("queue") < 2:
        return None
    return {side: sum(len(rounds) for s, rounds in plan if s == side) for side in ("serial", "queue")}


def queue_effect(summary: dict) -> dict | None:
    """The queue's effect on the median over every job that only works on the device: per job its queue gradings' mean
    against its serial gradings' mean (signed), then the mean of those over jobs with its standard error, judged within
    0.5% when the mean +- 2 se lies inside +-0.5%. Beside it the one-against-one spreads: every serial grading against
    every other of its job, and every serial against every queue grading, as medians and counts over 0.5%.
    Why: a job's single gradings of 01, 25 or 72 repeat only to 0.2-0.95% (DESIGN, the repeat promise), so with two
    rounds a job's pooled means can be 0.5% apart with no queue effect at all; the queue would show as a shift shared by
    the jobs, which the mean over jobs reads to a fraction of that. Jobs with a grading that read the host are left
    out and named, and so are jobs with a passing grading whose `host_syncs` is unknown (nothing profiled, or a summary
    older than the figure: `--rejudge` with `--store` fills it in); None without a job graded both ways. Under an
    interleaved plan (`--order abba`, the summary's `plan`) a job that lacks a planned round on either side is left out
    and named too (`left_out_unbalanced`): the design cancels a drift only over whole S Q Q S blocks, and a budget that
    cut the last round (h200-grader-2-20-queue-abba: 10 of its 20 jobs) leaves those jobs read against one side's
    earlier rounds alone."""
    rows: dict[str, dict[str, list]] = {}
    host: set[str] = set()
    unknown: set[str] = set()
    for side in ("serial", "queue"):
        for k, v in summary[side].items():
            job = job_of(k)
            if v["passed"] and v["candidate_median_us"]:
                rows.setdefault(job, {"serial": [], "queue": []})[side].append(float(v["candidate_median_us"]))
                if v.get("host_syncs") is None:  # nothing profiled, or a summary older than the figure: not device-only
                    unknown.add(job)
            if (v.get("host_syncs") or 0) > 0:
                host.add(job)
    unknown -= host
    planned = planned_rounds(summary.get("plan"))
    unbalanced = {j for j, r in rows.items() if planned and (len(r["serial"]) < planned["serial"] or
                                                             len(r["queue"]) < planned["queue"])} - host - unknown
    jobs = {j: r for j, r in rows.items()
            if r["serial"] and r["queue"] and j not in host and j not in unknown and j not in unbalanced}
    if not jobs:
        return None
    diffs = [statistics.fmean(r["queue"]) / statistics.fmean(r["serial"]) - 1 for r in jobs.values()]
    same = [abs(b / a - 1) for r in jobs.values() for i, a in enumerate(r["serial"]) for b in r["serial"][i + 1:]]
    cross = [abs(b / a - 1) for r in jobs.values() for a in r["serial"] for b in r["queue"]]
    return {"jobs": len(jobs), "left_out_host": sorted(host & set(rows)), "left_out_unknown": sorted(unknown & set(rows)),
            "left_out_unbalanced": sorted(unbalanced),
            "per_job": dict(zip(jobs, diffs)), **_over_jobs(diffs),
            "same_arm_pairs": len(same), "same_arm_median": statistics.median(same) if same else None,
            "same_arm_over_tol": sum(x > MEDIAN_TOL for x in same),
            "cross_pairs": len(cross), "cross_median": statistics.median(cross),
            "cross_over_tol": sum(x > MEDIAN_TOL for x in cross)}


def pooled(summary: dict, must_pass: set[str]) -> list[dict]:
    """Per job that must pass, the mean of its queue gradings against the mean of its serial ones (gpu_checks_ab's
    `compare`: serial as arm A, queue as arm B). Why beside the per-grading comparison: a single grading of 01, 25 or 72
    repeats with an sd of 0.2-0.95% (DESIGN, the repeat promise), so one serial against one queue grading differs by
    more than 0.5% about one time in three with no effect of the queue at all; several rounds of each read the queue's
    effect against what the grader repeats to."""
    from gpu_checks_ab import compare

    rows: dict[str, dict[str, dict]] = {}
    for arm, side in (("A", "serial"), ("B", "queue")):
        for k, v in summary[side].items():
            base = job_of(k)
            if base in must_pass:
                tags = rows.setdefault(base, {})
                tags[f"{arm}{sum(t[0] == arm for t in tags) + 1}"] = {
                    "passed": v["passed"], "median_us": v["candidate_median_us"], "timed_calls": None, "n_timed_planned": None}
    return [r for r in compare(rows) if r["a_us"] and r["b_us"]]


def host_syncs_by_id(store: Path) -> dict[str, int | None]:
    """Every grading's `host_syncs` in a dataset, by evaluation id, read from its integrity events; a store that cannot
    be read is one line naming it (SystemExit)."""
    from mkb.events import read

    try:
        frame = read("integrity", str(store)).select("evaluation_id", "details")
    except Exception as exc:  # noqa: BLE001 - one line naming the store, not a traceback
        raise SystemExit(f"--store {store}: its integrity events cannot be read ({type(exc).__name__}: {exc}); hint: pass "
                         "the dataset folder the summary's run wrote (events/<name>)") from None
    by_id: dict[str, int | None] = {}
    for eid, details in frame.iter_rows():
        by_id[eid] = host_syncs(json.loads(details) if isinstance(details, str) else (details or {}))
    return by_id


def with_host_syncs(summary: dict, store: Path) -> int:
    """Fill `host_syncs` into the verdict rows of a summary written before the figure was (gpu_queue_run before
    2026-12-02 evening) from the dataset's own integrity events, by evaluation id; returns how many rows it filled."""
    by_id = host_syncs_by_id(store)
    filled = 0
    wanted = 0
    for side in ("serial", "queue"):
        for v in summary[side].values():
            if v.get("host_syncs") is None:
                wanted += 1
                if v.get("evaluation_id") in by_id:
                    v["host_syncs"] = by_id[v["evaluation_id"]]
                    filled += 1
    if wanted and not filled:
        raise SystemExit(f"--store {store}: none of the summary's {wanted} verdicts without host_syncs has integrity events "
                         "there; hint: pass the dataset folder the summary's own run wrote (events/<name>)")
    return filled


def rejudge(path: Path, store: Path | None) -> dict:
    """A recorded run's comparison computed again by this script (no GPU): what a later reading, such as the queue's
    effect over jobs, says about a committed dataset, from its summary and events alone."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--rejudge {path}: not a readable summary.json ({exc}); hint: pass a run's logs/summary.json")
    if not isinstance(summary, dict) or not {"serial", "queue"} <= set(summary):
        raise SystemExit(f"--rejudge {path}: it holds no serial and queue verdicts; hint: pass a gpu_queue_run summary.json")
    summary.setdefault("pair", [])
    if store is not None:
        log(f"host_syncs filled from {store}'s integrity events for {with_host_syncs(summary, store)} verdicts")
    missing = [k for side in ("serial", "queue") for k, v in summary[side].items()
               if v.get("passed") and v.get("host_syncs") is None]
    if missing:
        raise SystemExit(f"--rejudge {path}: {len(missing)} passing verdicts have no host_syncs (e.g. {missing[0]}), so the "
                         "calls that read the host cannot be told apart; hint: add --store with the run's dataset folder")
    conclude(summary, cases(Path("/tmp/mkb-queue-redteam")), log=log)
    return summary


def pooled_effect(summaries: list[dict]) -> dict | None:
    """The queue's effect over several recorded runs (each judged on its own machine against its own serial pass): per
    job the mean of its runs' effects, then their mean over jobs with its se, judged as `queue_effect` is. A job's runs
    are averaged before the mean over jobs, so a job that repeats in every run counts once, not once per run."""
    per_job: dict[str, list[float]] = {}
    for s in summaries:
        for job, d in ((s.get("queue_effect") or {}).get("per_job") or {}).items():
            per_job.setdefault(job, []).append(d)
    diffs = [statistics.fmean(v) for v in per_job.values()]
    if not diffs:
        return None
    return {"runs": len(summaries), "jobs": len(diffs), **_over_jobs(diffs)}


def _over_jobs(diffs: list[float]) -> dict:
    """The mean of the jobs' effects, its standard error, and the judgement (within 0.5% when mean +- 2 se is)."""
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("inf")
    return {"mean": mean, "se": se, "within_tol": abs(mean) + 2 * se <= MEDIAN_TOL}


def _effect_text(e: dict) -> str:
    """An effect's figures as the EFFECT and POOLED EFFECT lines print them."""
    return (f"queue against serial {e['mean'] * 100:+.2f}% (se {e['se'] * 100:.2f}%; +-2 se "
            f"{(e['mean'] - 2 * e['se']) * 100:+.2f}% .. {(e['mean'] + 2 * e['se']) * 100:+.2f}%) "
            f"{'within 0.5%' if e['within_tol'] else 'NOT shown within 0.5%'}")


def _environment(versions: dict) -> dict:
    """What must match between two passes compared: packages, grader version, timing policy, commit, the GPU (uuid, name,
    driver); not nvidia-smi's clocks, temperature and power, which change call to call."""
    smi = str(versions.get("nvidia-smi") or "").split(",")
    return {k: v for k, v in versions.items() if k != "nvidia-smi"} | {"gpu": [x.strip() for x in smi[:2]]}


def load_serial(path: Path, versions: dict) -> dict:
    """The serial verdicts of an earlier call's summary, refused (naming the file) if it ran other versions."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--serial-from {path}: cannot read it ({exc}); hint: pass the summary.json an earlier call wrote") from exc
    if not earlier.get("serial"):
        raise SystemExit(f"--serial-from {path}: it holds no serial pass; hint: run that call with --sections serial")
    there, here = _environment(earlier.get("versions") or {}), _environment(versions)
    if there != here:
        differ = {k: (there.get(k), here.get(k)) for k in sorted(set(there) | set(here)) if there.get(k) != here.get(k)}
        raise SystemExit(f"--serial-from {path}: it ran another environment (there, here: {differ}); hint: compare passes "
                         "of one machine, one environment and the same code (mkb_source_sha256)")
    return earlier["serial"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-gpu-out"))
    ap.add_argument("--name", default="h200-grading-queue")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no new section, and no new serial grading, "
                    "after this many seconds")
    ap.add_argument("--sections", default="serial,queue,bench")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--read-guard", choices=("off", "landlock"), default=None, help="GraderConfig.read_guard for every "
                    "grading (recorded as a config override where it is not the shipped 'landlock', grader 2.20)")
    ap.add_argument("--queue-jobs", choices=("all", "passing"), default="all",
                    help="the queue pass grades every job, or only those that must pass (baselines and controls)")
    ap.add_argument("--only", default="", help="grade only the jobs whose key (baseline/28/cute, redteam/kill_self/tirx) this "
                    "regular expression finds, in every section: a call that grades what an earlier call's budget left")
    ap.add_argument("--queue-rounds", type=int, default=1, help="times each queue job is pushed (medians compared per round)")
    ap.add_argument("--serial-jobs", choices=("all", "passing"), default="all",
                    help="the serial pass grades every job, or only those that must pass (with --queue-jobs passing, "
                    "serial and queue fit one device call on one GPU)")
    ap.add_argument("--serial-rounds", type=int, default=1, help="times the serial pass grades each job (the pooled "
                    "comparison reads the mean of each side's gradings)")
    ap.add_argument("--order", choices=("passes", "abba"), default="passes", help="passes: every serial round, then every "
                    "queue round; abba: serial and queue rounds alternate in blocks S Q Q S, so the machine's drift lands "
                    "on both sides (needs --serial-rounds equal to --queue-rounds)")
    ap.add_argument("--serial-from", default="", help="an earlier call's summary.json: its serial pass is the reference, so serial and "
                    "queue fit two calls of the device's 600 s limit; refused unless it ran on the same GPU (uuid), grader "
                    "version, timing policy, packages and commit (where the copy has one)")
    ap.add_argument("--rejudge", nargs="*", default=[], help="recorded runs' summary.json files: compute each one's "
                    "comparison again and print it (no GPU); with several, the queue's effect pooled over them too")
    ap.add_argument("--store", nargs="*", default=[], help="with --rejudge: each run's dataset folder (events/<name>), "
                    "in the same order, where its verdicts' integrity events are read from")
    a = ap.parse_args(argv)
    if a.rejudge:
        if a.store and len(a.store) != len(a.rejudge):
            ap.error(f"--store names {len(a.store)} folders for {len(a.rejudge)} summaries; hint: one per summary, in order")
        runs = [rejudge(Path(p), Path(st) if a.store else None) for p, st in zip(a.rejudge, a.store or a.rejudge)]
        if len(runs) > 1:
            e = pooled_effect(runs)
            if e:
                graders = ", ".join(str((r.get("versions") or {}).get("mkb_grader")) for r in runs)
                log(f"POOLED EFFECT over {len(runs)} runs (graders {graders}), {e['jobs']} jobs (each job's runs averaged first): "
                    f"{_effect_text(e)}")
        return 0
    if a.serial_rounds < 1 or a.queue_rounds < 1:
        ap.error("--serial-rounds and --queue-rounds are at least 1")
    t0 = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path("/tmp/mkb-queue-events") / a.name
    store.mkdir(parents=True, exist_ok=True)
    sections = set(a.sections.split(","))

    from gpu_grader_run import preflight, versions

    from mkb.grader import GradeJob, GraderConfig, GradingQueue, WorkerPool, grade

    if a.device.startswith("cuda") and sections & {"serial", "queue", "bench"}:
        preflight()  # every registered DSL: the jobs are both DSLs' baselines and red-team forms

    summary: dict = {"versions": versions(), "serial": {}, "queue": {}, "pair": [], "compare": [], "errors": [], "skipped": []}
    log("versions", json.dumps(summary["versions"]))
    try:
        from mkb.events import EventWriter

        writer = EventWriter(str(store), flush_every=500)
    except ImportError as exc:  # no Parquet writer here: JSON lines, converted where pyarrow is
        from mkb.grader._jsonl import JsonlWriter

        writer = JsonlWriter(out / "events.jsonl")
        log(f"events as JSON lines ({exc})")
    all_cases = cases(Path("/tmp/mkb-queue-redteam"))
    if a.only:
        all_cases = [c for c in all_cases if re.search(a.only, c.key)]
        if not all_cases:
            raise SystemExit(f"--only {a.only!r} finds no job; hint: keys look like baseline/28/cute or redteam/kill_self/tirx")
    log(f"{len(all_cases)} gradings per pass: {sum(c.key.startswith('baseline') for c in all_cases)} baselines, "
        f"{sum('control' in c.key for c in all_cases)} controls, {sum(c.expected is not None for c in all_cases)} red-team forms")
    cfg = GraderConfig() if a.read_guard is None else GraderConfig(read_guard=a.read_guard)
    if a.serial_from and "serial" in sections:
        raise SystemExit("--serial-from replaces the serial section; hint: drop `serial` from --sections")
    if a.serial_from:
        summary["serial"], summary["serial_from"] = load_serial(Path(a.serial_from), summary["versions"]), a.serial_from
        log(f"serial pass from {a.serial_from}: {len(summary['serial'])} verdicts")

    def left() -> float:
        return a.budget_s - (time.monotonic() - t0)

    def save(stage: str) -> None:
        writer.flush()
        conclude(summary, all_cases)
        summary["elapsed_s"] = time.monotonic() - t0
        write_outputs(out, summary, stage=stage, store=None if (out / "events.jsonl").exists() else store, name=a.name)

    # ---- 1. one at a time, no queue ----
    def serial_step(rounds: list[int]) -> None:
        t = time.monotonic()
        sjobs = serial_jobs(all_cases, jobs=a.serial_jobs, rounds=a.serial_rounds, only=rounds)
        with WorkerPool(device=a.device, depth=2) as pool:
            for key, c in sjobs:
                if left() <= 0:
                    summary["skipped"].append(f"serial {key}")
                    continue
                try:
                    v = grade(c.problem, c.dsl, c.path, writer=writer, config=cfg, pool=pool, scope="submission")
                except Exception:  # noqa: BLE001 - recorded, the run goes on
                    summary["errors"].append({"what": f"serial {key}", "traceback": traceback.format_exc()})
                    continue
                summary["serial"][key] = row(c, v)
                log(f"SERIAL {key:55s} -> {v.reason or 'passed'} median={v.candidate_median_us}")
        summary["serial_s"] = summary.get("serial_s", 0.0) + time.monotonic() - t
        save("serial")
        log(f"SAVED serial: {summary['result']['redteam_serial_rejected']} of {summary['result']['redteam_serial_forms']} "
            f"red-team gradings rejected with an expected reason, {summary['serial_s']:.0f} s")

    # ---- 2. the queue: two producers at once, then (on its last step) a pair batch ----
    def queue_step(rounds: list[int], *, pair_batch: bool) -> None:
        if left() <= 0:
            summary["skipped"].append("queue" if a.queue_rounds == 1 else f"queue rounds {rounds}")
            log("SKIP queue: out of time budget")
            return
        t = time.monotonic()
        futs: dict[str, concurrent.futures.Future] = {}  # every job's queue future, as each producer submits it
        lock = threading.Lock()
        pushed = threading.Event()  # the asyncio producer has submitted all its jobs
        from mkb.grader._pool import quiet_for, replay_phases

        with GradingQueue(device=a.device, writer=writer, config=cfg, depth=3, low_water=1) as q:
            q.pool.wait_warm(cfg.start_limit_s)
            t_push = time.monotonic()

            qcases = [c for c in all_cases if a.queue_jobs == "all" or c.expected is None]
            qjobs = [(c.key if a.queue_rounds == 1 else f"{c.key}#r{r}", c) for r in rounds for c in qcases]

            def thread_producer() -> None:
                for key, c in qjobs[0::2]:
                    f = q.submit(GradeJob(c.problem, c.dsl, c.path, experiment="producer-thread"))
                    f.add_done_callback(lambda f, key=key: done(key, f))
                    with lock:
                        futs[key] = f

            async def asyncio_producer() -> None:
                subs: dict[str, concurrent.futures.Future] = {}
                try:
                    for key, c in qjobs[1::2]:
                        subs[key] = q.submit(GradeJob(c.problem, c.dsl, c.path, experiment="producer-asyncio"))
                        subs[key].add_done_callback(lambda f, key=key: done(key, f))
                finally:  # whatever it managed to submit is waited for, and the main thread never waits on it forever
                    with lock:
                        futs.update(subs)
                    pushed.set()
                mine = [asyncio.wrap_future(f) for f in subs.values()]
                await asyncio.gather(*mine, return_exceptions=True)  # an awaiting producer, as an agent's task is

            def done(key: str, f) -> None:  # each verdict logged as it lands, so a killed run shows how far it got
                if f.cancelled():
                    log(f"QDONE  {key:58s} -> cancelled (budget)")
                    return
                try:
                    v = f.result()
                except Exception as exc:  # noqa: BLE001 - recorded below, with its traceback
                    log(f"QDONE  {key:58s} -> error {type(exc).__name__}")
                    return
                log(f"QDONE  {key:58s} -> {v.reason or 'passed'} median={v.candidate_median_us} wait={v.queue_wait_s:.1f}s"
                    f"{made_text(v)}")

            def producing(run) -> None:  # a producer that fails is recorded, never an unhandled thread exception
                try:
                    run()
                except Exception:  # noqa: BLE001
                    summary["errors"].append({"what": "queue producer", "traceback": traceback.format_exc()})
                    log(f"ERROR  a queue producer failed: {traceback.format_exc().strip().splitlines()[-1]}")

            th = threading.Thread(target=producing, args=(thread_producer,))
            aio = threading.Thread(target=producing, args=(lambda: asyncio.run(asyncio_producer()),))
            th.start()
            aio.start()
            th.join()
            pushed.wait()
            # past the budget the jobs not yet started are cancelled (the one running finishes, never cut short), so
            # the call's limit never kills the section before it writes what it has
            _, late = concurrent.futures.wait(list(futs.values()), timeout=max(0.0, left()))
            cancelled = sum(f.cancel() for f in late)
            if cancelled:
                log(f"SKIP queue: budget spent, {cancelled} queue gradings cancelled before they started")
            aio.join()
            for key, c in qjobs:
                f = futs.get(key)
                if f is None:  # its producer failed before submitting it (the thread's traceback is in the log)
                    summary["errors"].append({"what": f"queue {key}", "traceback": "never submitted: its producer failed first"})
                    continue
                if f.cancelled():
                    summary["skipped"].append(f"queue {key}")
                    continue
                try:
                    v = f.result()
                except Exception:  # noqa: BLE001
                    summary["errors"].append({"what": f"queue {key}", "traceback": traceback.format_exc()})
                    continue
                summary["queue"][key] = row(c, v) | {"key": key}
                log(f"QUEUE  {key:58s} -> {v.reason or 'passed'} median={v.candidate_median_us} wait={v.queue_wait_s:.1f}s")
            summary["queue_push_to_last_s"] = time.monotonic() - t_push
            pair_cases = [c for c in all_cases if c.key.startswith("baseline/28/")] if pair_batch else []
            if pair_cases and left() <= 0:
                summary["skipped"].append("pair")
            elif pair_cases:
                pair = q.submit_batch([GradeJob(c.problem, c.dsl, c.path, experiment="pair", scope="pair") for c in pair_cases])
                for c, f in zip(pair_cases, pair):
                    v = f.result()
                    summary["pair"].append(row(c, v) | {"eager_cached": v.stage("timing").figures.get("eager_cached")
                                                        if v.stage("timing") else None})
                    log(f"PAIR   {c.key:55s} -> {v.reason or 'passed'} median={v.candidate_median_us} eager={v.eager_median_us}")
            if getattr(q, "precompiler", None) is not None:  # each fork server's import seconds and threads, and the pauses
                figs = q.precompiler.figures()
                summary["precompile_servers"] = figs.servers
                summary["precompile_pauses"] = {"pauses": figs.pauses, "paused_s": figs.paused_s}
                log("SERVERS " + json.dumps(figs.as_dict()))
        # the device's coordinator replayed over the section: every timing phase had the device to itself
        replayed = replay_phases(list(quiet_for(a.device).history), since=t)
        summary["queue_quiet_replayed"] = merged_replays(summary.get("queue_quiet_replayed"), dataclasses.asdict(replayed))
        log(f"QUIET  replayed: {replayed.timing_phases} timing phases, {len(replayed.beside_timing)} beside another's, "
            f"{len(replayed.go_beside_timing)} spares' warm-ups or prefetches started beside one, "
            f"{replayed.warm_ups_beside_timing} entered while a warm-up ran on (its wait ran out), "
            f"{replayed.beside_teardown} while a finished worker was still torn down")
        summary["queue_s"] = summary.get("queue_s", 0.0) + time.monotonic() - t
        save("queue")

    plan = pass_plan(serial_rounds=a.serial_rounds if "serial" in sections else 0,
                     queue_rounds=a.queue_rounds if "queue" in sections else 0, order=a.order)
    summary["plan"] = [[side, rounds] for side, rounds in plan]
    if a.order != "passes":
        log("PLAN   " + " ".join(f"{side}{rounds}" for side, rounds in plan))
    last_queue = max((i for i, (side, _) in enumerate(plan) if side == "queue"), default=None)
    for i, (side, rounds) in enumerate(plan):
        if side == "serial":
            serial_step(rounds)
        else:
            queue_step(rounds, pair_batch=i == last_queue)

    # ---- 3. compare ----
    conclude(summary, all_cases, log=log)

    # ---- 4. the benchmark figures through the queue ----
    if "bench" in sections:
        if left() <= 0:
            summary["skipped"].append("bench")
            log("SKIP bench: out of time budget")
        else:
            import grader_bench as gb

            bench: dict = {}
            try:
                bench["overhead"] = gb.overhead(problem=28, repeats=5, config=cfg, writer=writer, device=a.device, log=log)
                if left() > 0:
                    bench["throughput"] = gb.throughput(rounds=2, config=cfg, writer=writer, device=a.device, log=log)
                else:
                    summary["skipped"].append("bench throughput")
            except Exception:  # noqa: BLE001
                summary["errors"].append({"what": "bench", "traceback": traceback.format_exc()})
            (out / "bench.json").write_text(json.dumps(bench, indent=1, default=str))
            summary["figures"] = gb.summary(bench)
            for line in summary["figures"].splitlines():
                log(line)

    save("end")
    writer.close()
    log(f"done in {summary['elapsed_s']:.0f} s; errors {len(summary['errors'])}; skipped {summary['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
