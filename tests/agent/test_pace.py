"""Requests are paced to a model's rpm/tpm for every attempt sharing a book, and the wait is charged like backoff."""

from __future__ import annotations

import random
import threading

import pytest

from mkb.agent._pace import PaceBook, PacingUnavailable, RateLimiter, limiter_for, set_limiter, set_rate_limits


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


# ---- the reservation book (shared by the process-local limiter and the cluster's actor) -----------------------------

def _window_ok(booked: list[tuple[float, int]], *, rpm: int | None, tpm: int | None, window_s: float) -> bool:
    """Every window (s - window_s, s] ending at a slot holds <= rpm requests and <= tpm tokens (one request alone may exceed tpm)."""
    for s, _ in booked:
        inside = [tok for t, tok in booked if t <= s < t + window_s]
        if rpm is not None and len(inside) > rpm:
            return False
        if tpm is not None and len(inside) > 1 and sum(inside) > tpm:
            return False
    return True


def test_the_book_grants_future_slots_in_arrival_order_and_counts_them_in_the_window():
    b = PaceBook(rpm=2, window_s=60.0)
    assert [b.reserve(0.0, 1).t, b.reserve(0.0, 1).t] == [0.0, 0.0]
    assert b.reserve(1.0, 1).t == 60.0  # both slots at 0 leave the window at 60
    assert b.reserve(2.0, 1).t == 60.0
    assert b.reserve(3.0, 1).t == 120.0  # the two booked at 60 fill that window: a booked slot counts before it is used
    assert _window_ok(b.booked(), rpm=2, tpm=None, window_s=60.0)


def test_a_small_request_does_not_overtake_a_large_one_waiting_for_tokens():
    b = PaceBook(tpm=1000, window_s=60.0)
    assert b.reserve(0.0, 800).t == 0.0
    assert b.reserve(1.0, 900).t == 60.0  # 800 + 900 > 1000
    assert b.reserve(2.0, 10).t == 60.0  # 10 would fit at 2 s, but arrival order holds: no arm's request starves


def test_settling_with_the_providers_count_frees_room_for_later_reservations():
    b = PaceBook(tpm=1000, window_s=60.0)
    r = b.reserve(0.0, 900)
    b.settle(r.id, 100)
    assert b.reserve(1.0, 900).t == 1.0
    assert b.reserve(2.0, 50).t == 60.0
    b.settle(10_000, 5)  # an id already pruned (or never booked) is ignored


def test_the_book_keeps_only_the_window_it_needs():
    b = PaceBook(rpm=3, window_s=1.0)
    for i in range(50):
        b.reserve(float(i), 1)
    assert len(b.booked()) == 1


@pytest.mark.parametrize("seed", range(20))
def test_random_traffic_never_exceeds_the_limits_and_each_slot_is_the_earliest_that_fits(seed):
    rng = random.Random(seed)
    rpm, tpm, w = rng.choice([None, 1, 3, 7]), rng.choice([None, 500, 2000]), rng.choice([1.0, 60.0])
    if rpm is None and tpm is None:
        rpm = 2
    b = PaceBook(rpm=rpm, tpm=tpm, window_s=w)
    now, granted, prev = 0.0, [], 0.0
    for _ in range(60):
        now += rng.expovariate(4.0 / w)
        est = rng.randint(1, 800)
        r = b.reserve(now, est)
        earlier = [t for t, _ in granted]
        assert r.t >= now and r.t >= prev
        assert r.t in (now, prev) or any(r.t == t + w for t in earlier)  # it waits only for an entry to leave the window
        start = max(now, prev)
        for c in [start] + [t + w for t in earlier if start < t + w < r.t]:  # no earlier moment would have fitted
            inside = [tok for t, tok in granted if t <= c < t + w]
            fits = not inside or ((rpm is None or len(inside) < rpm) and (tpm is None or sum(inside) + est <= tpm))
            assert c >= r.t or not fits, (c, r.t)
        final = rng.randint(0, est)  # the provider counts no more than the estimate (max_tokens bounds the output)
        b.settle(r.id, final)
        granted.append((r.t, final))
        prev = r.t
    assert _window_ok(granted, rpm=rpm, tpm=tpm, window_s=w)


def test_the_cluster_actor_answers_with_durations_and_paces_every_caller_together():
    from mkb.experiment._ray_pace import PaceActorImpl

    c = Clock()
    actor = PaceActorImpl(rpm=2, tpm=None, window_s=10.0, clock=c)
    waits = [actor.reserve(5)[2] for _ in range(3)]  # three callers in three processes, at once
    assert waits == [0.0, 0.0, 10.0]
    c.t = 4.0
    rid, slot, wait = actor.reserve(5)
    assert (slot, wait) == (10.0, 6.0)  # a duration, so the caller's own clock never matters
    actor.settle(rid, 7)
    assert actor.booked()[-1] == (10.0, 7)
    assert actor.configure(5, 100) == (5, 100)


def test_a_limiter_that_cannot_be_reached_fails_the_attempt_without_sending(runner, monkeypatch):
    import mkb.agent._llm as llm
    from test_loop import CLOSING, FINISH

    class Gone:
        def acquire(self, tokens):
            raise PacingUnavailable("model openai/scripted: the cluster's rate limiter did not answer: ActorDiedError\nhint: check `ray status`")

        def settle(self, r, tokens):
            raise AssertionError("nothing was sent, so nothing is settled")

    monkeypatch.setattr(llm, "limiter_for", lambda name, base=None: Gone())
    res = runner.run([{"tool_calls": [FINISH]}, CLOSING])
    assert res.stop_reason == "infra_error" and "openai/scripted" in res.error and "rate limiter" in res.error
    turns = runner.events("turn").to_dicts()
    assert len(turns) == 1 and "ActorDiedError" in turns[0]["error"] and not turns[0]["completion_tokens"]


def test_set_limiter_installs_any_limiter_and_none_removes_it():
    lim = RateLimiter(rpm=9)
    set_limiter("m2", None, lim)
    try:
        assert limiter_for("m2") is lim
    finally:
        set_limiter("m2", None, None)
    assert limiter_for("m2") is None
