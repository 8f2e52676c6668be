"""The clock warm-up's rule (grader 2.23): one round when the SM clock reads boosted before any work and after that
round, else at least 30 ms, else (no reading) the whole fixed time; an A/B arm's minimum always holds."""

from __future__ import annotations

import pytest

from mkb.grader._config import GraderConfig
from mkb.grader._harness import CLOCK_WARM_MIN_S, warm_until_boosted

MAX = 1980.0


class FakeGpu:
    """A clock that reads `readings` in turn (the last repeats) and a work round that takes `round_s` of fake time."""

    def __init__(self, readings: list[float | None], round_s: float = 0.002) -> None:
        self.readings, self.round_s, self.now, self.reads = list(readings), round_s, 0.0, 0

    def read(self) -> float | None:
        self.reads += 1
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def work(self) -> None:
        self.now += self.round_s

    def clock(self) -> float:
        return self.now


def test_a_clock_boosted_before_any_work_ends_after_one_round():
    g = FakeGpu([MAX, MAX])
    fig = warm_until_boosted(g.work, g.read, MAX, seconds=0.3, clock=g.clock)
    assert (fig["rounds"], fig["by"], fig["min_s"], fig["first_mhz"], fig["last_mhz"]) == (1, "clock", 0.0, MAX, MAX)
    assert fig["s"] == pytest.approx(0.002)


def test_a_boosted_first_reading_does_not_end_it_when_the_clock_then_reads_low():
    g = FakeGpu([MAX, 1200.0, 1500.0, 1900.0])
    fig = warm_until_boosted(g.work, g.read, MAX, seconds=0.3, clock=g.clock)
    assert (fig["rounds"], fig["by"], fig["last_mhz"]) == (3, "clock", 1900.0)


def test_a_low_first_reading_keeps_the_minimum():
    g = FakeGpu([345.0, MAX])
    fig = warm_until_boosted(g.work, g.read, MAX, seconds=0.3, clock=g.clock)
    assert fig["min_s"] == CLOCK_WARM_MIN_S and fig["by"] == "clock"
    assert fig["s"] >= CLOCK_WARM_MIN_S and fig["rounds"] == round(CLOCK_WARM_MIN_S / 0.002)


def test_an_ab_arms_minimum_holds_even_when_boosted():
    g = FakeGpu([MAX])
    fig = warm_until_boosted(g.work, g.read, MAX, seconds=0.3, min_s=0.03, clock=g.clock)
    assert fig["min_s"] == 0.03 and fig["s"] >= 0.03 and fig["by"] == "clock"


def test_a_clock_that_never_boosts_lasts_the_fixed_time():
    g = FakeGpu([345.0])
    fig = warm_until_boosted(g.work, g.read, MAX, seconds=0.1, clock=g.clock)
    assert fig["by"] == "time" and fig["s"] >= 0.1 and fig["last_mhz"] == 345.0


def test_without_nvml_it_lasts_the_fixed_time_and_reads_nothing():
    g = FakeGpu([MAX])
    fig = warm_until_boosted(g.work, None, None, seconds=0.05, clock=g.clock)
    assert fig["by"] == "time" and fig["s"] >= 0.05 and fig["first_mhz"] is None and g.reads == 0
    g2 = FakeGpu([None])
    fig2 = warm_until_boosted(g2.work, g2.read, MAX, seconds=0.05, clock=g2.clock)
    assert fig2["by"] == "time" and fig2["min_s"] == CLOCK_WARM_MIN_S


def test_the_config_arm_is_recorded_and_checked():
    assert GraderConfig().clock_warm_min_s is None and "clock_warm_min_s" not in GraderConfig().overrides()
    assert GraderConfig(clock_warm_min_s=0.03).overrides()["clock_warm_min_s"] == 0.03
    with pytest.raises(ValueError, match="clock_warm_min_s"):
        GraderConfig(clock_warm_min_s=1.0)
    with pytest.raises(ValueError, match="clock_warm_min_s"):
        GraderConfig(clock_warm_min_s=-0.01)
