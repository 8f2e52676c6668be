"""The side-work floor's hold arm (GraderConfig.floor_hold_us): validated, recorded as an override, and the hold set
for the empty calls only (issue #10's A/B; the shipped grader keeps the hold's default)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mkb.grader import GraderConfig
from mkb.grader._harness import FLOOR_CALLS, _Evaluation


class _Hold:
    default_us = 1000.0

    def __init__(self) -> None:
        self.us = self.default_us

    def set_us(self, us: float) -> None:
        self.us = us


def _evaluation(hold: _Hold | None):
    calls: list[float | None] = []

    def window(fn, flush):
        calls.append(hold.us if hold else None)
        fn()
        return None, 1.0, 7.0

    return SimpleNamespace(dev=SimpleNamespace(hold=lambda: hold, window=window), flush=None), calls


def test_the_empty_calls_run_behind_the_arms_hold_and_the_default_comes_back() -> None:
    hold = _Hold()
    ev, calls = _evaluation(hold)
    tails, used = _Evaluation._floor_tails(ev, 150.0)
    assert tails == [7.0] * FLOOR_CALLS and used == 150.0 and calls == [150.0] * FLOOR_CALLS and hold.us == 1000.0


def test_what_was_set_before_comes_back_not_the_default() -> None:
    hold = _Hold()
    hold.set_us(420.0)
    ev, calls = _evaluation(hold)
    assert _Evaluation._floor_tails(ev, 150.0, n=2)[1] == 150.0 and hold.us == 420.0
    assert _Evaluation._floor_tails(ev, None, n=2)[1] == 420.0 and calls == [150.0, 150.0, 420.0, 420.0]


def test_as_shipped_the_hold_is_left_alone() -> None:
    hold = _Hold()
    ev, calls = _evaluation(hold)
    assert _Evaluation._floor_tails(ev, None, n=5)[1] == 1000.0
    assert calls == [1000.0] * 5


def test_the_hold_is_restored_when_an_empty_call_fails() -> None:
    hold = _Hold()
    ev = SimpleNamespace(dev=SimpleNamespace(hold=lambda: hold, window=lambda fn, flush: 1 / 0), flush=None)
    with pytest.raises(ZeroDivisionError):
        _Evaluation._floor_tails(ev, 300.0)
    assert hold.us == 1000.0


def test_the_arm_is_validated_and_recorded_as_an_override() -> None:
    assert GraderConfig().floor_hold_us is None and "floor_hold_us" not in GraderConfig().overrides()
    assert GraderConfig(floor_hold_us=150.0).overrides() == {"floor_hold_us": 150.0}
    with pytest.raises(ValueError, match="floor_hold_us"):
        GraderConfig(floor_hold_us=10.0)


def test_the_arm_reaches_the_worker_through_the_jobs_config() -> None:
    cfg = GraderConfig(floor_hold_us=150.0)
    assert GraderConfig.from_dict(cfg.as_dict()) == cfg


@pytest.mark.parametrize("arm,expected", [(None, None), (150.0, 150.0)])
def test_the_timing_phase_takes_both_floors_with_the_configs_hold(tmp_path, fake_dsl, cpu_config, monkeypatch, arm,
                                                                  expected) -> None:
    """The wiring, in process: a CPU evaluation of a passing kernel asks `_floor_tails` for the arm's hold twice
    (before and after the loop) and the floors are their own phase both times."""
    import dataclasses

    from fake_dsl import TORCH_BASELINE_28
    from mkb.grader import _grade
    from mkb.grader import _harness

    seen: list[float | None] = []
    real = _harness._Evaluation._floor_tails

    def spy(self, hold_us, n=FLOOR_CALLS):
        seen.append(hold_us)
        return real(self, hold_us, n)

    monkeypatch.setattr(_harness._Evaluation, "_floor_tails", spy)
    cfg = dataclasses.replace(cpu_config, floor_hold_us=arm) if arm is not None else cpu_config
    if arm is not None:  # the arm's range check reads mkb.measure's constants; the CPU run has no hold to set
        assert cfg.overrides()["floor_hold_us"] == arm
    kernel = tmp_path / "kernel.py"
    kernel.write_text(TORCH_BASELINE_28)
    job = {**_grade.plan_job_fields(28, fake_dsl, cfg, "h" * 64), "kernel_path": str(kernel), "secret": 11}
    sent: list[dict] = []
    _harness.evaluate(job, sent.append)
    stages = {m["stage"]: m for m in sent if m.get("type") == "stage"}
    assert stages["timing"]["ok"], stages["timing"]
    assert seen == [expected, expected]
    phases = next(m for m in sent if m.get("type") == "timeline")["phases_s"]
    assert "run.floor_tails" in phases and stages["timing"]["figures"]["floor_hold_us"] is None  # no hold off the GPU


def test_a_bench_run_of_the_arm_says_it_is_not_the_shipped_grader() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import grader_bench

    assert grader_bench.summary({"config_overrides": {"floor_hold_us": 150.0}}).startswith(
        "FIGURE config: NOT the grader as shipped")
    assert "NOT the grader" not in grader_bench.summary({"config_overrides": {}})
