"""Upstream MetaKernelBench (YIGE24/MetaKernelBench @ d90ba28): its shippable problem set and an importer of its results.json.

The importer turns upstream's per-cell records into mkb events (attempt_started, attempt_finished, verdict with
scope=attempt) so published upstream numbers can be analysed by `mkb-analyze` beside mkb's. What upstream did not
record is marked, never guessed: `problem_hash`, `doc_pack_version` and `grader_version` name upstream's revision and
harness; budgets upstream does not cap (turns, output tokens) are -1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkb.scoring import r_at, s_score, s_upstream

UPSTREAM_REPO = "YIGE24/MetaKernelBench"
UPSTREAM_REV = "d90ba28"
# problems/<family>/NN_*.py shipped at d90ba28 (the other 42 exist there only as _sol_execbench recipes)
UPSTREAM_SHIPPED = (*range(1, 10), *range(14, 27), 28, 36, 44, *range(68, 75))
UPSTREAM_DSLS = {"cutedsl": "cute", "tirx": "tirx"}
UPSTREAM_DSL_VERSIONS = {"cute": "nvidia-cutlass-dsl==4.7.0", "tirx": "apache-tvm==0.25.0.post1"}  # its pins at d90ba28
UPSTREAM_GPU = "NVIDIA B200"  # catalog.TARGET_GPU
UPSTREAM_SUBMISSIONS = 10
UPSTREAM_WALL_S = 2400.0


class UpstreamFormatError(ValueError):
    """A results.json that is not upstream's format; the message says where."""


@dataclass
class ImportReport:
    attempts: int = 0
    verdicts: int = 0
    skipped_skill: int = 0  # transfer arms upstream never ran (the source wrote no SKILL.md): upstream counts lift 0
    errors: int = 0  # records with an error: imported as infra_error (excluded by the analysis)
    experiment: str = ""

    def line(self) -> str:
        return (f"{self.experiment}: {self.attempts} attempts, {self.verdicts} verdicts imported; {self.errors} with an error "
                f"(infra_error, excluded); {self.skipped_skill} transfer arm(s) never run because the source wrote no SKILL.md "
                "(upstream counts them as lift 0; they are not attempts here)")


def _problem_number(name: str, where: str) -> int:
    try:
        return int(name[:2])
    except (TypeError, ValueError):
        raise UpstreamFormatError(f"{where}: problem {name!r} does not start with its two-digit number") from None


def import_results(path: str | Path, store: Any, *, experiment: str | None = None) -> ImportReport:
    """Append upstream's `results.json` at `path` to `store` as mkb events (one run_id, attempt ids derived from coordinates)."""
    import uuid

    from mkb.events import EventWriter

    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UpstreamFormatError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise UpstreamFormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or "cells" not in doc or "model" not in doc:
        raise UpstreamFormatError(f"{path}: not an upstream results.json (no 'model' and 'cells')"
                                  f"\nhint: the file `metakernelbench results` writes ({UPSTREAM_REPO} @ {UPSTREAM_REV})")
    model = str(doc["model"])
    exp = experiment or f"upstream-{UPSTREAM_REV}"
    rep = ImportReport(experiment=exp)
    seen: set[tuple] = set()
    ns = uuid.uuid5(uuid.NAMESPACE_URL, f"mkb-upstream:{exp}:{model}")
    with EventWriter(store) as w:
        for i, cell in enumerate(doc["cells"]):
            where = f"{path}: cells[{i}]"
            try:
                c = cell["cell"]
                problem = _problem_number(c["problem"], where)
                src, tgt = c["direction"].split("2", 1)
                src, tgt = UPSTREAM_DSLS[src], UPSTREAM_DSLS[tgt]
                reps = cell["replicates"]
            except (KeyError, TypeError, ValueError) as exc:
                raise UpstreamFormatError(f"{where}: missing or malformed {exc}") from None
            for r in reps:
                n = int(r["n_replicate"]) - 1  # upstream counts replicates from 1
                for role, arm, dsl, source in (("source", "solo", src, None), ("base", "solo", tgt, None), ("skill", "transfer", tgt, src)):
                    key = (problem, n, arm, dsl, source)
                    rec = r.get(role)
                    if key in seen or rec is None:
                        continue
                    seen.add(key)
                    if rec.get("skipped"):
                        rep.skipped_skill += 1
                        continue
                    aid = str(uuid.uuid5(ns, repr(key)))
                    _emit(w, aid, rec, exp=exp, model=model, problem=problem, problem_name=c["problem"], family=c.get("category"),
                          dsl=dsl, arm=arm, source=source, replicate=n, rep=rep)
    return rep


def _emit(w, aid: str, rec: dict, *, exp: str, model: str, problem: int, problem_name: str, family: str | None, dsl: str,
          arm: str, source: str | None, replicate: int, rep: ImportReport) -> None:
    usage = rec.get("usage") or {}
    w.emit("attempt_started", attempt_id=aid, experiment=exp, model=model, problem=problem, problem_name=problem_name,
           family=family, problem_hash=f"upstream@{UPSTREAM_REV}", target_dsl=dsl, source_dsl=source, arm_kind=arm,
           replicate=replicate, gpu=UPSTREAM_GPU, budget_submissions=UPSTREAM_SUBMISSIONS, budget_turns=-1,
           budget_output_tokens=-1, budget_wall_s=UPSTREAM_WALL_S, grader_version=f"upstream@{UPSTREAM_REV}",
           dsl_version=UPSTREAM_DSL_VERSIONS[dsl], doc_pack_version=f"upstream@{UPSTREAM_REV}",
           skill_empty=False if arm != "solo" else None)
    rep.attempts += 1
    if rec.get("error"):
        status = "infra_error"
        rep.errors += 1
    else:
        status = "budget_exhausted" if rec.get("timed_out") else "finished"
    w.emit("attempt_finished", attempt_id=aid, status=status, input_tokens=usage.get("n_input_tokens"),
           output_tokens=usage.get("n_output_tokens"), cost_usd=usage.get("cost_usd"), wall_s=usage.get("agent_sec"),
           error=rec.get("error"))
    if status == "infra_error":
        return
    rewards = rec.get("rewards") or {}
    passed = float(rewards.get("passed", 0.0)) >= 1.0
    speedup = rewards.get("speedup_vs_eager")
    speedup = float(speedup) if speedup is not None else None
    ra = r_at(passed, speedup)
    # upstream keeps no kernel digest: the verdict names its kernel as unrecorded (the analysis needs one to count it)
    w.emit("verdict", attempt_id=aid, evaluation_id=f"upstream-{aid}", scope="attempt", problem=problem, dsl=dsl,
           kernel_sha256=f"unrecorded:upstream@{UPSTREAM_REV}", passed=passed, reason=None if passed else "upstream_failed", speedup=speedup,
           r_at_0=ra[0.0], r_at_0_5=ra[0.5], r_at_1=ra[1.0], r_at_2=ra[2.0], r_at_4=ra[4.0], s=s_score(passed, speedup),
           # upstream's speedup is over its own baseline (the fp32 reference under reference numerics): S_upstream by definition
           speedup_upstream=speedup if passed else None, s_upstream=s_upstream(passed, speedup),
           gpu=UPSTREAM_GPU, details=json.dumps({"grader": f"upstream@{UPSTREAM_REV}", "rewards": rewards}))
    rep.verdicts += 1
