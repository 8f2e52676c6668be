"""A model-free runner and grader that write the same events as the real ones: for orchestration tests and benchmarks.

`FakeRunner` stands in for `mkb.agent.run_attempt` where the question is the executor (claims, order, resume,
retries), not the agent: it spends no tokens, writes `attempt_started`, one `submission`, a `skill` and
`attempt_finished`, and can sleep, fail with infra_error, or write no skill, on request.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mkb.agent import AttemptResult, AttemptSpec


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class FakeRunner:
    """Deterministic attempts. `infra(spec, try_no)` -> True makes that try an infra_error; `no_skill(spec)` -> True writes none."""

    sleep_s: float = 0.0
    cost_usd: float = 0.01
    infra: Callable[[AttemptSpec, int], bool] | None = None
    no_skill: Callable[[AttemptSpec], bool] | None = None
    baseline: bool = False  # write the problem's baseline kernel and grade it through `grader` (the replay tests)
    log: list[tuple[float, str, str]] = field(default_factory=list)  # (start time, attempt_id, label) of every call
    _tries: dict[str, int] = field(default_factory=dict)
    active: int = 0
    max_active: int = 0  # most attempts running at once (the concurrency tests)
    announce: str | None = None  # printed (flushed) when the first attempt starts: the kill tests' clock starts there
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __getstate__(self) -> dict:  # sent to Ray tasks: the lock stays behind, each process gets its own
        d = dict(self.__dict__)
        d.pop("_lock", None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def __call__(self, spec: AttemptSpec, *, workspace: Path, grader: Any, writer: Any) -> AttemptResult:
        label = f"{spec.problem}|{spec.target_dsl}|{spec.arm_kind}|{spec.source_dsl}|{spec.replicate}"
        with self._lock:
            n = self._tries.get(label, 0)
            self._tries[label] = n + 1
            self.log.append((time.time(), spec.attempt_id, label))
            if self.announce is not None and len(self.log) == 1:
                print(self.announce, flush=True)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            return self._run(spec, n, label, workspace=workspace, grader=grader, writer=writer)
        finally:
            with self._lock:
                self.active -= 1

    def _run(self, spec: AttemptSpec, n: int, label: str, *, workspace: Path, grader: Any, writer: Any) -> AttemptResult:
        skill = spec.skill
        writer.emit("attempt_started", attempt_id=spec.attempt_id, experiment=spec.experiment, model=spec.model.name,
                    problem=spec.problem, problem_hash="fake", target_dsl=spec.target_dsl, source_dsl=spec.source_dsl,
                    arm_kind=spec.arm_kind, replicate=spec.replicate, gpu=spec.gpu,
                    budget_submissions=spec.budget.submissions, budget_turns=spec.budget.turns,
                    budget_output_tokens=spec.budget.output_tokens, budget_wall_s=float(spec.budget.working_time_s or 0),
                    grader_version="fake", dsl_version="fake", doc_pack_version="fake",
                    skill_sha256=skill.sha256 if skill else None, skill_source_attempt=skill.source_attempt if skill else None,
                    skill_empty=(not skill.text.strip()) if skill else None, wrong_source_problem=spec.wrong_source_problem,
                    plan_sha256=spec.plan_sha256)
        writer.flush()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.infra is not None and self.infra(spec, n):
            writer.emit("attempt_finished", attempt_id=spec.attempt_id, status="infra_error", cost_usd=self.cost_usd,
                        error="fake infra_error")
            writer.flush()
            return AttemptResult(spec.attempt_id, "infra_error", None, None, "", _sha(""), 0, 1, 10, self.cost_usd)
        if self.baseline:
            from mkb.experiment._scripted import baseline_path

            kernel = baseline_path(spec.problem, spec.target_dsl).read_text()
        else:
            kernel = f"# fake kernel for {label} ({spec.attempt_id})\ndef solve(*inputs):\n    raise NotImplementedError\n"
        ksha = _sha(kernel)
        (workspace / "kernel.py").write_text(kernel)
        eid = f"fake-{ksha[:16]}"
        if self.baseline:
            from mkb.agent import GradeJob

            try:
                eid = grader.submit(GradeJob(problem=spec.problem, dsl=spec.target_dsl, kernel_path=workspace / "kernel.py",
                                             experiment=spec.experiment, attempt_id=spec.attempt_id)).result().evaluation_id
            except Exception as exc:  # noqa: BLE001 - as the agent does: a grader failure is an infra_error
                writer.emit("attempt_finished", attempt_id=spec.attempt_id, status="infra_error", error=f"grader failed: {exc}")
                writer.flush()
                return AttemptResult(spec.attempt_id, "infra_error", None, None, "", _sha(""), 0, 1, 10, self.cost_usd)
        writer.emit("submission", attempt_id=spec.attempt_id, submission_index=0, kernel_source=kernel, kernel_sha256=ksha,
                    kernel_bytes=len(kernel), evaluation_id=eid)
        text = "" if self.no_skill is not None and self.no_skill(spec) else (
            f"# SKILL\nWhat attempt {label} learned. " + ("Seen: " + skill.sha256[:12] + "." if skill else "") + " Tile rows." * 20)
        if text:
            writer.emit("skill", attempt_id=spec.attempt_id, text=text, sha256=_sha(text), source_attempt=spec.attempt_id)
        writer.emit("attempt_finished", attempt_id=spec.attempt_id, status="finished", submissions_used=1, turns_used=1,
                    output_tokens=100, cost_usd=self.cost_usd, final_kernel_sha256=ksha)
        writer.flush()
        return AttemptResult(spec.attempt_id, "finished", ksha, workspace / "kernel.py", text, _sha(text), 1, 1, 100, self.cost_usd)


@dataclass
class FakeGrader:
    """Grades nothing: every kernel fails with reason `fake`, and each verdict is written as the real queue writes it."""

    writer: Any
    version: str = "fake-1"
    batches: list[list[Any]] = field(default_factory=list)

    def _verdict(self, job: Any) -> Any:
        from types import SimpleNamespace

        sha = hashlib.sha256(Path(job.kernel_path).read_bytes()).hexdigest()
        self.writer.emit("verdict", attempt_id=job.attempt_id, scope=job.scope if job.scope == "pair" else "attempt",
                         problem=job.problem, dsl=job.dsl, kernel_sha256=sha, passed=False, reason="fake", s=0.0, gpu="fake",
                         details=json.dumps({"grader_version": self.version}))
        return SimpleNamespace(passed=False, reason="fake", speedup=None, kernel_sha256=sha)

    def submit(self, job: Any) -> Future:
        f: Future = Future()
        f.set_result(self._verdict(job))
        return f

    def submit_batch(self, jobs: list[Any]) -> list[Future]:
        self.batches.append(list(jobs))
        out = [self.submit(j) for j in jobs]
        self.writer.flush()
        return out


READY = "mkb-fake-executor: first attempt started"  # a kill's delay counts from here (_killtest)


def demo_config(name: str = "fake", *, problems: tuple[int, ...] = (28, 72), replicates: int = 2, concurrency: int = 4,
                arms: tuple[str, ...] | None = None, **experiment: Any):
    """A small all-arms config over `problems` with one scripted model (tests, benchmarks)."""
    from mkb.experiment import parse_config

    exp = {"name": name, "problems": list(problems), "replicates": replicates, **experiment}
    if arms is not None:
        exp["arms"] = list(arms)
    return parse_config({"experiment": exp, "models": [{"name": "scripted/fake", "concurrency": concurrency, "scripted": True}]})


def _main(argv: list[str] | None = None) -> int:
    """One executor process over the demo plan with the fake runner: what the kill-and-resume tests start and SIGKILL."""
    import argparse

    from mkb.experiment import build_plan
    from mkb.experiment._executor import Executor

    ap = argparse.ArgumentParser(prog="python -m mkb.experiment._fake")
    ap.add_argument("store")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--problems", default="28,72")
    ap.add_argument("--replicates", type=int, default=2)
    a = ap.parse_args(argv)
    cfg = demo_config(problems=tuple(int(p) for p in a.problems.split(",")), replicates=a.replicates, concurrency=a.concurrency)
    ex = Executor(build_plan(cfg), store=a.store, runner=FakeRunner(sleep_s=a.sleep, announce=READY), versions={"fake": 1}, ttl_s=a.ttl,
                  poll_s=min(0.5, a.ttl / 2), pair_regrade=False)
    rep = ex.run()
    print("\n".join(rep.lines()), flush=True)
    return 0 if rep.complete else 1


if __name__ == "__main__":
    raise SystemExit(_main())
