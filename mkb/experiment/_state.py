"""Reads what an experiment's store already holds, per coordinate: claims, finished and abandoned attempts, exclusions.

Everything the executor decides on resume comes from here, so a run killed at any moment and restarted
sees exactly what was published: an event not yet flushed did not happen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mkb.events import Store, resolve_store, schemas

SCORED_STATUSES = ("finished", "budget_exhausted")


@dataclass
class AttemptInfo:
    """One attempt at a coordinate as the store records it."""

    attempt_id: str
    token: int | None
    try_index: int
    holder: str
    claimed_ts: float
    versions: str | None
    status: str | None = None  # from attempt_finished; None while running or after a kill
    finished_ts: float | None = None
    cost_usd: float = 0.0
    output_tokens: int = 0
    final_kernel_sha256: str | None = None
    abandoned: bool = False
    superseded: bool = False


@dataclass
class CoordState:
    """A coordinate's history: its attempts in claim order, and the marks that end it without a scored attempt."""

    key: str
    attempts: list[AttemptInfo] = field(default_factory=list)
    excluded: str | None = None  # reason, when excluded
    rerun_after: float | None = None  # ts of the latest rerun request: only attempts claimed later can count

    def candidates(self) -> list[AttemptInfo]:
        cut = self.rerun_after or float("-inf")
        return [a for a in self.attempts if a.claimed_ts > cut and a.status in SCORED_STATUSES]

    @property
    def scored(self) -> AttemptInfo | None:
        """The earliest finished attempt claimed after the latest rerun request (every other finished one is superseded)."""
        c = self.candidates()
        return min(c, key=lambda a: (a.finished_ts, a.attempt_id)) if c else None

    @property
    def infra_errors(self) -> int:
        cut = self.rerun_after or float("-inf")
        return sum(1 for a in self.attempts if a.claimed_ts > cut and a.status == "infra_error")

    @property
    def last_infra_ts(self) -> float | None:
        ts = [a.finished_ts for a in self.attempts if a.status == "infra_error" and a.finished_ts]
        return max(ts) if ts else None

    @property
    def tries(self) -> int:
        return len(self.attempts)


@dataclass
class StoreState:
    """The experiment as published: coordinates by key, skill texts by attempt, spend by model."""

    coords: dict[str, CoordState]
    skills: dict[str, tuple[str, str]]  # attempt_id -> (text, sha256) of its last skill event
    plans: dict[str, str]  # plan_sha256 -> experiment of each plan event of this experiment
    pair_graded: dict[str, set[str]]  # attempt_id -> grader versions of its scope=pair verdicts
    annotated_excluded: set[str]  # attempt_ids with an annotation label=excluded
    turn_cost: dict[str, tuple[float, int]]  # unfinished attempt_id -> (cost_usd, output tokens) from its turn events

    def coord(self, key: str) -> CoordState:
        return self.coords.get(key) or CoordState(key)

    def cost_of(self, attempt: AttemptInfo) -> float:
        if attempt.status is not None:
            return attempt.cost_usd
        return self.turn_cost.get(attempt.attempt_id, (0.0, 0))[0]


def _ts(v: Any) -> float:
    return v.timestamp() if hasattr(v, "timestamp") else float(v)


def read_state(store: str | Store | None, experiment: str) -> StoreState:
    """One pass over the kinds the executor needs (claim, attempt_finished, attempt_abandoned, skill, verdict, annotation, turn)."""
    import polars as pl

    from mkb.events import scan

    store = resolve_store(store)
    known = schemas()
    claims = scan("claim", store).filter(pl.col("experiment") == experiment).select(
        "coordinate", "attempt_id", "action", "token", "try_index", "holder", "versions", "reason", "ts").collect()
    coords: dict[str, CoordState] = {}
    by_attempt: dict[str, AttemptInfo] = {}
    superseded: set[str] = set()
    for r in claims.sort("ts").iter_rows(named=True):
        cs = coords.setdefault(r["coordinate"], CoordState(r["coordinate"]))
        act = r["action"]
        if act == "claimed":
            a = AttemptInfo(r["attempt_id"], r["token"], r["try_index"], r["holder"], _ts(r["ts"]), r["versions"])
            cs.attempts.append(a)
            by_attempt[a.attempt_id] = a
        elif act == "excluded":
            cs.excluded = r["reason"] or "excluded"
        elif act == "rerun_requested":
            cs.rerun_after = _ts(r["ts"])
            cs.excluded = None
        elif act == "superseded" and r["attempt_id"]:
            superseded.add(r["attempt_id"])
    ids = list(by_attempt)
    if ids:
        fin = scan("attempt_finished", store).filter(pl.col("attempt_id").is_in(ids)).select(
            "attempt_id", "status", "cost_usd", "output_tokens", "final_kernel_sha256", "ts").collect()
        for r in fin.sort("ts").iter_rows(named=True):
            a = by_attempt[r["attempt_id"]]
            if a.status is None:  # the first finish is the attempt's end; a second would be a writer bug
                a.status, a.finished_ts = r["status"], _ts(r["ts"])
                a.cost_usd, a.output_tokens = r["cost_usd"] or 0.0, r["output_tokens"] or 0
                a.final_kernel_sha256 = r["final_kernel_sha256"]
        ab = scan("attempt_abandoned", store).filter(pl.col("attempt_id").is_in(ids)).select("attempt_id").collect()
        for aid in ab["attempt_id"].to_list():
            by_attempt[aid].abandoned = True
    for aid in superseded:
        if aid in by_attempt:
            by_attempt[aid].superseded = True
    skills: dict[str, tuple[str, str]] = {}
    turn_cost: dict[str, tuple[float, int]] = {}
    pair: dict[str, set[str]] = {}
    annotated: set[str] = set()
    if ids:
        sk = scan("skill", store).filter(pl.col("attempt_id").is_in(ids)).select("attempt_id", "text", "sha256", "ts", "seq").collect()
        for r in sk.sort("ts", "seq").iter_rows(named=True):
            skills[r["attempt_id"]] = (r["text"], r["sha256"])
        open_ids = [a for a, info in by_attempt.items() if info.status is None]  # spend of unfinished attempts only
        if "turn" in known and open_ids:
            tc = scan("turn", store).filter(pl.col("attempt_id").is_in(open_ids)).group_by("attempt_id").agg(
                pl.col("cost_usd").sum(), pl.col("completion_tokens").sum()).collect()
            turn_cost = {r["attempt_id"]: (r["cost_usd"] or 0.0, r["completion_tokens"] or 0) for r in tc.iter_rows(named=True)}
        v = scan("verdict", store).filter((pl.col("scope") == "pair") & pl.col("attempt_id").is_in(ids)).select(
            "attempt_id", pl.col("details").str.json_path_match("$.grader_version").fill_null("unknown").alias("gv")).collect()
        for aid, gv in v.iter_rows():
            pair.setdefault(aid, set()).add(gv)
        an = scan("annotation", store).filter((pl.col("label") == "excluded") & pl.col("target_attempt_id").is_in(ids)).select(
            "target_attempt_id").collect()
        annotated = set(an["target_attempt_id"].to_list())
    plans = scan("plan", store).filter(pl.col("experiment") == experiment).select("plan_sha256", "experiment").collect()
    return StoreState(coords, skills, dict(plans.iter_rows()), pair, annotated, turn_cost)


def versions_json(versions: dict[str, Any]) -> str:
    return json.dumps(versions, sort_keys=True)
