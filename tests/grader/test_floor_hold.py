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
        self.us, self.seen = self.default_us, []

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
    tails = _Evaluation._floor_tails(ev, 150.0)
    assert tails == [7.0] * FLOOR_CALLS and calls == [150.0] * FLOOR_CALLS and hold.us == 1000.0


def test_as_shipped_the_hold_is_left_alone() -> None:
    hold = _Hold()
    ev, calls = _evaluation(hold)
    _Evaluation._floor_tails(ev, None, n=5)
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
