"""Requests are paced to a model's rpm/tpm for every attempt of a process, and the wait is charged like backoff."""

from __future__ import annotations

import threading

import pytest

from mkb.agent._pace import RateLimiter, limiter_for, set_rate_limits


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_rpm_admits_that_many_requests_per_window_then_waits_for_the_oldest():
    c = Clock()
    lim = RateLimiter(rpm=2, clock=c, sleep=c.sleep)
    assert lim.acquire(10)[1] == 0 and lim.acquire(10)[1] == 0
    c.t = 15.0
    _, waited = lim.acquire(10)
    assert waited == pytest.approx(45.0)  # the first request leaves the 60 s window at t = 60
    assert c.t == pytest.approx(60.0)


def test_tpm_counts_what_the_provider_counted_not_the_estimate():
    c = Clock()
    lim = RateLimiter(tpm=1000, clock=c, sleep=c.sleep)
    e, _ = lim.acquire(900)  # estimate: would leave no room for a second 900-token request
    lim.settle(e, 100)  # the provider counted 100
    assert lim.acquire(900)[1] == 0
    _, waited = lim.acquire(50)  # 100 + 900 + 50 > 1000: wait for the first to leave the window
    assert waited == pytest.approx(60.0)


def test_an_empty_window_admits_one_request_larger_than_tpm():
    c = Clock()
    assert RateLimiter(tpm=10, clock=c, sleep=c.sleep).acquire(500)[1] == 0


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="rpm"):
        RateLimiter(rpm=0)


def test_concurrent_acquires_never_exceed_rpm_in_a_window():
    lim = RateLimiter(rpm=5, window_s=0.5)
    stamps: list[float] = []
    lock = threading.Lock()

    def one():
        e, _ = lim.acquire(1)
        with lock:
            stamps.append(e.t)

    ts = [threading.Thread(target=one) for _ in range(12)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    stamps.sort()
    assert len(stamps) == 12
    assert all(stamps[i + 5] - stamps[i] >= 0.5 - 1e-6 for i in range(len(stamps) - 5))


def test_a_paced_attempt_records_the_wait_as_backoff(runner, monkeypatch):
    import mkb.agent._llm as llm
    from test_loop import CLOSING, FINISH

    lim = RateLimiter(rpm=1, window_s=2.0)  # the closing turn's request must wait for the first to leave the window
    monkeypatch.setattr(llm, "limiter_for", lambda name, base=None: lim if name == "openai/scripted" else None)
    res = runner.run([{"tool_calls": [FINISH]}, CLOSING])
    assert res.stop_reason == "finished"
    turns = runner.events("turn").to_dicts()
    assert len(turns) == 2 and turns[0]["backoff_s"] == 0 and turns[1]["backoff_s"] > 0.5
    fin = runner.events("attempt_finished").to_dicts()[0]
    assert fin["backoff_s"] == pytest.approx(sum(t["backoff_s"] for t in turns))


def test_the_registry_sets_and_removes_a_models_limits():
    set_rate_limits("m", "http://x", rpm=3)
    try:
        assert limiter_for("m", "http://x").rpm == 3 and limiter_for("m") is None
    finally:
        set_rate_limits("m", "http://x")
    assert limiter_for("m", "http://x") is None
