"""The recorded H200 run for issue #9's last "done when": every baseline still passes with its median unchanged
(within 0.5%) by grader 2.x's integrity rules.

Grader 2.x's rules read untimed calls (the profiled calls' limits, the verification draws' write check) or act
only on a side that cannot reach a threshold (early stopping), so by construction no timed window changes. This
run measures it: on one warm pool, every discovered baseline is graded under the grader as it ships (A) and under
a configuration without what 2.x added around the timed loop (B: no early-stop bookkeeping between calls, no
profiled calls planned inside the loop; the content-repeat probe stays, it predates 2.0), A then B per baseline;
then, while `--budget-s` lasts, a second pass grades each B then A (ABBA: the second grading of a kernel in a pool
falls once on each arm), so that each arm's grading-to-grading spread is measured beside the A-vs-B difference
(the mean of the B gradings against the mean of the A ones). The first recorded run (`events/h200-checks-ab`,
one pass) found B slower for every short kernel, which one A and one B per kernel cannot tell from an order effect.

    export PYTHONPATH=/tmp/mkb-site/nvidia_cutlass_dsl/dsl_packages:/tmp/mkb-site:$PWD CUDA_PATH=/usr/local/cuda \
           CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
    python3 scripts/gpu_checks_ab.py --out $OUT --name h200-checks-ab 2>&1 | tee $OUT/log

$OUT gets: log, summary.json (every verdict's figures, the per-baseline comparison), events.tar.gz (the store).
About 3 s per grading: 32 gradings for 16 baselines per pass, two passes: about 3.5 minutes (--budget-s 240).

Timing policy v4 (grader 2.4, the quiet SM hold) is validated by the same ABBA on the short baselines, read against
the v3 run's within-arm spread (`events/h200-checks-ab-2`): `--problems` keeps the run under 300 s (29 and 53, the
millisecond kernels, repeated within 0.01-0.24% under v3 and are graded by the red-team re-run), `--against` prints
each baseline's A1-vs-A2 and B1-vs-B2 beside the earlier run's:

    python3 scripts/gpu_sm_hold_check.py --out $OUT 2>&1 | tee $OUT/sm_hold.log     # the hold itself, ~10 s
    timeout 280 python3 scripts/gpu_checks_ab.py --out $OUT --name h200-checks-ab-quiet --problems 1,23,25,28,49,72 \
        --budget-s 210 --against events/h200-checks-ab-2/logs/summary.json 2>&1 | tee $OUT/log

`--report NEW.json --against OLD.json` prints that comparison again from two summaries, without a GPU.
What to check: `SM HOLD ok` (264 x 1024 on an H200, nothing allocated, side-stream work held back); every grading
passed with 100 calls; the verdicts' timing events name policy `.../sm-quiet-hold-1ms/.../v4`; 25 cute near
20.6 us and 28 cute near 81.9 us (the quiet rows of `events/h200-timing-levels`), not 21.1-21.6 and 82.3-83.4; and
the `SPREAD` lines: the short kernels' within-arm spreads (25, 28: 0.45-2.33% under v3) smaller, the pooled median
and the count within 0.5% no worse than v3's. 01 is expected to keep its per-process level (0.5-0.6%).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

MEDIAN_TOL = 0.005


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def rel(a: float | None, b: float | None) -> float | None:
    """|a - b| / b, or None when either side has no median."""
    return abs(a - b) / b if a and b else None


def _mean(xs: list[dict]) -> float:
    return sum(x["median_us"] for x in xs) / len(xs)


def _tag_order(tag: str) -> int:
    return int(tag[1:] or 1)


def _arm_sd(xs: list[float]) -> float | None:
    """The sample sd of one arm's medians, relative to their mean (None with fewer than two)."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 / m


def tags(rounds: int, *, first: str = "A") -> list[tuple[str, str]]:
    """The order of the passes: (A1, B1), (B2, A2), (A3, B3), (B4, A4), ... - each round is one ABBA, so a drift or an
    order effect lands on both arms alike however many rounds run. `first="B"`: (B1, A1), (A2, B2), ... (the `eager`
    arm goes first, so that the shipped arm's first grading finds the eager timing cached, as every later one does)."""
    out = []
    for k in range(1, 2 * rounds + 1):
        a, b = f"A{k}", f"B{k}"
        out.append((a, b) if (k % 2) == (first == "A") else (b, a))
    return out


def compare(rows: dict[str, dict[str, dict]]) -> list[dict]:
    """Per baseline: the mean of its B gradings against the mean of its A gradings, and each arm's own spread (its
    second grading against its first; with more rounds, the sd of the arm's medians and the standard error of the
    B-vs-A difference from the pooled within-arm sd, so a 0.5% claim is read against what the grader repeats to).
    Tags: A1, B1 (or B, the first run's name), then B2, A2, ... (ABBA rounds). Every grading it has must have passed."""
    out = []
    for key, r in rows.items():
        r = {("B1" if k == "B" else k): v for k, v in r.items()}
        a = [r[k] for k in sorted((k for k in r if k[0] == "A"), key=_tag_order)]
        b = [r[k] for k in sorted((k for k in r if k[0] == "B"), key=_tag_order)]
        passed = bool(a) and bool(b) and all(x["passed"] and x["median_us"] for x in a + b)
        ab = rel(_mean(b), _mean(a)) if passed else None
        aa = rel(a[1]["median_us"], a[0]["median_us"]) if passed and len(a) >= 2 else None
        bb = rel(b[1]["median_us"], b[0]["median_us"]) if passed and len(b) >= 2 else None
        sd_a = _arm_sd([x["median_us"] for x in a]) if passed else None
        sd_b = _arm_sd([x["median_us"] for x in b]) if passed else None
        se = None
        if sd_a is not None and sd_b is not None:
            pooled = (((len(a) - 1) * sd_a**2 + (len(b) - 1) * sd_b**2) / (len(a) + len(b) - 2)) ** 0.5
            se = pooled * (1 / len(a) + 1 / len(b)) ** 0.5
        out.append({"key": key, "all_passed": passed, "a_us": [x["median_us"] for x in a], "b_us": [x["median_us"] for x in b],
                    "a_vs_b": ab, "a1_vs_a2": aa, "b1_vs_b2": bb, "sd_a": sd_a, "sd_b": sd_b, "a_vs_b_se": se,
                    "within_tol": ab is not None and ab <= MEDIAN_TOL,
                    "full_calls": all(x["timed_calls"] == x["n_timed_planned"] for x in a)})
    return out


def _within_spreads(cmp: list[dict]) -> dict[str, list[float]]:
    """Per baseline key, the spreads between two gradings of one configuration (A1-vs-A2, B1-vs-B2) it has."""
    return {r["key"]: [x for x in (r.get("a1_vs_a2"), r.get("b1_vs_b2")) if x is not None] for r in cmp}


def against(new: list[dict], old: list[dict]) -> dict:
    """The within-arm spread (the grader's repeatability: two gradings of one kernel and configuration) of this run
    beside an earlier one's, per baseline both runs have, and pooled: the median spread and how many are within 0.5%.
    A timing-policy change that removes a per-process level (v3 -> v4) shows as smaller spreads on the short kernels."""
    n, o = _within_spreads(new), _within_spreads(old)
    rows = [{"key": k, "new": n[k], "old": o[k]} for k in n if k in o and n[k] and o[k]]

    def pooled(side: str) -> dict:
        xs = sorted(x for r in rows for x in r[side])
        med = (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2 if xs else None
        return {"pairs": len(xs), "median": med, "max": xs[-1] if xs else None,
                "within_0_5pct": sum(x <= MEDIAN_TOL for x in xs)}

    return {"rows": rows, "new": pooled("new"), "old": pooled("old")}


def read_summary(path: str, flag: str, *, needs: str = "compare") -> dict:
    """An earlier run's summary.json, or one line naming the file and the flag (never a traceback)."""
    try:
        s = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{flag} {path}: cannot read it ({exc}); hint: pass the summary.json a gpu_checks_ab run wrote") from exc
    if not isinstance(s, dict) or not s.get(needs):
        raise SystemExit(f"{flag} {path}: not a gpu_checks_ab summary (no `{needs}`); "
                         "hint: pass the summary.json a gpu_checks_ab run wrote")
    return s


def timing_policies(summaries: list[dict], paths: list[str] | None = None) -> list[str]:
    """Each run's timing policy: the one it recorded (since grader 2.9), else the one its dataset's timing events name
    (`policy_of_store`, from `paths`); a run whose policy is still unknown is refused, never pooled blindly."""
    policies = []
    for j, s in enumerate(summaries):
        policy = (s.get("versions") or {}).get("timing_policy")
        if not policy and paths is not None:
            policy = policy_of_store(paths[j], s)
        if not policy:
            raise SystemExit(f"--pool: run {j + 1} does not say which timing policy it ran under; {_POLICY_HINT}")
        policies.append(policy)
    return policies


def pool_runs(summaries: list[dict], *, policies: list[str] | None = None, paths: list[str] | None = None,
              across_graders: bool = False) -> list[dict]:
    """`compare` over the gradings of several runs of one arm pair (each run's rounds numbered after the previous run's),
    refused when they compared different arms or timing policies (`policies`, else `timing_policies(summaries, paths)`):
    one A/B read over more gradings than one call's budget holds.

    `across_graders` lets runs of different grader versions pool when their timing policy is the same one: the policy
    names everything that decides what a timed window holds, so a grader bump that left it unchanged (2.8 -> 2.9 added
    figures only) times the same; a different policy is still refused."""
    from mkb.grader import GraderConfig

    policies = policies if policies is not None else timing_policies(summaries, paths)

    def identity(s: dict, policy: str) -> str:
        # each arm as its overrides of the defaults (a field added later with its default is no difference), the
        # grader version where the run recorded it (since grader 2.9) unless across_graders, and the timing policy
        v = s.get("versions") or {}
        arms = {arm: GraderConfig.from_dict(c).overrides() for arm, c in (s.get("configs") or {}).items()}
        grader = None if across_graders else v.get("mkb_grader")
        return json.dumps({"arms": arms, "grader": grader, "policy": policy}, sort_keys=True)

    if len({identity(s, pol) for s, pol in zip(summaries, policies)}) > 1:
        raise SystemExit("--pool: the summaries compared different configurations, grader versions or timing policies; "
                         "hint: pool runs of one --b-arm under one grader (or, for graders of one timing policy, "
                         "add --across-graders)")
    merged: dict[str, dict[str, dict]] = {}
    for j, s in enumerate(summaries):
        for key, tags in s["rows"].items():
            for tag, v in tags.items():
                merged.setdefault(key, {})[f"{tag[0]}{1000 * j + _tag_order(tag)}"] = v
    return compare(merged)


_POLICY_HINT = ("hint: pool the summary.json that sits in its dataset's logs/ folder (the dataset's timing events name "
                "the policy), or a run that recorded timing_policy (grader >= 2.9)")


def policy_of_store(summary_path: str, summary: dict) -> str:
    """The one timing policy the timing events of the summary's gradings name, read from the dataset the summary sits
    in (`<dataset>/logs/summary.json`), for runs that did not record it in the summary."""
    from mkb.events import read

    store = Path(summary_path).resolve().parent.parent
    ids = {v["evaluation_id"] for tags in summary["rows"].values() for v in tags.values() if v.get("evaluation_id")}
    try:
        t = read("timing", str(store))
    except Exception as exc:  # noqa: BLE001 - any unreadable store is one line naming it
        raise SystemExit(f"--pool {summary_path}: no timing policy recorded and the store {store} cannot be read ({exc}); "
                         + _POLICY_HINT) from exc
    found = {p for e, p in zip(t["evaluation_id"].to_list(), t["timing_policy"].to_list()) if e in ids}
    if len(found) != 1 or not ids:
        raise SystemExit(f"--pool {summary_path}: no timing policy recorded, and its gradings' timing events in {store} "
                         f"name {sorted(map(str, found)) or 'none'}; {_POLICY_HINT}")
    return found.pop()


def host_reading(summary_path: str, summary: dict) -> dict[str, int | None]:
    """Per baseline, the most host syncs one profiled call of its gradings made (None: nothing profiled), read from the
    integrity events of the dataset the summary sits in (`<dataset>/logs/summary.json`); {} where that store cannot be
    read (every baseline is then unknown, so none enters the effect). Why: a call that reads device data on the host
    repeats only within its own wide spread (problem 23: 40-120% grading to grading), so an arm's effect on the medians
    is read over the calls that only work on the device, as gpu_queue_run's EFFECT is."""
    from gpu_queue_run import host_syncs_by_id

    store = Path(summary_path).resolve().parent.parent
    try:
        by_id = host_syncs_by_id(store)
    except SystemExit:  # no store beside the summary: nothing is known
        return {}
    out: dict[str, int | None] = {}
    for key, tags in summary["rows"].items():
        for v in tags.values():
            if v.get("evaluation_id") in by_id:
                out[key] = _most_syncs(out, key, by_id[v["evaluation_id"]])
    return out


def _most_syncs(seen: dict[str, int | None], key: str, n: int | None) -> int | None:
    """A baseline's host syncs with one more grading's: the most, or None once any grading's is unknown."""
    if key not in seen:
        return n
    return None if n is None or seen[key] is None else max(n, seen[key])


def arm_effect(cmp: list[dict], host: dict[str, int | None]) -> dict | None:
    """B against A over the baselines that only work on the device: per baseline its B gradings' mean against its A
    gradings' mean (signed), then their mean over baselines with its standard error, within 0.5% when mean +- 2 se is
    (gpu_queue_run's rule for the queue's effect). Baselines that read the host, whose host syncs are unknown, or with
    a grading that did not pass, are left out and named. None when no baseline is left."""
    from gpu_queue_run import _over_jobs

    keep = [r for r in cmp if r["all_passed"] and r["a_us"] and r["b_us"] and host.get(r["key"]) == 0]
    if not keep:
        return None
    diffs = [statistics.fmean(r["b_us"]) / statistics.fmean(r["a_us"]) - 1 for r in keep]
    return {"baselines": len(keep), "left_out_host": sorted(r["key"] for r in cmp if (host.get(r["key"]) or 0) > 0),
            "left_out_unknown": sorted(r["key"] for r in cmp if r["key"] in host and host[r["key"]] is None
                                       or r["key"] not in host),
            "left_out_failed": sorted(r["key"] for r in cmp if host.get(r["key"]) == 0
                                      and not (r["all_passed"] and r["a_us"] and r["b_us"])),
            **_over_jobs(diffs)}


def _print_pool(cmp: list[dict]) -> None:
    pct = lambda x: f"{x * 100:.2f}%" if x is not None else "-"  # noqa: E731
    for r in cmp:
        ma, mb = sum(r["a_us"]) / len(r["a_us"]), sum(r["b_us"]) / len(r["b_us"])
        diff = (mb - ma) / ma if r["all_passed"] else None
        log(f"POOL {r['key']:10s} A {len(r['a_us'])} B {len(r['b_us'])} gradings  (B-A)/A {'+' if diff and diff > 0 else ''}{pct(diff)}  se {pct(r['a_vs_b_se'])}  "
            f"sd A {pct(r['sd_a'])}  sd B {pct(r['sd_b'])}  {'within 0.5%' if r['within_tol'] else 'OUTSIDE 0.5%'}")


def _print_against(res: dict) -> None:
    pct = lambda xs: " ".join(f"{x * 100:5.2f}%" for x in xs)  # noqa: E731
    for r in res["rows"]:
        log(f"SPREAD {r['key']:10s} new {pct(r['new']):15s} old {pct(r['old'])}")
    for side in ("new", "old"):
        p = res[side]
        med = f"{p['median'] * 100:.2f}%" if p["median"] is not None else "-"
        log(f"SPREAD {side}: {p['pairs']} pairs, median {med}, {p['within_0_5pct']} within 0.5%")


@contextlib.contextmanager
def _eager_here(pool, *, on: bool):
    """With `on`, the grading sees an empty trusted cache, so its worker times the eager (and the reference) itself;
    what it measured is then added to the pool's own cache (entries already there are kept), so the shipped arm's
    gradings read it as they would in any session."""
    if not on:
        yield
        return
    from mkb.grader._session import TrustedCache

    saved, pool.trusted = pool.trusted, TrustedCache()
    try:
        yield
    finally:
        fresh, pool.trusted = pool.trusted, saved
        for key, figures in fresh.entries():
            saved.put(key, figures)


# arm B's GraderConfig overrides (`--b-arm`): rules = without grader 2.x's in-loop bookkeeping; eager = as shipped (its
# worker times the eager itself: `_eager_here`); make = timing policy v5's first pass (whole sets made twice), which
# v6's "allocate" replaced (events/h200-checks-ab-allocate ran it the other way round, under grader 2.7); floorhold = the
# side-work check's empty calls behind the shortest hold (150 us, not 1 ms): do their tails, the medians and the
# side_stream form's rejection stay while the grading saves ~0.05 s of GPU time (issue #10)?; clockwarm = grader 2.22's
# clock warm-up (at least 30 ms even when the clock reads boosted), against 2.23's one round: do the medians stay?
B_ARMS: dict[str, dict] = {"rules": {"early_stop": False, "n_profiled": 0}, "eager": {}, "make": {"set_first_pass": "make"},
                           "allocate": {"set_first_pass": "allocate"}, "floorhold": {"floor_hold_us": 150.0},
                           "clockwarm": {"clock_warm_min_s": 0.03}}

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-gpu-out"))
    ap.add_argument("--name", default="h200-checks-ab")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no new baseline after this many seconds")
    ap.add_argument("--b-arm", choices=tuple(B_ARMS), default="rules",
                    help="B is: rules = without grader 2.x's in-loop bookkeeping (issue #9); eager = the grader as shipped, "
                         "but the worker times the eager itself (an empty trusted cache for that grading), as a problem's "
                         "first grading in a session does; make = the grader with set_first_pass='make' (timing "
                         "policy v5: the timed sets made twice); allocate = set_first_pass='allocate', the default since "
                         "grader 2.8 (an A/A run there); floorhold = floor_hold_us=150 (the side-work floor's empty "
                         "calls behind the shortest hold); clockwarm = clock_warm_min_s=0.03 (grader 2.22's clock warm-up)")
    ap.add_argument("--depth", type=int, default=3, help="the pool's warm spares (2 left gradings waiting for a worker's start)")
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds per baseline (each adds one A and one B grading per pass pair)")
    ap.add_argument("--problems", default="", help="comma-separated problem numbers to grade (default: every baseline)")
    ap.add_argument("--against", default="", help="an earlier run's summary.json: print the within-arm spreads beside it")
    ap.add_argument("--report", default="", help="with --against: compare this summary.json instead of running (no GPU)")
    ap.add_argument("--pool", nargs="+", default=[], help="summary.json files of runs of one arm pair: the A/B over all their "
                    "gradings (no GPU)")
    ap.add_argument("--across-graders", action="store_true", help="with --pool: pool runs of different grader versions "
                    "that share one timing policy (a different policy is still refused)")
    a = ap.parse_args(argv)
    if a.pool:
        runs = [read_summary(f, "--pool", needs="rows") for f in a.pool]
        policies = timing_policies(runs, a.pool)
        cmp = pool_runs(runs, policies=policies, across_graders=a.across_graders)
        for f, s, policy in zip(a.pool, runs, policies):
            v = s.get("versions") or {}
            log(f"POOL {f}: grader {v.get('mkb_grader') or 'not recorded'}, timing policy {policy}"
                f"{'' if v.get('timing_policy') else ' (from its timing events)'}")
        _print_pool(cmp)
        host: dict[str, int | None] = {}
        for f, s_ in zip(a.pool, runs):
            for key, n in host_reading(f, s_).items():
                host[key] = _most_syncs(host, key, n)
        e = arm_effect(cmp, host)
        if e is None:
            log("EFFECT none: no baseline is known to work on the device only (its dataset's integrity events unread)")
        else:
            log(f"EFFECT over {e['baselines']} baselines that only work on the device (left out, reading the host: "
                f"{e['left_out_host'] or 'none'}; unknown: {e['left_out_unknown'] or 'none'}; a grading failed: "
                f"{e['left_out_failed'] or 'none'}): B against A "
                f"{e['mean'] * 100:+.2f}% (se {e['se'] * 100:.2f}%; +-2 se {(e['mean'] - 2 * e['se']) * 100:+.2f}% .. "
                f"{(e['mean'] + 2 * e['se']) * 100:+.2f}%) {'within 0.5%' if e['within_tol'] else 'NOT shown within 0.5%'}")
        return 0
    if a.report:
        if not a.against:
            ap.error("--report needs --against (the earlier run's summary.json)")
        res = against(read_summary(a.report, "--report")["compare"], read_summary(a.against, "--against")["compare"])
        _print_against(res)
        return 0
    old_cmp = read_summary(a.against, "--against")["compare"] if a.against else None  # read before any GPU work
    t0 = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path("/tmp/mkb-ab-events") / a.name
    store.mkdir(parents=True, exist_ok=True)

    from gpu_grader_run import preflight, versions

    from mkb.events import EventWriter
    from mkb.grader import GraderConfig, WorkerPool, grade
    from mkb.problems import baselines

    if a.device.startswith("cuda"):
        preflight()

    configs = {"A": GraderConfig(),
               "B": GraderConfig(**B_ARMS[a.b_arm])}
    summary: dict = {"versions": versions(), "configs": {k: v.as_dict() for k, v in configs.items()},
                     "rows": {}, "errors": [], "skipped": [], "b_arm": a.b_arm}
    log("versions", json.dumps(summary["versions"]))
    writer = EventWriter(str(store), flush_every=500)
    found = baselines()
    if a.problems:
        keep = {int(x) for x in a.problems.split(",") if x.strip()}
        found = [b for b in found if b.problem in keep]
    log(f"{len(found)} baselines: {[f'{b.problem}/{b.dsl}' for b in found]}")
    with WorkerPool(device=a.device, depth=a.depth) as pool:
        for pair in tags(a.rounds, first="B" if a.b_arm == "eager" else "A"):
            for b in found:
                key = f"{b.problem}/{b.dsl}"
                if time.monotonic() - t0 > a.budget_s:
                    summary["skipped"].append(f"{key} {'+'.join(pair)}")
                    continue
                for tag in pair:
                    try:
                        with _eager_here(pool, on=tag[0] == "B" and a.b_arm == "eager"):
                            v = grade(b.problem, b.dsl, b.path, writer=writer, config=configs[tag[0]], pool=pool,
                                      scope="submission")
                    except Exception:  # noqa: BLE001 - recorded, the run goes on
                        summary["errors"].append({"what": f"{key} {tag}", "traceback": traceback.format_exc()})
                        continue
                    t = v.stage("timing")
                    summary["rows"].setdefault(key, {})[tag] = {
                        "passed": v.passed, "reason": v.reason, "median_us": v.candidate_median_us,
                        "eager_median_us": v.eager_median_us, "timed_calls": v.timed_calls,
                        "n_timed_planned": t.figures.get("n_timed_planned") if t else None,
                        "cv": t.figures.get("cv") if t else None, "evaluation_id": v.evaluation_id,
                        "new_segments": t.figures.get("input_sets_new_segments") if t else None,
                        "eager_new_segments": t.figures.get("eager_input_sets_new_segments") if t else None}
                    log(f"{tag:2s} {key:10s} -> {v.reason or 'passed'} median={v.candidate_median_us} calls={v.timed_calls}"
                        f" new_segments={summary['rows'][key][tag]['new_segments']}")
                    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))  # kept if cut short
    writer.close()
    cmp = compare(summary["rows"])
    summary["compare"] = cmp
    for r in cmp:
        log(f"AB {r['key']:10s} A {r['a_us']} B {r['b_us']}  A-vs-B {r['a_vs_b']}  A1-vs-A2 {r['a1_vs_a2']}  B1-vs-B2 {r['b1_vs_b2']}"
            f"  se {r['a_vs_b_se']}  {'ok' if r['within_tol'] else 'OUTSIDE 0.5%'}")
    summary["result"] = {
        "baselines": len(cmp), "all_passed": sum(r["all_passed"] for r in cmp),
        "a_vs_b_within_0_5pct": sum(r["within_tol"] for r in cmp),
        "a1_vs_a2_within_0_5pct": sum(r["a1_vs_a2"] is not None and r["a1_vs_a2"] <= MEDIAN_TOL for r in cmp),
        "b1_vs_b2_within_0_5pct": sum(r["b1_vs_b2"] is not None and r["b1_vs_b2"] <= MEDIAN_TOL for r in cmp),
        "full_calls": sum(r["full_calls"] for r in cmp), "errors": len(summary["errors"]), "skipped": summary["skipped"]}
    log("RESULT " + json.dumps(summary["result"]))
    if old_cmp is not None:
        summary["against"] = {"path": a.against, **against(cmp, old_cmp)}
        _print_against(summary["against"])
    summary["elapsed_s"] = time.monotonic() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    from mkb.events import pack_dataset
    pack_dataset(store, out / "events.tar.gz", arcname=a.name)
    log(f"done in {summary['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
