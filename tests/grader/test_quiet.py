"""The quiet rule: a spare worker's GPU warm-up never runs while another worker of the same device is timing."""

from __future__ import annotations

import threading
import time

import pytest

from mkb.grader import GraderConfig, WorkerPool, grade
from mkb.grader._pool import Worker, quiet_for

QUIET = quiet_for("cpu")  # the coordinator of the CPU stand-in device these tests run on

# calls 1..4 are the compile call and the 3 verification draws of the quick config; call 5 is the first timed call
_SLOW_IN_TIMING = '''import time
import torch

_calls = [0]


def solve(x, residual, weight):
    _calls[0] += 1
    if _calls[0] == 5:
        time.sleep({sleep})
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''

_HOLDS_TIMING_UNTIL = '''import os
import time
import torch

_calls = [0]


def solve(x, residual, weight):
    _calls[0] += 1
    if _calls[0] == 5:
        deadline = time.monotonic() + 120
        while not os.path.exists({sentinel!r}) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.0)
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''

# blocks its compile (the module's import) until the spare has imported: the spare's imports end before the timing phase
_COMPILES_UNTIL = '''import os
import time
import torch

_deadline = time.monotonic() + 120
while not os.path.exists({sentinel!r}) and time.monotonic() < _deadline:
    time.sleep(0.02)


def solve(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''

_DIES_IN_TIMING = '''import logging
import time

import torch

_calls = [0]


def solve(x, residual, weight):
    _calls[0] += 1
    if _calls[0] == 5:
        {action}
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''


@pytest.fixture(autouse=True)
def _no_hold_left_behind():
    yield
    busy = QUIET.busy()
    assert not busy["holds"] and not busy["pending"] and not busy["untimed"], busy  # nor a deferral past its grading


def _events(pid: int) -> list[tuple[float, str]]:
    return [(t, e) for t, e, p in list(QUIET.history) if p == pid]



def _touch_when_imported(pool, dsl, sentinel, *, timeout_s: float = 120.0) -> None:
    """Touch `sentinel` once the pool's newest spare of `dsl` (None: the first DSL it holds) has done its imports."""
    with pool._lock:
        spare = pool._ready[dsl if dsl is not None else next(iter(pool._ready))][-1]
    deadline = time.monotonic() + timeout_s
    while spare.imported_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    sentinel.touch()

def _refill_once_timing_holds(pool: WorkerPool, *, imported_sentinel=None) -> threading.Thread:
    """Spawn the spare only once a worker holds for its timing loop, so its imports end inside that phase.

    With `imported_sentinel`, the file is created once the spare has imported: a kernel that holds its timing phase
    until then makes "imported inside the phase" certain however slowly a loaded machine imports.
    """

    def run() -> None:
        deadline = time.monotonic() + 60
        while "timing" not in QUIET.busy()["holds"].values() and time.monotonic() < deadline:
            time.sleep(0.01)
        pool.refill()
        if imported_sentinel is not None:
            _touch_when_imported(pool, None, imported_sentinel)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_spare_gpu_warm_up_waits_for_the_hold_and_starts_after_it(fake_dsl):
    token = object()
    QUIET.hold(token, "timing")
    w = Worker(fake_dsl, device="cpu")
    try:
        deadline = time.monotonic() + 60
        while w.imported_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.imported_at is not None, w.log_text()
        time.sleep(1.0)
        assert w.go_at is None and w.ready is None  # imported, but no GPU warm-up while the hold lasts
        assert w.pid in QUIET.busy()["waiting"]
        released = time.monotonic()
        QUIET.release(token)
        assert w.wait_ready(60), w.ready_error
        assert w.ready["gpu_warm_started"] >= released
        assert w.ready["quiet_wait_s"] >= 0.9
    finally:
        QUIET.release(token)
        w.kill()
        w.cleanup()


def test_start_limit_does_not_count_the_wait_for_quiet(fake_dsl):
    token = object()
    QUIET.hold(token, "timing")
    w = Worker(fake_dsl, device="cpu")
    try:
        while w.imported_at is None:
            time.sleep(0.05)
        waited_from = time.monotonic()
        time.sleep(max(0.0, w.spawned_at + 3.0 - waited_from) + 1.0)  # past a 3 s start limit while held
        QUIET.release(token)
        assert w.wait_ready(w.imported_at - w.spawned_at + 2.5), w.ready_error
    finally:
        QUIET.release(token)
        w.kill()
        w.cleanup()


def test_spare_warm_up_starts_only_after_the_grading_workers_timing_phase(tmp_path, fake_dsl, cpu_config, store):
    k = tmp_path / "kernel.py"
    sentinel = tmp_path / "spare-imported"
    k.write_text(_HOLDS_TIMING_UNTIL.format(sentinel=str(sentinel)))
    with WorkerPool((fake_dsl,), device="cpu", refill_on_take=False) as pool:
        pool.wait_warm(60)
        spawner = _refill_once_timing_holds(pool, imported_sentinel=sentinel)
        v = grade(28, fake_dsl, k, store=store, config=cpu_config, pool=pool)
        spawner.join(60)
        assert v.passed, v.message
        assert sentinel.exists(), "the spare never imported"
        windows = v.stage("timing").figures["quiet_windows_monotonic"]
        t_begin, t_end = windows["timing"]
        assert t_end - t_begin >= 1
        assert "trusted_timing" in windows  # the trusted phase's eager timing is a hold as well
        spare = pool.take(fake_dsl)
        assert spare.wait_ready(60), spare.ready_error
        assert t_begin < spare.imported_at < t_end, "the spare did not finish importing inside the timing phase"
        assert spare.ready["gpu_warm_started"] >= t_end  # it waited, and started once the phase was over
        assert spare.ready["gpu_warm_started"] - t_end < 30  # promptly, not at some later event (loose: loaded CI)
        assert spare.ready["quiet_wait_s"] > 0
        spare.kill()
        spare.cleanup()


def test_a_spare_already_warming_delays_the_timing_phase_instead_of_overlapping_it(tmp_path, fake_dsl, cpu_config, store):
    # whatever the interleaving, a spare's GPU warm-up and a worker's timing loop never overlap
    k = tmp_path / "kernel.py"
    k.write_text(_SLOW_IN_TIMING.format(sleep=0))
    with WorkerPool((fake_dsl,), device="cpu") as pool:
        pool.wait_warm(60)
        for _ in range(2):
            v = grade(28, fake_dsl, k, store=store, config=cpu_config, pool=pool)
            assert v.passed, v.message
            spare = pool._ready[fake_dsl][0]
            assert spare.wait_ready(60), spare.ready_error
            for t_begin, t_end in v.stage("timing").figures["quiet_windows_monotonic"].values():
                assert spare.ready["gpu_warm_done"] <= t_begin or spare.ready["gpu_warm_started"] >= t_end


@pytest.mark.parametrize("action,reason", [("time.sleep(1000)", "timeout"), ("logging.os.kill(logging.os.getpid(), 9)", "crash")])
def test_a_worker_that_dies_or_times_out_while_timing_releases_its_hold(tmp_path, fake_dsl_runtime, cpu_config, store,
                                                                         action, reason):
    k = tmp_path / "kernel.py"
    k.write_text(_DIES_IN_TIMING.format(action=action))
    cfg = GraderConfig.from_dict({**cpu_config.as_dict(), "wall_limit_s": 10})
    with WorkerPool((fake_dsl_runtime,), device="cpu", refill_on_take=False) as pool:
        pool.wait_warm(60)
        graded_pid = pool.warm()[fake_dsl_runtime]
        spawner = _refill_once_timing_holds(pool)
        v = grade(28, fake_dsl_runtime, k, store=store, config=cfg, pool=pool)
        spawner.join(60)
        assert v.reason == reason, v.message
        assert not QUIET.busy()["holds"]
        events = _events(graded_pid)
        held = [t for t, e in events if e == "hold:timing"]
        released = [t for t, e in events if e == "release"]
        assert held and released and released[-1] >= held[-1]
        spare = pool.take(fake_dsl_runtime)
        assert spare.wait_ready(60), spare.ready_error  # not stuck behind a hold of a dead worker
        assert spare.ready["gpu_warm_started"] >= released[-1]
        if reason == "timeout":  # spawned when the hold began, imported while the killed worker still held it
            assert held[-1] <= spare.imported_at < released[-1]
        spare.kill()
        spare.cleanup()


def test_killing_a_worker_that_holds_releases_the_hold_and_lets_waiting_spares_go(fake_dsl):
    holder = Worker(fake_dsl, device="cpu")
    spare = None
    try:
        assert holder.wait_ready(60), holder.ready_error
        QUIET.hold(holder, "timing", pid=holder.pid)
        spare = Worker(fake_dsl, device="cpu")
        while spare.imported_at is None:
            time.sleep(0.05)
        assert spare.go_at is None
        holder.kill()
        assert not QUIET.busy()["holds"]
        assert spare.wait_ready(60), spare.ready_error
    finally:
        holder.kill()
        holder.cleanup()
        if spare is not None:
            spare.kill()
            spare.cleanup()


class _Spare:
    """What `GpuQuiet` reads of a spare worker (its `go` goes to `sent`)."""

    def __init__(self, pid: int) -> None:
        self.pid, self._forgotten, self.go_at, self.imported_at, self.sent = pid, False, None, time.monotonic(), []
        self._urgent = self._deferred = False

    def _send(self, msg: dict) -> None:
        self.sent.append(msg)


def test_a_spare_imported_before_a_gradings_timing_phase_goes_when_that_phase_ends():
    q = quiet_for("cpu:91")
    grading = object()
    q.grading_started(grading)
    a = _Spare(1)
    q.want_go(a)
    assert a.go_at is None and q.busy()["waiting"] == [1]  # no hold, but a grading in flight has not timed yet
    q.hold(grading, "timing")
    q.release(grading)  # a hold's end alone does not end the deferral (the trusted phase's eager timing is one too)
    assert a.go_at is None
    q.timing_ended(grading)
    assert a.go_at is not None and a.sent == [{"type": "go"}] and q.busy()["untimed"] == 0
    b = _Spare(2)
    q.want_go(b)  # nothing in flight: at once
    assert b.go_at is not None
    q.timing_ended(grading)  # idempotent
    for w in (a, b):
        q.warmed(w)
    noted = [(e, p) for _, e, p in q.history if e == "deferred"]
    assert noted == [("deferred", 1)]  # once, and only for the spare the deferral kept (the benchmark counts these)


def test_a_deferred_go_runs_out_but_never_past_a_hold():
    q = quiet_for("cpu:92")
    q.defer_s = 0.2
    grading, timing = _Spare(90), object()  # the grading's token is its worker (forget() marks it)
    q.grading_started(grading)
    a = _Spare(1)
    q.want_go(a)
    q.recheck()
    assert a.go_at is None
    time.sleep(0.25)
    q.hold(timing, "timing")  # another worker's timing phase: the rule's hold still wins
    q.recheck()
    assert a.go_at is None
    q.release(timing)  # its end sends the `go` whose deferral has run out, with the grading still untimed
    assert a.go_at is not None
    q.warmed(a)
    b = _Spare(2)
    b.imported_at -= 1.0  # imported longer ago than the deferral
    q.want_go(b)
    assert b.go_at is not None
    q.warmed(b)
    q.defer_s = 0.0  # off: no deferral at all
    c = _Spare(3)
    q.want_go(c)
    assert c.go_at is not None
    q.defer_s = 60.0
    d = _Spare(4)
    q.want_go(d)
    assert d.go_at is None
    q.urge(d)  # a grading took it and waits for it: its go is not deferred
    assert d.go_at is not None
    q.forget(grading)  # a killed grading's worker ends its deferral too
    assert q.busy()["untimed"] == 0


def test_the_start_watcher_sends_a_deferred_go_once_it_runs_out(fake_dsl, monkeypatch):
    monkeypatch.setattr(QUIET, "defer_s", 1.0)
    grading = object()
    QUIET.grading_started(grading)
    w = Worker(fake_dsl, device="cpu")
    try:
        assert w.wait_ready(120), w.ready_error  # nobody ends the grading's timing: the deferral runs out by itself
        assert w.go_at - w.imported_at >= 1.0
        assert w.go_at - w.imported_at < 30  # promptly once it ran out (loose: loaded CI)
    finally:
        QUIET.timing_ended(grading)
        w.kill()
        w.cleanup()


def test_a_spare_that_imports_during_a_compile_warms_up_after_the_timing_phase(tmp_path, fake_dsl, cpu_config, store,
                                                                                monkeypatch):
    monkeypatch.setattr(QUIET, "defer_s", 600.0)  # only the timing phase's end may send it (however slow the machine)
    k = tmp_path / "kernel.py"
    sentinel = tmp_path / "spare-imported"
    k.write_text(_COMPILES_UNTIL.format(sentinel=str(sentinel)))
    with WorkerPool((fake_dsl,), device="cpu", refill_on_take=False) as pool:
        pool.wait_warm(60)

        def spawn_during_the_compile() -> None:
            deadline = time.monotonic() + 60
            while not QUIET.busy()["untimed"] and time.monotonic() < deadline:
                time.sleep(0.01)
            pool.refill()
            _touch_when_imported(pool, fake_dsl, sentinel)

        spawner = threading.Thread(target=spawn_during_the_compile, daemon=True)
        spawner.start()
        v = grade(28, fake_dsl, k, store=store, config=cpu_config, pool=pool)
        spawner.join(60)
        assert v.passed, v.message
        assert sentinel.exists(), "the spare never imported"
        t_begin, t_end = v.stage("timing").figures["quiet_windows_monotonic"]["timing"]
        spare = pool.take(fake_dsl)
        assert spare.wait_ready(60), spare.ready_error
        assert spare.imported_at < t_begin, "the spare did not finish importing before the timing phase"
        assert spare.ready["gpu_warm_started"] >= t_end  # no hold when it imported, yet it warmed up after the timing
        spare.kill()
        spare.cleanup()
