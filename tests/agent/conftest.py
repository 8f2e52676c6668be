"""Fixtures for the agent tests: a fake grader, a store, and a runner that drives one attempt through the scripted server."""

from __future__ import annotations

import re
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from mkb.agent import AttemptSpec, Budget, ModelConfig, SkillSlot
from mkb.agent._scripted import ScriptedModel
from mkb.events import EventWriter, read
from mkb.grader import Verdict

GOOD = "# a kernel\ndef solve(*xs):\n    return xs[0]  # speedup=1.5\n"
WRONG = "# a kernel\ndef solve(*xs):\n    return xs[0]  # WRONG\n"


class FakeGrader:
    """Grades by markers in the source: `WRONG` fails verification, `speedup=X` passes at X. Records every job."""

    def __init__(self, *, fail_with: Exception | None = None) -> None:
        self.jobs = []
        self.sources = []
        self.fail_with = fail_with
        self._lock = threading.Lock()

    def submit(self, job) -> Future:
        fut: Future = Future()
        src = Path(job.kernel_path).read_text()
        with self._lock:
            self.jobs.append(job)
            self.sources.append(src)
            n = len(self.jobs)
        if self.fail_with is not None:
            fut.set_exception(self.fail_with)
            return fut
        wrong = "WRONG" in src
        m = re.search(r"speedup=([0-9.]+)", src)
        speed = float(m.group(1)) if m and not wrong else None
        fut.set_result(Verdict(evaluation_id=f"eval-{n}", problem=job.problem, dsl=job.dsl, kernel_sha256="x", passed=not wrong,
                               reason="verification_mismatch" if wrong else None, speedup=speed, eager_median_us=10.0,
                               candidate_median_us=10.0 / speed if speed else None, gpu="fake", message="max abs error 3.2" if wrong else ""))
        return fut


def spec(arm: str = "solo", *, dsl: str = "tirx", budget: Budget | None = None, skill: str | None = None, model: ModelConfig | None = None,
         unsafe: bool = False, **kw) -> AttemptSpec:
    slot = None if arm == "solo" else SkillSlot.of(skill if skill is not None else "Tile rows across blocks; fuse the add.", source_attempt="src-1")
    return AttemptSpec(experiment="test", problem=28, target_dsl=dsl, arm_kind=arm, replicate=0,
                       source_dsl=None if arm == "solo" else ("cute" if dsl == "tirx" else "tirx"), skill=slot,
                       model=model or ModelConfig(name="openai/scripted", scripted=True, max_retries=3, retry_base_s=0.01, retry_cap_s=0.05,
                                                  request_timeout_s=20),
                       budget=budget or Budget(), unsafe_no_sandbox=unsafe, **kw)


class Runner:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = str(tmp / "store")
        self.n = 0

    def run(self, steps, *, arm="solo", grader=None, agent=None, model_kw=None, **kw):
        from mkb.agent import run_attempt

        self.n += 1
        grader = grader or FakeGrader()
        with ScriptedModel(steps) as server:
            mk = dict(name="openai/scripted", api_base=server.api_base, scripted=True, max_retries=3, retry_base_s=0.01, retry_cap_s=0.05,
                      request_timeout_s=20)
            mk.update(model_kw or {})
            s = spec(arm, model=ModelConfig(**mk), **kw)
            with EventWriter(self.store) as w:
                res = run_attempt(s, workspace=self.tmp / f"ws{self.n}" / "workspace", grader=grader, writer=w, agent=agent)
        self.server = server
        self.grader = grader
        return res

    def events(self, kind: str, attempt_id: str | None = None):
        df = read(kind, self.store)
        if attempt_id is not None:
            df = df.filter(df["attempt_id"] == attempt_id)
        return df.sort("seq")


@pytest.fixture
def runner(tmp_path) -> Runner:
    return Runner(tmp_path)
