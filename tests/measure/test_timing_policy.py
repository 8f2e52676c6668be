"""The stream-window policy's pieces that run without a GPU: the side-work figure, the flush kinds, the policy id."""

from __future__ import annotations

import pytest

from mkb.measure import FLUSH_KIND, TIMING_POLICY, L2Flusher, side_work_us, summarize


def test_side_work_is_the_median_tail_beyond_an_empty_calls():
    assert side_work_us([10.0, 11.0, 12.0], [10.0, 11.0, 12.0]) == 0.0
    assert side_work_us([210.0, 211.0, 12.0], [10.0, 11.0, 12.0]) == pytest.approx(199.0)
    assert side_work_us([], [1.0]) == 0.0


def test_unknown_flush_kind_is_refused_with_a_hint():
    with pytest.raises(ValueError, match="hint"):
        L2Flusher("cpu", kind="bogus")


def test_the_policy_is_named_in_every_summary():
    t = summarize([1.0, 2.0, 3.0], tail_us_median=5.0)
    assert t.policy == TIMING_POLICY and t.tail_us_median == 5.0
    assert FLUSH_KIND in TIMING_POLICY


class _FakeGpu:
    """The window's CUDA primitives as a log: which step happened in which order, and when the flush 'ends'."""

    def __init__(self, flush_polls: int = 3) -> None:
        self.log: list[str] = []
        self.polls_left = flush_polls

    def install(self, monkeypatch) -> None:
        import mkb.measure._timing as T

        gpu = self

        class Ev:
            def __init__(self, enable_timing: bool = False) -> None:
                self.name = "timed" if enable_timing else "flushed"

        def record(ev):
            gpu.log.append(f"record:{ev.name}")

        def query(ev):
            gpu.polls_left -= 1
            done = gpu.polls_left <= 0
            gpu.log.append(f"query:{done}")
            return done

        monkeypatch.setattr(T, "_sync", lambda device=None: gpu.log.append("sync"))
        monkeypatch.setattr(T, "_Event", Ev)
        monkeypatch.setattr(T, "_record", record)
        monkeypatch.setattr(T, "_Event_query", query)
        monkeypatch.setattr(T, "_elapsed", lambda a, b: 0.001)
        monkeypatch.setattr(T, "_ev_sync", lambda ev: gpu.log.append("ev_sync"))
        monkeypatch.setattr(T, "wait_device", lambda device=None: gpu.log.append("wait"))


def test_the_call_is_dispatched_only_once_the_flush_ended_and_the_hold_is_enqueued(monkeypatch):
    """Work the call puts on another stream must find every SM held: the host waits for the flush's end
    (the hold is next in the stream) before it calls fn, and the start event follows the hold."""
    from mkb.measure import stream_window

    gpu = _FakeGpu(flush_polls=3)
    gpu.install(monkeypatch)
    result, us, tail = stream_window(lambda: gpu.log.append("fn") or 7, flush=lambda: gpu.log.append("flush"),
                                     hold=lambda: gpu.log.append("hold"))
    assert result == 7 and us == pytest.approx(1.0) and tail == pytest.approx(1.0)
    assert gpu.log[:4] == ["sync", "flush", "record:flushed", "hold"]
    i_fn = gpu.log.index("fn")
    assert gpu.log.index("record:timed") < i_fn  # start before the call
    assert gpu.log[i_fn - 1] == "query:True" and gpu.log.count("query:False") == 2  # the host waited for the flush
    assert gpu.log[i_fn + 1:] == ["record:timed", "wait", "record:timed", "ev_sync"]


def test_without_a_hold_the_host_does_not_wait(monkeypatch):
    from mkb.measure import stream_window

    gpu = _FakeGpu()
    gpu.install(monkeypatch)
    stream_window(lambda: gpu.log.append("fn"), flush=lambda: gpu.log.append("flush"), hold=None)
    assert gpu.log[:4] == ["sync", "flush", "record:timed", "fn"] and not any(e.startswith("query") for e in gpu.log)


def test_the_host_dispatch_of_every_timed_call_is_recorded_beside_its_time():
    from mkb.measure import perf_window, timed_loop

    rec = timed_loop(lambda x: x, lambda i: (i,), warmup=2, timed=5, window=perf_window)
    assert len(rec.host_us) == len(rec.times_us) == 5 and all(h >= 0 for h in rec.host_us)


class _FakeHold:
    def __init__(self) -> None:
        self.default_us = 1000.0
        self.us = 1000.0
        self.seen: list[float] = []

    def set_us(self, us: float) -> None:
        self.us = us
        self.seen.append(us)


def test_the_timed_calls_run_behind_a_hold_of_twice_the_warm_ups_dispatch_within_bounds(monkeypatch):
    """A 40 us dispatch must not pay a millisecond per call; a slow one must stay hidden; one host hiccup
    in the warm-ups does not set it; the default returns after. (A fake clock: the loop's perf_counter.)"""
    import mkb.measure._timing as T
    from mkb.measure import HOLD_MAX_US, HOLD_MIN_US, perf_window, timed_loop

    clock = [0.0]
    monkeypatch.setattr(T.time, "perf_counter", lambda: clock[0])
    cases = ((lambda k: 40e-6, HOLD_MIN_US), (lambda k: 450e-6, 900.0), (lambda k: 5e-3, HOLD_MAX_US),
             (lambda k: 30e-3 if k == 0 else 100e-6, 200.0))  # one 30 ms hiccup among 5 warm-ups
    for dispatch_s, expect in cases:
        hold = _FakeHold()
        holds_at_call: list[float] = []
        n = [0]

        def fn(i, dispatch_s=dispatch_s, hold=hold):
            holds_at_call.append(hold.us)
            clock[0] += dispatch_s(n[0])
            n[0] += 1
            return i

        rec = timed_loop(fn, lambda i: (i,), warmup=5, timed=4, window=perf_window, hold=hold)
        assert holds_at_call[:5] == [1000.0] * 5  # warm-ups behind the default
        assert holds_at_call[5:] == pytest.approx([expect] * 4) and rec.hold_us == pytest.approx(expect)
        assert hold.us == hold.default_us  # restored


def test_the_loop_splits_its_wall_time_into_its_parts(monkeypatch) -> None:
    """Each part of a call gets exactly the seconds spent in it (a fake clock each part advances by its own amount),
    warm-ups included, and a loop stopped early counts only the calls it ran."""
    import types

    from mkb.measure import _timing
    from mkb.measure import LOOP_PARTS, timed_loop

    now = [0.0]
    monkeypatch.setattr(_timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def spend(s: float):
        now[0] += s

    def window(f):
        spend(0.010)
        return f(), 5.0, 1.0

    def between(k, rec) -> bool:
        spend(0.300)
        return k == 2  # stop after the third timed call

    rec = timed_loop(lambda x: spend(0.0001) or x, lambda i: spend(0.002) or (i,), warmup=2, timed=10,
                     window=window, before_call=lambda i: spend(0.0005), after_call=lambda k, r, a, us: spend(0.04),
                     between_calls=between)
    calls = 2 + 3
    assert rec.calls == calls and rec.stopped_after == 2 and set(rec.split_s) == set(LOOP_PARTS)
    want = {"inputs": 0.002, "before": 0.0005, "window": 0.0101, "after": 0.04, "between": 0.3}
    assert rec.split_s == pytest.approx({k: v * calls for k, v in want.items()})
