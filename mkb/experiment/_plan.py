"""Turns a config into the plan: every coordinate, what each needs, the derangement for `wrong`, and the plan event."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable

from mkb.experiment._config import ConfigError, ExperimentConfig
from mkb.experiment._placebo import TOKENIZER, notes, notes_sha256
from mkb.experiment._problems import ProblemRef, all_problems

SKILL_ARMS = ("transfer", "placebo", "same", "wrong")


@dataclass(frozen=True, order=True)
class Coordinate:
    """One scored attempt of the experiment. `source_problem` is the problem whose solo gives the skill (pi(p) for wrong)."""

    experiment: str
    model: str
    problem: int
    problem_hash: str
    target_dsl: str
    arm_kind: str
    replicate: int
    source_dsl: str | None = None
    source_problem: int | None = None

    @property
    def key(self) -> str:
        """Stable text key: the claim name, the resume index and the subset filter all use it."""
        src = "-" if self.source_dsl is None else f"{self.source_dsl}@{self.source_problem}"
        return (f"{self.experiment}|{self.model}|{self.problem}:{self.problem_hash[:16]}|{self.target_dsl}|{self.arm_kind}"
                f"|{src}|r{self.replicate}")

    @property
    def block(self) -> tuple[str, int, int, str]:
        """(model, problem, replicate, target DSL): the skill arms released together."""
        return (self.model, self.problem, self.replicate, self.target_dsl)

    @property
    def label(self) -> str:
        """Display only (events carry arm_kind, source_dsl, target_dsl)."""
        arm = self.arm_kind if self.arm_kind in ("solo", "placebo") else f"{self.arm_kind}:{self.source_dsl}"
        return f"{self.model} p{self.problem} {self.target_dsl} {arm} r{self.replicate}"


def cross_family_derangement(problems: dict[int, str], seed: int) -> dict[int, int]:
    """A seeded permutation pi with family(pi(p)) != family(p) for every p (so pi has no fixed point).

    Uniform rejection sampling almost never succeeds at 74 problems in six families, so this draws a random
    perfect matching of the bipartite graph p -> q (different family) with randomised augmenting paths. One
    exists exactly when no family holds more than half of the problems (Hall's condition).
    """
    nums = sorted(problems)
    if len(nums) < 2:
        raise ConfigError("the wrong arm needs at least two problems of different families")
    counts: dict[str, int] = {}
    for p in nums:
        counts[problems[p]] = counts.get(problems[p], 0) + 1
    fam, most = max(counts.items(), key=lambda kv: kv[1])
    if 2 * most > len(nums):
        raise ConfigError(f"the wrong arm needs a cross-family derangement, impossible when family {fam} holds {most} of "
                          f"{len(nums)} problems\nhint: add problems of other families or drop 'wrong' from arms")
    rng = random.Random(f"mkb-derangement:{seed}")
    adj = {p: [q for q in nums if problems[q] != problems[p]] for p in nums}
    for p in nums:
        rng.shuffle(adj[p])
    match_of: dict[int, int] = {}  # q -> p

    def augment(p: int, seen: set[int]) -> bool:
        for q in adj[p]:
            if q in seen:
                continue
            seen.add(q)
            if q not in match_of or augment(match_of[q], seen):
                match_of[q] = p
                return True
        return False

    order = nums[:]
    rng.shuffle(order)
    for p in order:
        if not augment(p, set()):  # cannot happen under Hall's condition; kept as a guard
            raise ConfigError(f"no cross-family derangement found for problem {p}")
    pi = {p: q for q, p in match_of.items()}
    assert all(problems[pi[p]] != problems[p] for p in nums) and sorted(pi.values()) == nums
    return pi


@dataclass(frozen=True)
class Plan:
    """Every coordinate of an experiment and how they depend on each other. Built only by `build_plan`."""

    config: ExperimentConfig
    problems: dict[int, ProblemRef]
    derangement: dict[int, int]
    coordinates: tuple[Coordinate, ...]

    @cached_property
    def sha256(self) -> str:
        body = {"config": self.config.identity(), "problems": {p: r.hash for p, r in sorted(self.problems.items())},
                "derangement": sorted(self.derangement.items()), "placebo_notes": notes_sha256(), "tokenizer": TOKENIZER}
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()

    @cached_property
    def by_key(self) -> dict[str, Coordinate]:
        return {c.key: c for c in self.coordinates}

    def solo(self, model: str, problem: int, dsl: str, replicate: int) -> Coordinate:
        return Coordinate(self.config.name, model, problem, self.problems[problem].hash, dsl, "solo", replicate)

    def sources(self, c: Coordinate) -> tuple[Coordinate, ...]:
        """The solos whose skills `c` needs (a placebo needs the transfer's source: its length is matched to it)."""
        if c.arm_kind == "solo":
            return ()
        rep = (c.replicate + 1) % self.config.replicates if c.arm_kind == "same" else c.replicate
        return (self.solo(c.model, c.source_problem, c.source_dsl, rep),)

    @cached_property
    def dependents(self) -> dict[str, tuple[Coordinate, ...]]:
        out: dict[str, list[Coordinate]] = {}
        for c in self.coordinates:
            for s in self.sources(c):
                out.setdefault(s.key, []).append(c)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def blocks(self) -> dict[tuple[str, int, int, str], tuple[Coordinate, ...]]:
        """The skill arms of each block, in the block's seeded release order."""
        out: dict[tuple, list[Coordinate]] = {}
        for c in self.coordinates:
            if c.arm_kind != "solo":
                out.setdefault(c.block, []).append(c)
        for b, cs in out.items():
            random.Random(f"mkb-release:{self.config.seed}:{b}").shuffle(cs)
        return {b: tuple(cs) for b, cs in out.items()}

    def block_sources(self, block: tuple[str, int, int, str]) -> tuple[Coordinate, ...]:
        """Every solo any arm of the block needs (the block is released once all have finished)."""
        seen: dict[str, Coordinate] = {}
        for c in self.blocks.get(block, ()):
            for s in self.sources(c):
                seen[s.key] = s
        return tuple(seen.values())

    def closure(self, keys: Iterable[str]) -> tuple[Coordinate, ...]:
        """`keys` and every coordinate that consumed their skills (re-running a solo re-runs its dependents)."""
        todo, out = list(keys), {}
        while todo:
            k = todo.pop()
            if k in out:
                continue
            if k not in self.by_key:
                raise KeyError(k)
            out[k] = self.by_key[k]
            todo.extend(d.key for d in self.dependents.get(k, ()))
        return tuple(c for c in self.coordinates if c.key in out)

    def select(self, *, models: Iterable[str] = (), problems: Iterable[int] = (), dsls: Iterable[str] = (),
               arms: Iterable[str] = (), replicates: Iterable[int] = ()) -> tuple[Coordinate, ...]:
        """The coordinates matching every non-empty filter (a subset for `--subset`, before its closure)."""
        f = {"model": set(models), "problem": set(problems), "target_dsl": set(dsls), "arm_kind": set(arms), "replicate": set(replicates)}
        return tuple(c for c in self.coordinates if all(not v or getattr(c, k) in v for k, v in f.items()))

    def event(self) -> dict[str, Any]:
        """The `plan` event's payload: enough to rebuild and audit every coordinate."""
        cfg = self.config
        return {
            "experiment": cfg.name, "plan_sha256": self.sha256, "config": json.dumps(cfg.as_dict(), sort_keys=True, default=str),
            "seed": cfg.seed, "replicates": cfg.replicates, "dsls": list(cfg.dsls), "arms": list(cfg.arms),
            "models": [m.name for m in cfg.models], "problems": [str(p) for p in sorted(self.problems)],
            "problem_hashes": [self.problems[p].hash for p in sorted(self.problems)],
            "derangement": json.dumps({str(p): q for p, q in sorted(self.derangement.items())}),
            "tokenizer": TOKENIZER, "placebo_notes_sha256": notes_sha256(), "placebo_notes": json.dumps(notes()), "header": cfg.header,
            "missing_skill": cfg.missing_skill, "score": cfg.score, "n_coordinates": len(self.coordinates),
            "coordinates": [c.key for c in self.coordinates],
        }


def build_plan(config: ExperimentConfig, *, problems: dict[int, ProblemRef] | None = None) -> Plan:
    """Every coordinate of `config`: solos first, then the skill arms of each block (one per source DSL)."""
    known = problems or all_problems()
    refs = {p: known[p] for p in config.problems}
    pi = cross_family_derangement({p: r.family for p, r in refs.items()}, config.seed) if "wrong" in config.arms else {}
    name, R = config.name, config.replicates
    solos, arms = [], []
    for m in config.models:
        for p in config.problems:
            h = refs[p].hash
            for r in range(R):
                for t in config.dsls:
                    solos.append(Coordinate(name, m.name, p, h, t, "solo", r))
                    for a in config.arms:
                        if a == "same":
                            arms.append(Coordinate(name, m.name, p, h, t, a, r, t, p))
                        elif a in ("transfer", "placebo", "wrong"):
                            for s in config.dsls:
                                if s != t:
                                    arms.append(Coordinate(name, m.name, p, h, t, a, r, s, pi[p] if a == "wrong" else p))
    return Plan(config, refs, pi, tuple(solos + arms))
