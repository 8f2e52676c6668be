"""A prefetch pauses for a timing phase (grader 2.13): the hold asks it to yield, the worker stops after its current
expectation, syncs and answers `yielded`, and is resumed once quiet is back; the plan is the one it would have made."""

from __future__ import annotations

import threading
import time

from mkb.grader import GraderConfig, Worker
from mkb.grader import _grade
from mkb.grader._pool import GpuQuiet, replay_phases
from mkb.grader._prefetch import Prepared, plan_key


def _fields(cfg: GraderConfig, dsl: str = "fake") -> dict:
    return _grade.plan_job_fields(28, dsl, cfg, "h" * 64)


def test_pausing_at_the_yield_points_makes_the_same_plan(fake_dsl, cpu_config):
    from mkb.grader import _harness

    msg = {**_fields(cpu_config), "secret": 777}
    calls: list[int] = []

    def point(sync) -> float:  # every yield point pauses: the most the plan can be cut up
        sync()
        calls.append(1)
        return 0.01

    paused = _harness.prepare(msg, yield_point=point)
    cut = _harness._take_prepared({**msg, "kernel_path": "/k.py"})["plan"]
    whole = _harness.prepare(msg)
    plain = _harness._take_prepared({**msg, "kernel_path": "/k.py"})["plan"]
    assert paused["ok"] and whole["ok"] and paused["key"] == whole["key"]
    # one yield point after each expectation: the draws, the re-check sets (the final one has nothing after it)
    assert len(calls) == cpu_config.draws + len(plain.recheck_sets)
    assert paused["yields"] == len(calls) and paused["paused_s"] >= 0.01 * len(calls) and whole["yields"] == 0
    assert [s for s, _ in cut.draws] == [s for s, _ in plain.draws]
    for (_, a), (_, b) in zip(cut.draws, plain.draws):
        assert a.tolerance == b.tolerance and all(
            (x is None and y is None) or bool((x == y).all()) for x, y in zip(a.reference + a.anchor, b.reference + b.anchor))
    assert cut.final_seed == plain.final_seed and cut.recheck_sets.keys() == plain.recheck_sets.keys()


class _ScriptedWorker:
    """The parent's view of a preparing worker: answers `yield` with `yielded` and `resume` with `prepared`."""

    _forgotten = _urgent = _deferred = False
    pid = 41
    imported_at = None

    def __init__(self, quiet: GpuQuiet) -> None:
        self.quiet, self.sent, self.key = quiet, [], None
        self._replies: list[dict] = []
        self._cv = threading.Condition()
        self.reader = self
        self.killed = False

    def _send(self, msg: dict) -> None:
        with self._cv:
            self.sent.append(msg["type"])
            if msg["type"] == "yield":
                self._replies.append({"type": "yielded"})
            elif msg["type"] == "resume":
                self._replies.append({"type": "prepared", "ok": True, "key": self.key, "prepare_s": 0.1, "paused_s": 0.5})
            self._cv.notify_all()

    def read(self, deadline: float):
        with self._cv:
            while not self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                self._cv.wait(left)
            return self._replies.pop(0)

    def alive(self) -> bool:
        return True

    def kill(self, wait: bool = True) -> None:
        self.killed = True

    def cleanup(self) -> None:
        pass


def _sent_prepare(q: GpuQuiet, cfg: GraderConfig) -> tuple[_ScriptedWorker, Prepared]:
    """A prefetch started on a scripted worker of `q`, once its prepare is sent (it is then on the warming set)."""
    w = _ScriptedWorker(q)
    p = Prepared.for_job(w, "job", _fields(cfg))
    w.key = p.key
    p.start(send_prepare=lambda: w.sent.append("prepare"))
    deadline = time.monotonic() + 10
    while p.state != "sent" and time.monotonic() < deadline:
        time.sleep(0.01)
    return w, p


def test_a_pending_hold_pauses_a_running_prepare_instead_of_waiting_for_all_of_it(fake_dsl, cpu_config):
    q = GpuQuiet("cpu:93")
    w, p = _sent_prepare(q, cpu_config)
    assert p.state == "sent" and q.busy()["warming"] == [41]
    holder = object()
    waited = q.hold(holder, "timing", pid=7, timeout=30)  # it would wait up to 30 s for a prepare that never ends
    assert waited < 10 and w.sent == ["prepare", "yield"] and q.busy()["warming"] == []
    time.sleep(0.2)
    assert w.sent == ["prepare", "yield"]  # no resume while the timing phase holds
    q.release(holder, pid=7)
    worker, rec = p.claim(timeout=10)
    assert worker is w and rec["state"] == "ready" and rec["yields"] == 1 and rec["paused_s"] == 0.5
    assert w.sent == ["prepare", "yield", "resume"] and not w.killed
    events = [e for _, e, pid in q.history if pid in (41, 7)]
    assert events == ["prepare", "yield", "yielded", "hold:timing", "release", "prepare", "warmed"]
    r = replay_phases(list(q.history))
    assert r.warm_ups_beside_timing == 0 and r.go_beside_timing == () and r.beside_timing == ()


def test_a_claim_waits_out_a_prepare_paused_past_the_limit_but_not_a_hung_one(fake_dsl, cpu_config, monkeypatch):
    """The prepare's limit is on preparing: a prepare held paused by a long timing phase is waited for by its job's
    claim (no fixed limit from the claim's start), while one that hangs is still failed and its worker killed."""
    from mkb.grader import _prefetch

    monkeypatch.setattr(_prefetch, "PREPARE_LIMIT_S", 1.0)
    q = GpuQuiet("cpu:94")
    w, p = _sent_prepare(q, cpu_config)
    holder = object()
    q.hold(holder, "timing", pid=7, timeout=30)  # pauses it
    threading.Timer(7.5, lambda: q.release(holder, pid=7)).start()  # paused past the limit and the 5 s grace
    t0 = time.monotonic()
    worker, rec = p.claim()
    assert time.monotonic() - t0 >= 7.0  # it waited through the pause
    assert worker is w and rec["state"] == "ready" and rec["yields"] == 1 and not w.killed, rec

    # holds that never end (one forged by a candidate, say): the claim still gives up at CLAIM_MAX_S
    monkeypatch.setattr(_prefetch, "CLAIM_MAX_S", 3.0)
    q3 = GpuQuiet("cpu:96")
    w3, p3 = _sent_prepare(q3, cpu_config)
    q3.hold(object(), "timing", pid=8, timeout=30)  # pauses it, never released
    t0 = time.monotonic()
    worker, rec = p3.claim()
    assert worker is None and rec["state"] == "failed" and w3.killed and 2.5 < time.monotonic() - t0 < 6, rec

    hung = _ScriptedWorker(GpuQuiet("cpu:95"))
    p2 = Prepared.for_job(hung, "job", _fields(cpu_config))
    p2.start(send_prepare=lambda: hung.sent.append("prepare"))  # never answers
    t0 = time.monotonic()
    worker, rec = p2.claim()
    assert worker is None and rec["state"] == "failed" and hung.killed, rec
    assert time.monotonic() - t0 < 1.0 + 5 + 2


def test_a_real_worker_yields_between_expectations_and_resumes(fake_dsl, cpu_config):
    w = Worker(fake_dsl, device="cpu")
    try:
        assert w.wait_ready(120), w.ready_error
        msg = {**_fields(cpu_config, fake_dsl), "secret": 4242}
        w.send_job({"type": "prepare", **msg})
        w.send_job({"type": "yield"})  # already waiting when the first yield point looks
        first = w.reader.read(time.monotonic() + 60)
        assert first == {"type": "yielded"}
        time.sleep(0.2)
        w.send_job({"type": "resume"})
        reply = w.reader.read(time.monotonic() + 60)
        assert reply["type"] == "prepared" and reply["ok"] and reply["key"] == plan_key(msg), reply
        assert reply["yields"] == 1 and reply["paused_s"] >= 0.2
        w.send_job({"type": "yield"})  # one that comes after the plan is done is skipped by the job loop
        assert w.alive()
    finally:
        w.kill()
        w.cleanup()


def test_a_hold_whose_yield_ask_raises_still_counts_itself_out(fake_dsl, cpu_config):
    """Whatever an ask raises, the hold's pending count comes down, or no spare would ever be sent `go` again."""
    q = GpuQuiet("cpu:94")
    w = _ScriptedWorker(q)

    def broken_ask() -> None:
        raise RuntimeError("the pipe object is in a state nobody planned for")

    assert q.side_work(w, lambda: None, cancel=threading.Event(), timeout=5, on_hold=broken_ask)
    holder = object()
    waited = q.hold(holder, "timing", pid=7, timeout=0.2)  # the prepare never pauses: the hold waits its timeout
    assert 0.15 <= waited < 5
    assert q.busy()["pending"] == 0 and q.busy()["holds"] == {holder: "timing"}
    assert (41, "yield_failed:RuntimeError") in [(pid, e) for _, e, pid in q.history]
    q.release(holder, pid=7)
    q.warmed(w)
    assert q.busy() == {"holds": {}, "pending": 0, "waiting": [], "warming": [], "untimed": 0}
