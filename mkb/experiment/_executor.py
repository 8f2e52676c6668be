"""Runs a plan on one host: claims each coordinate through a Lease, schedules the arms, resumes, retries, re-grades pairs.

Every decision is taken from the store (`read_state`) after the claim is held, so any number of executors on any
number of hosts can run the same plan against one store: exactly one scored attempt per coordinate results.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from mkb.agent import AttemptResult, AttemptSpec, SkillSlot
from mkb.agent._pace import Limiter, RateLimiter, set_limiter
from mkb.events import EventWriter, Lease, LeaseLost, Store, resolve_store, uuid7
from mkb.experiment._placebo import choose_placebo
from mkb.experiment._plan import Coordinate, Plan
from mkb.experiment._state import StoreState, read_state, versions_json
from mkb.experiment._tokens import count_tokens


class Runner(Protocol):
    """Runs one attempt and appends its events (attempt_started ... attempt_finished, skill): `mkb.agent.run_attempt`."""

    def __call__(self, spec: AttemptSpec, *, workspace: Path, grader: Any, writer: Any) -> AttemptResult: ...


def default_runner(spec: AttemptSpec, *, workspace: Path, grader: Any, writer: Any) -> AttemptResult:
    """The agent's litellm loop; a model marked `scripted` in the config is the demo's scripted model."""
    if spec.model.scripted:
        from mkb.experiment._scripted import ScriptedRunner

        return ScriptedRunner()(spec, workspace=workspace, grader=grader, writer=writer)
    from mkb.agent import run_attempt

    return run_attempt(spec, workspace=workspace, grader=grader, writer=writer)


class _StampingWriter:
    """The writer an attempt gets when the grader is not the installed one (the replay grader): its attempt_started
    says which grader version its verdicts come from, so such attempts form their own stratum."""

    def __init__(self, writer: Any, grader_version: str) -> None:
        self._w, self._gv = writer, grader_version

    def emit(self, kind: str, *, attempt_id: str | None = None, **payload: Any) -> str:
        if kind == "attempt_started":
            payload["grader_version"] = self._gv
        return self._w.emit(kind, attempt_id=attempt_id, **payload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)


def lease_name(key: str, *, what: str = "claim") -> str:
    return f"{what}/{hashlib.sha256(key.encode()).hexdigest()[:40]}"


def current_versions(dsls: Iterable[str]) -> dict[str, Any]:
    """Grader, DSL and doc-pack versions: what `--rerun-stale` compares (read from metadata; no DSL is imported)."""
    out: dict[str, Any] = {}
    try:
        from mkb.grader import GRADER_VERSION

        out["grader"] = GRADER_VERSION
    except Exception as exc:  # the grader needs torch; a CPU-only planner records why it could not say
        out["grader"] = f"unavailable: {type(exc).__name__}"
    try:
        from mkb.dsl import get_backend

        for d in dsls:
            b = get_backend(d)
            out[f"dsl:{d}"] = b.version()
            out[f"doc_pack:{d}"] = b.doc_pack_version()
    except Exception as exc:
        out["dsl"] = f"unavailable: {type(exc).__name__}"
    return out


@dataclass
class RunReport:
    """How a run ended: what is done, excluded (per arm), paused or still waiting, and what it cost."""

    total: int = 0
    done: int = 0
    ran: int = 0
    excluded: dict[str, str] = field(default_factory=dict)  # key -> reason
    excluded_by_arm: dict[str, int] = field(default_factory=dict)
    blocks_excluded: int = 0
    paused: dict[str, str] = field(default_factory=dict)  # model -> message
    waiting: int = 0
    abandoned: int = 0
    superseded: int = 0
    pair_batches: int = 0
    cost_by_model: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    overhead_s: float = 0.0  # executor time inside attempts that is not the runner (claims, state reads, events)

    @property
    def complete(self) -> bool:
        return self.done + len(self.excluded) == self.total

    def lines(self) -> list[str]:
        out = [f"{self.done}/{self.total} coordinates done ({self.ran} attempts run here), "
               f"{len(self.excluded)} excluded, {self.waiting} waiting; {self.abandoned} abandoned, {self.superseded} superseded"]
        if self.excluded:
            out.append("excluded per arm: " + ", ".join(f"{a} {n}" for a, n in sorted(self.excluded_by_arm.items()))
                       + f" ({self.blocks_excluded} block(s))")
        for m, msg in self.paused.items():
            out.append(msg)
        if self.cost_by_model:
            out.append("spend: " + ", ".join(f"{m} ${c:,.2f}" for m, c in self.cost_by_model.items()))
        return out


@dataclass(frozen=True)
class Progress:
    """One look at a running experiment, for a progress display (the CLI's rich line)."""

    total: int
    done: int
    running: int
    waiting: int
    excluded: int
    gradings_queued: int | None
    output_tokens: int
    cost_usd: float
    eta_s: float | None

    def line(self) -> str:
        eta = "" if self.eta_s is None else f", ETA {self.eta_s / 60:.0f} min"
        q = "" if self.gradings_queued is None else f", {self.gradings_queued} grading(s) queued"
        return (f"{self.done}/{self.total} done, {self.running} running, {self.waiting} waiting, {self.excluded} excluded{q}; "
                f"{self.output_tokens:,} output tokens, ${self.cost_usd:,.2f}{eta}")


@dataclass
class _Outcome:
    coord: Coordinate
    what: str  # ran | busy | already | error
    result: AttemptResult | None = None
    overhead_s: float = 0.0
    message: str = ""
    error: str = ""
    run_s: float = 0.0


class PlanMismatch(RuntimeError):
    """The store holds the same experiment name under a different plan."""


class Executor:
    """The local executor: one process, threads for concurrent agents, the grader shared by all of them.

    `runner` runs one attempt (default `mkb.agent.run_attempt`); `grader` is the per-GPU grading queue
    (anything with `submit`, and `submit_batch` for the pair re-grade). The same class runs inside each Ray
    task too: the Ray executor only changes where the runner and the grader execute.
    """

    def __init__(self, plan: Plan, *, store: str | Store | None, grader: Any = None, runner: Runner | None = None,
                 holder: str | None = None, ttl_s: float = 60.0, workdir: str | Path | None = None,
                 versions: dict[str, Any] | None = None, poll_s: float = 2.0, pair_regrade: bool = True,
                 sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] | None = None,
                 max_workers: int | None = None, progress: Callable[[Progress], None] | None = None,
                 limiters: Mapping[tuple[str, str | None], Limiter] | None = None) -> None:
        self.plan, self.cfg = plan, plan.config
        self.store = resolve_store(store, for_writing=True)
        if self.store.is_local:  # a new experiment's store: the reader takes a missing local path for a typo
            os.makedirs(self.store.root, exist_ok=True)
        self.grader, self.runner = grader, runner or default_runner
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid7()[-8:]}"
        self.ttl_s, self.poll_s, self.pair_regrade = ttl_s, poll_s, pair_regrade
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="mkb-exp-"))
        self.versions = versions if versions is not None else current_versions(self.cfg.dsls)
        self.sleep, self.log = sleep, log or (lambda s: None)
        self.max_workers = max_workers or sum(m.concurrency for m in self.cfg.models)
        self._install_limiters(limiters)
        self.writer = EventWriter(self.store)
        self._paused_logged: set[str] = set()
        self.launched: list[str] = []  # coordinate keys in the order they were handed to a worker thread
        self.progress = progress
        self._t0 = time.monotonic()
        self._ran_s: list[float] = []
        self.report = RunReport(total=len(plan.coordinates))

    def _install_limiters(self, limiters: Mapping[tuple[str, str | None], Limiter] | None) -> None:
        """The provider's limits pace every attempt of this process (mkb.agent._pace): a book of the process's own, or
        `limiters` (the Ray executor's cluster-wide ones, which then replace the local books). A model without limits
        is unpaced, whatever an earlier executor of the process set."""
        for m in self.cfg.models:
            key = (m.config.name, m.config.api_base)
            if limiters is not None:
                lim = limiters.get(key)
            else:
                lim = RateLimiter(rpm=m.rpm or None, tpm=m.tpm or None) if m.rpm or m.tpm else None
            set_limiter(*key, lim)

    # ---- events -------------------------------------------------------------------------------------------
    def _claim_row(self, c: Coordinate, action: str, **kw: Any) -> dict[str, Any]:
        return {"coordinate": c.key, "experiment": c.experiment, "plan_sha256": self.plan.sha256, "model": c.model,
                "problem": c.problem, "problem_hash": c.problem_hash, "target_dsl": c.target_dsl, "arm_kind": c.arm_kind,
                "replicate": c.replicate, "source_dsl": c.source_dsl, "action": action, "holder": self.holder,
                "try_index": kw.pop("try_index", 0), **kw}

    def publish_plan(self) -> None:
        """Write the plan event once per store; refuse a different plan under the same experiment name."""
        st = read_state(self.store, self.cfg.name)
        others = [p for p in st.plans if p != self.plan.sha256]
        if others:
            raise PlanMismatch(f"store {self.store.url} already holds experiment {self.cfg.name!r} under plan {others[0][:12]}, "
                               f"not {self.plan.sha256[:12]}\nhint: a changed config is a new experiment: rename it, or use another --store")
        if self.plan.sha256 not in st.plans:
            ev = self.plan.event()
            ev["manifest"] = versions_json({"versions": self.versions, "gpu": self.cfg.gpu, "holder": self.holder})
            self.writer.emit("plan", **ev)
            self.writer.flush()

    def request_rerun(self, coords: Iterable[Coordinate], *, reason: str) -> int:
        """Mark `coords` (callers pass a dependency closure) to be run again; earlier attempts stay, superseded once redone."""
        n = 0
        for c in coords:
            self.writer.emit("claim", **self._claim_row(c, "rerun_requested", reason=reason))
            n += 1
        self.writer.flush()
        return n

    def stale(self, st: StoreState) -> list[Coordinate]:
        """Coordinates whose scored attempt ran under other grader, DSL or doc-pack versions than this executor's."""
        now = versions_json(self.versions)
        return [c for c in self.plan.coordinates if (a := st.coord(c.key).scored) is not None and a.versions != now]

    # ---- state -> decisions -------------------------------------------------------------------------------
    def _done(self, st: StoreState, c: Coordinate) -> bool:
        return st.coord(c.key).scored is not None

    def _source_problem(self, st: StoreState, c: Coordinate) -> str | None:
        """Why `c` cannot run (a source excluded, or a missing skill under the upstream convention), or None."""
        for s in self.plan.sources(c):
            cs = st.coord(s.key)
            if cs.excluded:
                return f"source {s.label} excluded ({cs.excluded})"
            a = cs.scored
            if a is not None and self.cfg.missing_skill == "skip" and not st.skills.get(a.attempt_id, ("", ""))[0].strip():
                return "missing_skill: the source wrote no SKILL.md (upstream convention: not run, lift 0)"
        return None

    def reconcile(self, st: StoreState) -> None:
        """Write the marks the state implies and nobody wrote yet: superseded attempts, exclusions that propagate."""
        wrote = False
        for c in self.plan.coordinates:
            cs = st.coord(c.key)
            win = cs.scored
            if win is not None:
                for a in cs.attempts:
                    if a is not win and a.status in ("finished", "budget_exhausted") and not a.superseded:
                        self.writer.emit("claim", attempt_id=a.attempt_id, **self._claim_row(
                            c, "superseded", token=a.token, try_index=a.try_index, reason=f"superseded by {win.attempt_id}"))
                        if a.attempt_id not in st.annotated_excluded:
                            self.writer.emit("annotation", target_attempt_id=a.attempt_id, label="excluded",
                                             reason=f"superseded: {c.key} is scored by {win.attempt_id}", annotator="mkb.experiment")
                        a.superseded = wrote = True
            elif not cs.excluded and c.arm_kind != "solo":
                why = self._source_problem(st, c)
                if why:
                    self.writer.emit("claim", **self._claim_row(c, "excluded", reason=why))
                    cs.excluded, wrote = why, True
                    st.coords[c.key] = cs
        # a block with an excluded arm is excluded: its other arms' attempts are annotated (nothing is deleted)
        for block, arms in self.plan.blocks.items():
            bad = [c for c in arms if st.coord(c.key).excluded]
            solo = self.plan.solo(block[0], block[1], block[3], block[2])
            if st.coord(solo.key).excluded:
                bad.append(solo)
            if not bad:
                continue
            for c in arms:
                a = st.coord(c.key).scored
                if a is not None and a.attempt_id not in st.annotated_excluded:
                    self.writer.emit("annotation", target_attempt_id=a.attempt_id, label="excluded", annotator="mkb.experiment",
                                     reason=f"block excluded: {', '.join(b.label for b in bad)} excluded")
                    st.annotated_excluded.add(a.attempt_id)
                    wrote = True
        if wrote:
            self.writer.flush()

    def spent(self, st: StoreState) -> dict[str, float]:
        out = {m.name: 0.0 for m in self.cfg.models}
        for c in self.plan.coordinates:
            for a in st.coord(c.key).attempts:
                out[c.model] += st.cost_of(a)
        return out

    def ready(self, st: StoreState, *, running: set[str], not_before: dict[str, float],
              scope: set[str] | None = None) -> list[list[Coordinate]]:
        """Groups to start, in order: each pending solo alone (solos first), then each released block's arms together.

        A block is released once every solo any of its arms needs has a scored attempt; its arms come in the
        plan's seeded order. Coordinates running here, backing off after an infra_error, done or excluded are left out.
        """
        now = time.time()

        def pending(c: Coordinate) -> bool:
            cs = st.coord(c.key)
            return (c.key not in running and cs.scored is None and not cs.excluded and not_before.get(c.key, 0) <= now)

        inside = (lambda c: True) if scope is None else (lambda c: c.key in scope)
        groups: list[list[Coordinate]] = [[c] for c in self.plan.coordinates if c.arm_kind == "solo" and pending(c) and inside(c)]
        for block, arms in self.plan.blocks.items():
            arms = [c for c in arms if inside(c)]  # a subset re-runs the arms it names; their done block mates stay
            if arms and all(self._done(st, s) for c in arms for s in self.plan.sources(c)):
                g = [c for c in arms if pending(c)]
                if g:
                    groups.append(g)
        return groups

    # ---- one attempt ----------------------------------------------------------------------------------------
    def _slot(self, c: Coordinate, st: StoreState) -> SkillSlot | None:
        if c.arm_kind == "solo":
            return None
        src = self.plan.sources(c)[0]
        a = st.coord(src.key).scored
        text, _ = st.skills.get(a.attempt_id, ("", "")) if a else ("", "")
        if c.arm_kind == "placebo":
            p = choose_placebo(count_tokens(text))
            flags = ("placebo", f"placebo_notes={p.source}", f"placebo_tokens={p.tokens}/{p.target_tokens}", *p.flags)
            return SkillSlot(text=p.text, sha256=p.sha256, source_attempt=None, flags=flags)
        return SkillSlot.of(text, source_attempt=a.attempt_id if a else None)

    def spec(self, c: Coordinate, st: StoreState, attempt_id: str) -> AttemptSpec:
        seed = int(hashlib.sha256(f"{self.cfg.seed}:{c.key}".encode()).hexdigest()[:8], 16)
        return AttemptSpec(
            experiment=c.experiment, problem=c.problem, target_dsl=c.target_dsl, arm_kind=c.arm_kind, replicate=c.replicate,
            source_dsl=c.source_dsl, skill=self._slot(c, st), model=self.cfg.model(c.model).config, budget=self.cfg.budget,
            seed=seed, attempt_id=attempt_id, header=self.cfg.header, gpu=self.cfg.gpu, plan_sha256=self.plan.sha256,
            wrong_source_problem=c.source_problem if c.arm_kind == "wrong" else None)

    def run_coordinate(self, c: Coordinate) -> _Outcome:
        """Claim `c`, re-read the store under the claim, run it once, release. Safe to call from any host at any time."""
        t0 = time.perf_counter()
        lease = Lease.acquire(self.store, lease_name(c.key), holder=self.holder, ttl_s=self.ttl_s)
        if lease is None:
            return _Outcome(c, "busy", overhead_s=time.perf_counter() - t0)
        stop = threading.Event()
        lost: list[str] = []

        def beat() -> None:
            while not stop.wait(self.ttl_s / 3):
                try:
                    lease.renew()
                except LeaseLost as exc:
                    lost.append(str(exc).splitlines()[0])
                    return
                except Exception:  # a store hiccup: try again at the next beat; expiry is ttl_s away
                    continue

        hb = threading.Thread(target=beat, name=f"lease-{c.key[-24:]}", daemon=True)
        run_s = 0.0
        try:
            st = read_state(self.store, c.experiment)
            cs = st.coord(c.key)
            if cs.scored is not None or cs.excluded:
                return _Outcome(c, "already", overhead_s=time.perf_counter() - t0)
            why = self._source_problem(st, c)
            if why:
                self.writer.emit("claim", **self._claim_row(c, "excluded", reason=why))
                self.writer.flush()
                return _Outcome(c, "already", overhead_s=time.perf_counter() - t0)
            if any(st.coord(s.key).scored is None for s in self.plan.sources(c)):  # a source was sent back for a rerun
                return _Outcome(c, "busy", overhead_s=time.perf_counter() - t0)
            for a in cs.attempts:
                if a.status is None and not a.abandoned:  # its executor died holding an older token of this lease
                    cost, toks = st.turn_cost.get(a.attempt_id, (0.0, 0))
                    self.writer.emit("attempt_abandoned", attempt_id=a.attempt_id, coordinate=c.key, reason="lease_expired",
                                     detected_by=self.holder, claimed_token=a.token, cost_usd=cost, output_tokens=toks)
            attempt_id = uuid7()
            spec = self.spec(c, st, attempt_id)
            self.writer.emit("claim", attempt_id=attempt_id, **self._claim_row(
                c, "claimed", token=lease.token, try_index=cs.tries, versions=versions_json(self.versions)))
            self.writer.flush()
            hb.start()
            ws = self.workdir / hashlib.sha256(c.key.encode()).hexdigest()[:16] / attempt_id
            ws.mkdir(parents=True, exist_ok=True)
            r0 = time.perf_counter()
            err = ""
            try:
                gv = getattr(self.grader, "version", None)
                writer = _StampingWriter(self.writer, str(gv)) if gv and str(gv).startswith("replay") else self.writer
                result = self.runner(spec, workspace=ws, grader=self.grader, writer=writer)
            except Exception as exc:  # the runner itself failed: an infra_error of this attempt, retried like one
                msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
                self.writer.emit("attempt_finished", attempt_id=attempt_id, status="infra_error", error=f"runner raised {msg}")
                result = AttemptResult(attempt_id, "infra_error", None, None, "", hashlib.sha256(b"").hexdigest(), 0, 0, 0, None)
                err = f"runner raised {msg}"
            run_s = time.perf_counter() - r0
            self.writer.flush()
            msg = f"lease lost while running: {lost[0]}" if lost else ""
            return _Outcome(c, "ran", result, overhead_s=time.perf_counter() - t0 - run_s, message=msg, error=err, run_s=run_s)
        finally:
            stop.set()
            if hb.is_alive():
                hb.join(timeout=5)
            lease.release()

    # ---- the loop -------------------------------------------------------------------------------------------
    def run(self, *, rerun: Iterable[Coordinate] = (), rerun_stale: bool = False, only: Iterable[Coordinate] | None = None,
            stop_launching_after_s: float | None = None) -> RunReport:
        """Run until every coordinate (or every one of `only`) is done or excluded, or every model left is paused.

        `stop_launching_after_s`: start no attempt after that many seconds (running ones finish; a later run resumes).
        """
        t_start = time.perf_counter()
        stop_at = None if stop_launching_after_s is None else time.monotonic() + stop_launching_after_s
        self.publish_plan()
        st = read_state(self.store, self.cfg.name)
        rr = list(rerun)
        if rerun_stale:
            rr += self.stale(st)
        if rr:
            closure = self.plan.closure(c.key for c in rr)
            n = self.request_rerun(closure, reason="rerun" if not rerun_stale else "rerun-stale")
            self.log(f"re-running {n} coordinate(s): {len(rr)} asked for and the arms that consumed their skills")
        scope = None
        if only is not None:  # the subset, every arm that consumed its skills, and every solo those need
            down = self.plan.closure(c.key for c in only)
            scope = {c.key for c in down} | {s.key for c in down for s in self.plan.sources(c)}
        running: dict[str, Future] = {}
        not_before: dict[str, float] = {}
        busy_until: dict[str, float] = {}
        per_model: dict[str, int] = {m.name: 0 for m in self.cfg.models}
        failures: dict[str, int] = {}
        pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="mkb-attempt")
        try:
            while True:
                st = read_state(self.store, self.cfg.name)
                self.reconcile(st)
                spent = self.spent(st)
                now = time.time()
                todo = [c for c in self.plan.coordinates if (scope is None or c.key in scope)
                        and st.coord(c.key).scored is None and not st.coord(c.key).excluded]
                groups = self.ready(st, running=set(running), not_before={**not_before, **busy_until}, scope=scope)
                paused = self._paused(spent, todo)
                if self.progress is not None:
                    self.progress(self._progress(st, scope, len(running), spent))
                if stop_at is not None and time.monotonic() > stop_at:
                    groups = []
                    if not running:
                        self.log(f"stopped launching after {stop_launching_after_s:.0f} s; {len(todo)} coordinate(s) left for a later run")
                        break
                launched = 0
                for g in groups:
                    m = self.cfg.model(g[0].model)
                    if m.name in paused:
                        continue
                    free = m.concurrency - per_model[m.name]
                    # a block starts whole, so its arms meet the provider at the same time; a block larger than the
                    # model's concurrency starts when every slot is free, as many arms as fit (the rest next, in order)
                    if len(g) > free:
                        if free < m.concurrency:
                            continue
                        g = g[:free]
                    for c in g:
                        self.launched.append(c.key)
                        running[c.key] = self._submit(pool, c)
                        per_model[m.name] += 1
                        launched += 1
                if not running:
                    blocked = [c for c in todo if c.model not in paused]
                    if not blocked:
                        break
                    waits = [t for k, t in {**not_before, **busy_until}.items() if t > now and k in {c.key for c in blocked}]
                    if not groups and not waits and not self._others_hold(blocked):
                        break  # nothing can start: a dependency is missing (reported as waiting)
                    self.sleep(max(0.05, min([self.poll_s] + [t - now for t in waits])))
                    continue
                done, _ = wait(list(running.values()), timeout=self.poll_s, return_when=FIRST_COMPLETED)
                for fut in done:
                    key = next(k for k, f in running.items() if f is fut)
                    c = self.plan.by_key[key]
                    del running[key]
                    per_model[c.model] -= 1
                    try:
                        out: _Outcome = fut.result()
                    except Exception as exc:  # the executor's own step failed (a store hiccup, a lost Ray worker)
                        failures[key] = failures.get(key, 0) + 1
                        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                        if failures[key] >= 3:
                            raise RuntimeError(f"{c.label}: claiming or running it failed 3 times: {msg}") from exc
                        self.log(f"{c.label}: {msg}; trying again in {self.poll_s * 5:.0f} s")
                        busy_until[key] = time.time() + self.poll_s * 5
                        continue
                    self.report.overhead_s += out.overhead_s
                    if out.what == "busy":
                        busy_until[c.key] = time.time() + self.poll_s
                    elif out.what == "ran":
                        self.report.ran += 1
                        self._ran_s.append(out.run_s)
                        busy_until.pop(c.key, None)
                        self._after(c, out, not_before)
        finally:
            pool.shutdown(wait=True)
            self.writer.flush()
        st = read_state(self.store, self.cfg.name)
        self.reconcile(st)
        if self.pair_regrade and self.grader is not None and hasattr(self.grader, "submit_batch"):
            self.report.pair_batches += self.regrade_pairs(st)
        self._fill_report(read_state(self.store, self.cfg.name), scope)
        self.report.wall_s = time.perf_counter() - t_start
        self.writer.close()
        return self.report

    def _submit(self, pool: ThreadPoolExecutor, c: Coordinate) -> Future:
        """Start `run_coordinate(c)` somewhere; here a thread of this process (the Ray executor sends it to a task)."""
        return pool.submit(self.run_coordinate, c)

    def _progress(self, st: StoreState, scope: set[str] | None, running: int, spent: dict[str, float]) -> Progress:
        coords = [c for c in self.plan.coordinates if scope is None or c.key in scope]
        done = sum(1 for c in coords if st.coord(c.key).scored is not None)
        excl = sum(1 for c in coords if st.coord(c.key).excluded)
        toks = sum(a.output_tokens for c in coords for a in st.coord(c.key).attempts)
        q = getattr(self.grader, "queued", None)
        left = len(coords) - done - excl
        eta = None
        if self._ran_s and left:
            conc = max(1, sum(m.concurrency for m in self.cfg.models))
            eta = sum(self._ran_s) / len(self._ran_s) * left / min(conc, left)
        return Progress(len(coords), done, running, left - running, excl, q() if callable(q) else q, toks,
                        sum(spent.values()), eta)

    def _others_hold(self, coords: list[Coordinate]) -> bool:
        return any(Lease.peek(self.store, lease_name(c.key)) is not None for c in coords[:200])

    def _paused(self, spent: dict[str, float], todo: list[Coordinate]) -> set[str]:
        out = set()
        for m in self.cfg.models:
            if m.usd_cap is not None and spent.get(m.name, 0.0) >= m.usd_cap:
                out.add(m.name)
                n = sum(1 for c in todo if c.model == m.name)
                msg = (f"model {m.name} paused: spent ${spent[m.name]:,.2f} of its ${m.usd_cap:,.2f} cap; {n} attempt(s) wait"
                       f"\nhint: raise usd_cap for {m.name} in {self.cfg.source or 'the config'} and run again (the same plan resumes)")
                self.report.paused[m.name] = msg
                if m.name not in self._paused_logged:
                    self._paused_logged.add(m.name)
                    self.log(msg)
        return out

    def _after(self, c: Coordinate, out: _Outcome, not_before: dict[str, float]) -> None:
        r = out.result
        if out.message:
            self.log(f"{c.label}: {out.message}")
        if r is None or r.status != "infra_error":
            self.log(f"{c.label}: {r.stop_reason if r else '?'}")
            return
        st = read_state(self.store, self.cfg.name)
        n = st.coord(c.key).infra_errors
        if n > self.cfg.max_infra_retries:
            reason = f"infra_error after {n} tries"
            self.writer.emit("claim", **self._claim_row(c, "excluded", reason=reason, try_index=n))
            self.writer.flush()
            self.log(f"{c.label}: excluded ({reason})")
        else:
            delay = self.cfg.infra_backoff_s * 2 ** (n - 1)
            not_before[c.key] = time.time() + delay
            self.log(f"{c.label}: infra_error ({n}/{self.cfg.max_infra_retries + 1}); retrying in {delay:.0f} s")
        if out.error:
            self.log(f"  {out.error}")

    # ---- pair re-grade --------------------------------------------------------------------------------------
    def grader_version(self) -> str:
        v = getattr(self.grader, "version", None)
        if v:
            return str(v)
        try:
            from mkb.grader import GRADER_VERSION

            return GRADER_VERSION
        except Exception:
            return "unknown"

    def regrade_pairs(self, st: StoreState, *, fresh_grader: bool = False) -> int:
        """Re-grade the final kernels of every complete (model, problem, replicate) together: one batch, one eager timing.

        A group counts as re-graded when each of its final kernels has a scope=pair verdict; with `fresh_grader`, only
        verdicts of this grader's version count, so `mkb-run regrade` under a newer grader adds a new set beside the old.
        """
        gv = self.grader_version()

        def graded(aid: str, s: StoreState) -> bool:
            vs = s.pair_graded.get(aid, set())
            return gv in vs if fresh_grader else bool(vs)

        groups: dict[tuple[str, int, int], list[Coordinate]] = {}
        for c in self.plan.coordinates:
            groups.setdefault((c.model, c.problem, c.replicate), []).append(c)
        n = 0
        for g, cs in groups.items():
            scored = [st.coord(c.key).scored for c in cs]
            if any(a is None for a in scored) or any(st.coord(c.key).excluded for c in cs):
                continue
            need = [(c, a) for c, a in zip(cs, scored) if a.final_kernel_sha256 and not graded(a.attempt_id, st)]
            if not need:
                continue
            key = f"pair|{self.cfg.name}|{g}|{gv}"
            lease = Lease.acquire(self.store, lease_name(key, what="pair"), holder=self.holder, ttl_s=max(self.ttl_s, 600.0))
            if lease is None:
                continue
            try:
                fresh = read_state(self.store, self.cfg.name)
                need = [(c, a) for c, a in need if not graded(a.attempt_id, fresh)]
                if not need:
                    continue
                jobs = self._pair_jobs(need)
                futs = self.grader.submit_batch(jobs)
                for (c, _), f in zip(need, futs):
                    v = f.result()
                    self.log(f"pair re-grade {c.label}: {'passed' if v.passed else 'failed ' + str(v.reason)}"
                             + (f" {v.speedup:.2f}x" if v.speedup else ""))
                n += 1
            finally:
                lease.release()
        return n

    def _pair_jobs(self, need: list[tuple[Coordinate, Any]]) -> list[Any]:
        import polars as pl

        from mkb.events import scan

        try:
            from mkb.grader import GradeJob
        except ImportError:
            from mkb.agent import GradeJob
        shas = [a.final_kernel_sha256 for _, a in need]
        sub = scan("submission", self.store).filter(pl.col("kernel_sha256").is_in(shas)).select(
            "kernel_sha256", "kernel_source").unique("kernel_sha256").collect()
        src = dict(sub.iter_rows())
        jobs = []
        d = self.workdir / "pair"
        d.mkdir(parents=True, exist_ok=True)
        for c, a in need:
            if a.final_kernel_sha256 not in src:
                raise RuntimeError(f"pair re-grade {c.label}: no submission event holds kernel {a.final_kernel_sha256[:12]}"
                                   "\nhint: the agent must emit a submission event for its final kernel")
            p = d / f"{a.final_kernel_sha256}.py"
            p.write_text(src[a.final_kernel_sha256])
            jobs.append(GradeJob(problem=c.problem, dsl=c.target_dsl, kernel_path=p, experiment=c.experiment,
                                 attempt_id=a.attempt_id, scope="pair"))
        return jobs

    def _fill_report(self, st: StoreState, scope: set[str] | None) -> None:
        rep = self.report
        coords = [c for c in self.plan.coordinates if scope is None or c.key in scope]
        rep.total = len(coords)
        rep.done = sum(1 for c in coords if st.coord(c.key).scored is not None)
        rep.excluded = {c.key: st.coord(c.key).excluded for c in coords if st.coord(c.key).excluded}
        rep.excluded_by_arm = {}
        for c in coords:
            if st.coord(c.key).excluded:
                rep.excluded_by_arm[c.arm_kind] = rep.excluded_by_arm.get(c.arm_kind, 0) + 1
        rep.blocks_excluded = sum(1 for b, arms in self.plan.blocks.items()
                                  if any(st.coord(c.key).excluded for c in arms)
                                  or st.coord(self.plan.solo(b[0], b[1], b[3], b[2]).key).excluded)
        rep.waiting = rep.total - rep.done - len(rep.excluded)
        rep.abandoned = sum(1 for c in coords for a in st.coord(c.key).attempts if a.abandoned)
        rep.superseded = sum(1 for c in coords for a in st.coord(c.key).attempts if a.superseded)
        rep.cost_by_model = self.spent(st)
