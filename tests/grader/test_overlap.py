"""Two gradings in flight on one device (grader 2.12): shared phases side by side, every timing phase alone, and a
failure a neighbour could have caused graded again alone with the first grading's events kept as superseded."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fake_dsl import TORCH_BASELINE_28
from mkb.grader import GradeJob, GradingQueue, Verdict
from mkb.grader import _grade
from mkb.grader._pool import GpuQuiet, quiet_for, replay_phases
from mkb.grader._queue import neighbour_could_cause


class _Spare:
    """What `GpuQuiet` reads of a spare worker (its `go` goes to `sent`)."""

    def __init__(self, pid: int) -> None:
        self.pid, self._forgotten, self.go_at, self.imported_at, self.sent = pid, False, None, time.monotonic(), []
        self._urgent = self._deferred = False

    def _send(self, msg: dict) -> None:
        self.sent.append(msg)


def _in_thread(fn, *args, **kw) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        box["waited"] = fn(*args, **kw)
        box["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def replay(history) -> dict[str, int]:
    """The coordinator's history replayed (mkb.grader._pool.replay_phases); fails where a timing phase ran beside
    another grading's phase."""
    r = replay_phases(history)
    assert not r.beside_timing, r.beside_timing
    return {"most_at_once": r.most_at_once, "holds": r.exclusive_holds}


def test_the_replay_finds_a_timing_phase_beside_another_gradings_phase():
    r = replay_phases([(1.0, "share:setup", 1), (2.0, "hold:timing", 2), (3.0, "go", 9), (4.0, "unshare", 1),
                       (5.0, "hold:timing", 1), (6.0, "release", 2), (7.0, "warmed", 9), (8.0, "hold:timing", 2)])
    assert r.beside_timing == ("hold:timing of 2 at 2.000000 beside the phases of [1]",
                               "hold:timing of 1 at 5.000000 beside the phases of [2]",
                               "hold:timing of 2 at 8.000000 beside the phases of [1]")
    assert r.most_at_once == 2 and r.exclusive_holds == 3 and r.warm_ups_beside_timing == 1


# ---------------- the coordinator: shared and exclusive phases ----------------

def test_shared_phases_run_side_by_side_and_a_timing_phase_waits_for_them():
    q = GpuQuiet("cpu:81")
    a, b = object(), object()
    assert q.share(a, "setup") < 0.05 and q.share(b, "setup") < 0.05  # side by side, at once
    t, box = _in_thread(q.hold, a, "timing", timeout=0.0)
    time.sleep(0.2)
    assert "waited" not in box and q.busy()["pending"] == 1  # b's compile still runs: a's timing waits
    assert a not in q.busy()["shared"]  # its own shared phase ended first: a grading never waits while it holds
    t_release = time.monotonic()
    q.release(b)
    t.join(5)
    assert box["at"] >= t_release and q.busy()["holds"] == {a: "timing"}
    q.release(a)
    assert q.busy() == {"holds": {}, "shared": {}, "pending": 0, "waiting": [], "warming": [], "untimed": 0}


def test_a_waiting_timing_phase_stops_new_shared_phases_until_it_has_run():
    q = GpuQuiet("cpu:82")
    a, b, c = object(), object(), object()
    q.share(a, "compile")
    hold, hbox = _in_thread(q.hold, b, "timing", timeout=0.0)
    time.sleep(0.1)
    share, sbox = _in_thread(q.share, c, "setup")
    time.sleep(0.2)
    assert "waited" not in hbox and "waited" not in sbox  # c may not slip in ahead of b's pending timing phase
    q.release(a)
    hold.join(5)
    time.sleep(0.1)
    assert "waited" in hbox and "waited" not in sbox  # b times alone
    t_end = time.monotonic()
    q.share(b, "after:timing")  # b's timing ends: back to shared, beside c
    share.join(5)
    assert sbox["at"] >= t_end and set(q.busy()["shared"]) == {b, c}
    q.release(b)
    q.release(c)


def test_two_timing_phases_never_overlap_and_a_killed_holder_releases_both_kinds():
    q = GpuQuiet("cpu:83")
    a, b = _Spare(1), _Spare(2)  # tokens that forget() can mark
    q.hold(a, "timing", pid=1)
    t, box = _in_thread(q.hold, b, "timing", pid=2, timeout=0.0)
    time.sleep(0.2)
    assert "waited" not in box
    q.forget(a)  # its worker was killed mid-timing
    t.join(5)
    assert q.busy()["holds"] == {b: "timing"}
    q.share(b, "after:timing", pid=2)
    q.forget(b)
    assert not q.busy()["shared"] and not q.busy()["holds"]
    assert replay(q.history)["holds"] == 2


def test_spares_warm_up_beside_shared_phases_but_never_beside_a_timing_phase():
    q = GpuQuiet("cpu:84")
    q.defer_s = 0.0
    grading = object()
    q.share(grading, "compile")
    s1 = _Spare(1)
    q.want_go(s1)
    assert s1.go_at is not None  # a compile beside a warm-up is the pool's rule since 2.0
    q.warmed(s1)
    q.hold(grading, "timing", timeout=0.0)
    s2 = _Spare(2)
    q.want_go(s2)
    assert s2.go_at is None
    q.share(grading, "after:timing")  # the timing phase's end lets it go
    assert s2.go_at is not None
    q.warmed(s2)
    q.release(grading)


def test_a_timing_phase_waits_for_warm_ups_only_as_long_as_its_timeout():
    q = GpuQuiet("cpu:85")
    q.defer_s = 0.0
    s = _Spare(1)
    q.want_go(s)  # warming, never `warmed`
    t0 = time.monotonic()
    waited = q.hold(object(), "timing", timeout=0.3)
    assert 0.25 <= waited and time.monotonic() - t0 < 5
    q.forget(s)


# ---------------- the queue: slots, batches, superseded gradings ----------------

class _NullWriter:
    def emit(self, *a, **k) -> str:
        return ""

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Gated:
    """Stands in for one grading: each call waits at its own gate; records which ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.seen_at_once: list[set[str]] = []
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.kw: dict[str, dict] = {}

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def begun(self, name: str) -> threading.Event:
        with self.lock:
            return self.started.setdefault(name, threading.Event())

    def __call__(self, problem, dsl, kernel_path, **kw):
        name = Path(kernel_path).stem
        with self.lock:
            self.running.add(name)
            self.seen_at_once.append(set(self.running))
            self.kw[name] = kw
        self.begun(name).set()
        assert self.gate(name).wait(30)
        with self.lock:
            self.running.discard(name)
        v = Verdict(evaluation_id=name, problem=problem, dsl=dsl, kernel_sha256="0" * 64, passed=True, reason=None,
                    speedup=1.0, eager_median_us=10.0, candidate_median_us=10.0, gpu="cpu")
        return v, {"eager": {"median_us": 10.0}}


def _job(name: str, experiment: str = "default", **kw) -> GradeJob:
    return GradeJob(problem=28, dsl="fake", kernel_path=Path(f"/snap/{name}.py"), experiment=experiment, **kw)


def test_in_flight_two_runs_two_jobs_at_once_and_a_batch_alone(monkeypatch):
    g = _Gated()
    monkeypatch.setattr(_grade, "grade_with", g)
    q = GradingQueue(device="cpu", writer=_NullWriter(), dsls=(), in_flight=2)
    try:
        a, b = q.submit(_job("a", "A")), q.submit(_job("b", "B"))
        assert g.begun("a").wait(10) and g.begun("b").wait(10)  # both in flight
        batch = q.submit_batch([_job("p1", "P", scope="pair"), _job("p2", "P", scope="pair")])
        c = q.submit(_job("c", "C"))
        g.gate("a").set()
        a.result(10)
        time.sleep(0.3)
        assert not g.begun("p1").is_set() and not g.begun("c").is_set()  # the batch is next and waits for b
        g.gate("b").set()
        assert g.begun("p1").wait(10)
        time.sleep(0.2)
        assert not g.begun("c").is_set()  # nothing beside a batch
        g.gate("p1").set()
        g.gate("p2").set()
        [f.result(10) for f in batch]
        g.gate("c").set()
        c.result(10)
    finally:
        for e in ("a", "b", "p1", "p2", "c"):
            g.gate(e).set()
        q.close()
    assert {"a", "b"} in g.seen_at_once
    assert all(len(s) == 1 for s in g.seen_at_once if s & {"p1", "p2"})
    assert g.kw["a"]["in_flight"] == 2 and g.kw["a"]["supersede"] is not None
    assert q.prefetch is False  # the next job starts at once instead of being made ahead
    assert q.busy_s > 0


def test_in_flight_is_checked():
    with pytest.raises(ValueError, match="in_flight=3"):
        GradingQueue(device="cpu", writer=_NullWriter(), dsls=(), in_flight=3)


def test_neighbour_could_cause():
    def v(reason, message=""):
        return Verdict(evaluation_id="e", problem=1, dsl="fake", kernel_sha256="0", passed=reason is None, reason=reason,
                       speedup=None, eager_median_us=None, candidate_median_us=None, gpu="cpu", message=message)

    for r in ("runtime_error", "crash", "timeout", "compile_timeout", "infra_error"):
        assert neighbour_could_cause(v(r))
    for r in ("wrong_output", "integrity_stream", "compile_error", "static_forbidden_import"):
        assert not neighbour_could_cause(v(r))
    assert neighbour_could_cause(v("compile_error", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"))
    assert not neighbour_could_cause(v(None))


_FAILS_AT_ONCE = "def solve(x, residual, weight):\n    raise RuntimeError('boom')\n"

_SLOW = '''import time
import torch

_calls = [0]


def solve(x, residual, weight):
    _calls[0] += 1
    if _calls[0] == 1:
        time.sleep(3.0)
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''


@pytest.mark.parametrize("in_flight", [2, 1])
def test_real_gradings_overlap_and_a_failure_beside_another_is_graded_again_alone(tmp_path, fake_dsl, cpu_config,
                                                                                   store, in_flight):
    import json

    import polars as pl

    from mkb.events import read

    good, slow, bad = tmp_path / "good.py", tmp_path / "slow.py", tmp_path / "bad.py"
    good.write_text(TORCH_BASELINE_28)
    slow.write_text(_SLOW)
    bad.write_text(_FAILS_AT_ONCE)
    device = f"cpu:{70 + in_flight}"
    quiet = quiet_for(device)
    since = time.monotonic()
    with GradingQueue(device=device, store=store, config=cpu_config, dsls=(fake_dsl,), in_flight=in_flight,
                      depth=2) as q:
        q.pool.wait_warm(120)
        futs = [q.submit(GradeJob(28, fake_dsl, p, experiment=e)) for p, e in
                ((slow, "A"), (bad, "B"), (good, "A"), (good, "B"))]
        verdicts = [f.result(300) for f in futs]
    assert [v.passed for v in verdicts] == [True, False, True, True], [v.message for v in verdicts]
    assert verdicts[1].reason == "runtime_error"
    seen = replay([e for e in quiet.history if e[0] >= since])  # no timing phase ever ran beside another grading's phase
    assert seen["holds"] >= 3
    rows = read("verdict", store)
    details = {r["evaluation_id"]: json.loads(r["details"]) for r in rows.iter_rows(named=True)}
    assert all(d["in_flight"]["queue"] == in_flight for d in details.values())
    if in_flight == 1:
        assert seen["most_at_once"] == 1 and rows.height == 4 and verdicts[1].supersedes is None
        assert rows.filter(pl.col("scope") == "superseded").height == 0
        return
    assert seen["most_at_once"] == 2  # the slow kernel's compile and the failing one's ran side by side
    first = rows.filter(pl.col("scope") == "superseded")
    assert first.height == 1 and first["reason"][0] == "runtime_error" and first["kernel_sha256"][0] == verdicts[1].kernel_sha256
    assert verdicts[1].supersedes == first["evaluation_id"][0]  # the producer's verdict is the one graded alone
    assert details[verdicts[1].evaluation_id]["supersedes"] == first["evaluation_id"][0]
    assert rows.filter(pl.col("scope") == "submission").height == 4  # every job counted once
    assert q.regraded_alone == 1
    # the first grading's stage events are kept too (the log loses nothing)
    assert first["evaluation_id"][0] in set(read("compile", store)["evaluation_id"].to_list())
