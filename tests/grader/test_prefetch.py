"""The prefetched trusted plan (mkb.grader._prefetch): made ahead by the spare that grades the job, used only for its
job, dropped on any mismatch, under the quiet rule, never the candidate's failure; on the CPU with the fake DSL."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import threading
import time

import pyarrow.parquet as pq
import pytest

from fake_dsl import TORCH_BASELINE_28
from mkb.grader import GradeJob, GraderConfig, GradingQueue, WorkerPool
from mkb.grader import _grade
from mkb.grader._pool import GpuQuiet
from mkb.grader._prefetch import (
    PREFETCH_FREE_FRACTION, PlanFootprint, Prepared, plan_fields, plan_key, prefetch_fits,
)


def _sums_to(phases: dict[str, float], total: float) -> None:
    assert sum(phases.values()) == pytest.approx(total, abs=1e-4)


def _details(store: str) -> dict[str, dict]:
    rows = []
    for f in sorted(glob.glob(f"{store}/kind=verdict/*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return {r["evaluation_id"]: json.loads(r["details"]) for r in rows}


def _fields(cfg: GraderConfig, **kw) -> dict:
    f = _grade.plan_job_fields(28, "fake", cfg, "h" * 64)
    f.update(kw)
    return f


# ---------------- the key and the memory gate, as pure functions ----------------

def test_the_plan_key_covers_every_field_the_plan_depends_on_and_nothing_of_the_kernel(fake_dsl, cpu_config):
    base = {**_fields(cpu_config), "secret": 7}
    k = plan_key(base)
    assert plan_key({**base, "kernel_path": "/a.py", "nonce": "x", "type": "job", "trusted": {"eager": {}}}) == k
    for change in ({"secret": 8}, {"problem": 25}, {"problem_hash": "g" * 64}, {"dsl": "cute"}, {"backend": "x:Y"},
                   {"config": {**cpu_config.as_dict(), "size": "full"}},
                   {"config": {**cpu_config.as_dict(), "draws": 4}}):
        assert plan_key({**base, **change}) != k, change
    assert "kernel_path" not in plan_fields({**base, "kernel_path": "/a.py"})


def test_prefetch_fits_only_a_small_plan_beside_the_free_memory():
    free = 64 << 30
    assert prefetch_fits(plan_bytes=1, working_bytes=1, free_bytes=None)  # the CPU: no device memory to share
    assert prefetch_fits(plan_bytes=int(free * PREFETCH_FREE_FRACTION) - 10, working_bytes=10, free_bytes=free)
    assert not prefetch_fits(plan_bytes=int(free * PREFETCH_FREE_FRACTION), working_bytes=1, free_bytes=free)
    assert not prefetch_fits(plan_bytes=None, working_bytes=1, free_bytes=free)  # unmeasured on a GPU: lazily
    small = dict(kept_bytes=1 << 20, input_bytes=1 << 20, working_bytes=1 << 20, free_bytes=free)
    assert PlanFootprint(**small, expectations="whole").fits("auto")
    # a plan that was sampled because of the free memory is never made ahead (it would be made beside another grading)
    assert not PlanFootprint(**small, expectations="sampled").fits("auto")
    assert PlanFootprint(**small, expectations="sampled").fits("sampled")
    assert not PlanFootprint(**{**small, "kept_bytes": free // 8}, expectations="whole").fits("auto")
    assert PlanFootprint.from_msg({"kept_bytes": -1, "expectations": "bogus"}) == PlanFootprint(None, None, None, None, None)


def test_the_prefetch_fraction_arm_moves_the_gate_and_is_recorded_and_checked():
    """GraderConfig.prefetch_fraction (an A/B arm): problem 28's plan on the H200 (10.1 GB kept + 3.3 GB working of
    139 GB free; events/h200-grader-bench-2-18-pause-*) passes 1/8 but not the shipped 1/16."""
    from mkb.grader import GraderConfig

    p28 = PlanFootprint(kept_bytes=10_102_906_880, input_bytes=0, working_bytes=3_271_766_016,
                        free_bytes=139_139_743_744, expectations="whole")
    assert not p28.fits("auto") and not p28.fits("auto", None)
    assert p28.fits("auto", 1 / 8)
    assert GraderConfig(prefetch_fraction=0.125).overrides() == {"prefetch_fraction": 0.125}
    assert GraderConfig().overrides() == {}
    for bad in (0.0, -0.1, 0.3):
        with pytest.raises(ValueError, match="prefetch_fraction"):
            GraderConfig(prefetch_fraction=bad)


# ---------------- the worker's side: the same plan as the lazy path, only under its key ----------------

def test_a_prepared_plan_is_the_lazy_plan_of_the_same_secret_and_only_its_job_takes_it(fake_dsl, cpu_config):
    from mkb.grader import _harness

    msg = {**_fields(cpu_config), "secret": 12345}
    reply = _harness.prepare(msg)
    assert reply["ok"], reply
    assert reply["key"] == plan_key(msg) and reply["prepare_s"] >= 0
    mine = _harness._take_prepared({**msg, "kernel_path": "/k.py", "type": "job"})
    assert mine is not None and not _harness._PREPARED  # taken once: a second job finds nothing
    assert _harness._take_prepared({**msg, "kernel_path": "/k.py"}) is None

    mod = _harness.load_problem(28)
    rng = random.Random(12345)
    lazy = _harness._Plan(mod, cpu_config, rng, _harness._maker(mod, _harness._Device("cpu"), cpu_config),
                          lambda: rng.getrandbits(62))
    got = mine["plan"]
    assert [s for s, _ in got.draws] == [s for s, _ in lazy.draws]
    assert {k: s for k, (s, _) in got.recheck_sets.items()} == {k: s for k, (s, _) in lazy.recheck_sets.items()}
    assert (got.final_seed, got.n_warm, got.prof_after, got.probe_pos) == (lazy.final_seed, lazy.n_warm, lazy.prof_after,
                                                                            lazy.probe_pos)
    assert mine["rng"].getstate() == rng.getstate()  # the eager inputs and timing seeds after the plan match too


@pytest.mark.parametrize("change", [{"secret": 99}, {"problem_hash": "g" * 64}, {"config": "draws"}])
def test_a_plan_of_another_key_is_dropped_and_never_used(fake_dsl, cpu_config, change):
    from mkb.grader import _harness

    msg = {**_fields(cpu_config), "secret": 1}
    assert _harness.prepare(msg)["ok"]
    if change.get("config"):
        change = {"config": {**cpu_config.as_dict(), "draws": cpu_config.draws + 1}}
    assert _harness._take_prepared({**msg, **change}) is None
    assert not _harness._PREPARED and _harness._PREPARED_LOG["discarded"]


def test_a_prepare_that_would_sample_or_crowd_the_device_is_declined(fake_dsl, cpu_config, monkeypatch):
    from mkb.grader import _harness

    monkeypatch.setattr(_harness, "needs_sampling", lambda *a, **k: True)
    reply = _harness.prepare({**_fields(cpu_config), "secret": 3})
    assert not reply["ok"] and "sample" in reply["declined"] and not _harness._PREPARED
    monkeypatch.setattr(_harness, "_free_bytes", lambda device: 1000)  # a "device" with 1000 B free
    monkeypatch.setattr(_harness, "needs_sampling", lambda *a, **k: False)
    reply = _harness.prepare({**_fields(cpu_config), "secret": 3})
    assert not reply["ok"] and "0.0625 of the free device memory" in reply["declined"] and not _harness._PREPARED


# ---------------- the quiet rule: a prepare is a warm-up ----------------

class _StubWorker:
    """What `GpuQuiet` reads of a worker (the same attributes as `Worker`)."""

    _forgotten = _urgent = _deferred = False
    pid = 1
    imported_at = None


def test_a_prepare_waits_for_a_hold_and_a_hold_waits_for_a_prepare_running():
    q = GpuQuiet("cpu:7")
    w, holder = _StubWorker(), object()
    q.hold(holder, "timing")
    started = threading.Event()
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(q.side_work(w, started.set, cancel=threading.Event())))
    t.start()
    time.sleep(0.3)
    assert not started.is_set()  # the timing phase holds: no prepare starts
    q.release(holder)
    t.join(10)
    assert result == [True] and started.is_set() and q.busy()["warming"] == [1]
    t0 = time.monotonic()
    threading.Timer(0.3, lambda: q.warmed(w)).start()
    waited = q.hold(holder, "timing", timeout=10)  # the next timing phase waits for the prepare to end
    assert waited >= 0.25 and time.monotonic() - t0 < 10
    q.release(holder)
    cancel = threading.Event()
    q.hold(holder, "timing")
    threading.Timer(0.2, cancel.set).start()
    assert not q.side_work(w, lambda: pytest.fail("sent after cancel"), cancel=cancel)
    q.release(holder)


class _ScriptedWorker:
    """The parent's view of a preparing worker: its `prepared` reply comes when the test says (`answer`); with
    `deaf`, its reader also ignores the deadline (the claim's own limit is then all that ends the wait)."""

    _forgotten = _urgent = _deferred = False
    pid = 41
    imported_at = None

    def __init__(self, quiet: GpuQuiet, *, deaf: bool = False) -> None:
        self.quiet, self.sent, self.key, self.deaf, self.killed = quiet, [], None, deaf, False
        self._replies: list[dict] = []
        self._cv = threading.Condition()
        self.reader = self

    def _send(self, msg: dict) -> None:
        with self._cv:
            self.sent.append(msg["type"])

    def answer(self) -> None:
        with self._cv:
            self._replies.append({"type": "prepared", "ok": True, "key": self.key, "prepare_s": 0.1})
            self._cv.notify_all()

    def read(self, deadline: float):
        with self._cv:
            while not self._replies:
                if self.killed:
                    return "eof"
                left = deadline - time.monotonic()
                if left <= 0 and not self.deaf:
                    return "timeout"
                self._cv.wait(0.05 if self.deaf else left)
            return self._replies.pop(0)

    def alive(self) -> bool:
        return not self.killed

    def kill(self, wait: bool = True) -> None:
        with self._cv:
            self.killed = True
            self._cv.notify_all()

    def cleanup(self) -> None:
        pass


def _sent_prepare(q: GpuQuiet, cfg: GraderConfig, **kw) -> tuple[_ScriptedWorker, Prepared]:
    """A prefetch started on a scripted worker of `q`, once its prepare is sent (it is then on the warming set)."""
    w = _ScriptedWorker(q, **kw)
    p = Prepared.for_job(w, "job", _fields(cfg))
    w.key = p.key
    p.start(send_prepare=lambda: w.sent.append("prepare"))
    deadline = time.monotonic() + 10
    while p.state != "sent" and time.monotonic() < deadline:
        time.sleep(0.01)
    return w, p


def test_a_timing_phase_waits_for_the_whole_running_prepare_and_asks_it_nothing(fake_dsl, cpu_config):
    """Grader 2.16 (2.13's pause removed): a pending hold sends the preparing worker nothing and enters once the
    prepare has ended; the record shows no prepare beside a timing phase."""
    from mkb.grader._pool import replay_phases

    q = GpuQuiet("cpu:93")
    w, p = _sent_prepare(q, cpu_config)
    assert p.state == "sent" and q.busy()["warming"] == [41]
    threading.Timer(0.5, w.answer).start()
    holder = object()
    waited = q.hold(holder, "timing", pid=7, timeout=30)
    assert 0.4 <= waited < 10 and w.sent == ["prepare"] and q.busy()["warming"] == []
    q.release(holder, pid=7)
    worker, rec = p.claim(timeout=10)
    assert worker is w and rec["state"] == "ready" and not w.killed, rec
    assert "yields" not in rec and "paused_s" not in rec
    assert [e for _, e, pid in q.history if pid in (41, 7)] == ["prepare", "warmed", "hold:timing", "release"]
    r = replay_phases(list(q.history))
    assert r.warm_ups_beside_timing == 0 and r.go_beside_timing == () and r.beside_timing == ()


def test_a_claim_gives_up_5_s_past_the_prepares_own_deadline(fake_dsl, cpu_config, monkeypatch):
    """A hung prepare fails its claim and its worker is killed: the claim waits until the prepare's deadline (set when
    it was sent) plus 5 s, so a claim made well after the send is not given a fresh limit of its own."""
    from mkb.grader import _prefetch

    monkeypatch.setattr(_prefetch, "PREPARE_LIMIT_S", 1.0)
    w, p = _sent_prepare(GpuQuiet("cpu:95"), cpu_config, deaf=True)  # never answers, and its reader never gives up
    assert p.deadline == pytest.approx(p.sent_at + 1.0)
    time.sleep(2.0)  # the claim comes 2 s after the send: 4 s left of deadline + 5
    t0 = time.monotonic()
    worker, rec = p.claim()
    waited = time.monotonic() - t0
    assert worker is None and rec["state"] == "failed" and w.killed, rec
    assert 3.0 < waited < 5.5 and "its limit 1 s" in rec["error"], (waited, rec)

    # a reader that keeps its deadline ends the prepare itself: the claim finds it failed at once
    w2, p2 = _sent_prepare(GpuQuiet("cpu:97"), cpu_config)
    time.sleep(1.5)
    t0 = time.monotonic()
    worker, rec = p2.claim()
    assert worker is None and rec["state"] == "failed" and w2.killed and time.monotonic() - t0 < 1.0, rec


# ---------------- end to end through a queue ----------------

def test_a_backlog_gets_its_plans_prefetched_and_each_verdict_says_so(tmp_path, fake_dsl, cpu_config, store):
    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    from mkb.grader._pool import quiet_for, replay_phases

    # a device key of its own and a start time: a coordinator is the process's, and earlier tests' workers (killed while
    # preparing, say) are in the history of "cpu"
    since = time.monotonic()
    with GradingQueue(device="cpu:62", store=store, config=cpu_config, dsls=(fake_dsl,), depth=3) as q:
        q.pool.wait_warm(60)
        futs = [q.submit(GradeJob(28, fake_dsl, k)) for _ in range(4)]
        vs = [f.result(300) for f in futs]
    for v in vs:
        assert v.passed, v.message
        _sums_to(v.phases_s, v.wall_s)
    assert vs[0].prefetch["state"] == "none" and vs[0].prefetch["plan_used"] is False  # nothing graded before it
    assert vs[0].device_idle_s is None and all(v.device_idle_s is not None and v.device_idle_s >= 0 for v in vs[1:])
    used = [v for v in vs[1:] if v.prefetch and v.prefetch["state"] == "ready"]
    assert used, [v.prefetch for v in vs]
    details = _details(store)
    for v in used:
        p = v.prefetch
        assert p["plan_used"] is True and p["secret_used"] is True and p["prepare_s"] > 0 and not p["plan_discarded"]
        assert p["sealed"] is True  # the preparing worker made itself non-dumpable (Linux)
        # the claim's wait lies inside its own phase: the phase holds it and the claim's bookkeeping, which a loaded
        # 2-core host stretched by 0.3 s, so no upper bound is read from the clock
        assert "parent.prefetch_wait" in v.phases_s and v.phases_s["parent.prefetch_wait"] >= p["wait_s"] - 1e-3
        # the plan was made before the job: its trusted phase did not compute the draws again
        assert v.stage("compile").figures["trusted_phases_s"]["draws_and_recheck_sets"] < p["prepare_s"]
        assert details[v.evaluation_id]["prefetch"]["prepare_s"] == pytest.approx(p["prepare_s"])
    # the quiet rule, replayed from this test's part of the record: no timing phase beside another, no prepare or `go`
    # sent while one was held, and none entered while a prepare ran (it waited for the prepare's end)
    hist = list(quiet_for("cpu:62").history)
    assert [e for t, e, _ in hist if t >= since and e == "prepare"], hist
    replay = replay_phases(hist, since=since)
    assert replay.timing_phases >= len(vs)  # at least the timing loop of each grading
    assert replay.beside_timing == () and replay.go_beside_timing == ()
    assert replay.warm_ups_beside_timing == 0, hist
    # every grading drew its own secret: their verification inputs differ
    errs = {json.dumps(v.stage("verification").figures["details"]) for v in vs}
    assert len(errs) == len(vs)


def test_a_spare_that_dies_while_preparing_is_replaced_and_the_job_is_still_graded(tmp_path, fake_dsl, cpu_config, store,
                                                                                  monkeypatch):
    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    killed: list[int] = []
    real_start = Prepared.start

    def start_then_kill(self, send_prepare=None):
        def send():
            self.worker.send_job({"type": "prepare", **self.fields})
            os.killpg(self.worker.pid, signal.SIGKILL)  # dies while preparing
            killed.append(self.worker.pid)

        real_start(self, send)

    monkeypatch.setattr(Prepared, "start", start_then_kill)
    with GradingQueue(device="cpu", store=store, config=cpu_config, dsls=(fake_dsl,), depth=3) as q:
        q.pool.wait_warm(60)
        futs = [q.submit(GradeJob(28, fake_dsl, k)) for _ in range(2)]
        first, second = [f.result(300) for f in futs]
    assert killed
    assert first.passed and second.passed, (first.message, second.message)  # not the candidate's crash
    assert second.prefetch["state"] == "failed" and second.prefetch["error"] and not second.prefetch["secret_used"]
    assert second.prefetch["plan_used"] is False
    assert second.stage("verification").ok
    _sums_to(second.phases_s, second.wall_s)


def test_a_prefetch_made_for_other_fields_is_never_used(tmp_path, fake_dsl, cpu_config, store):
    from mkb.events import EventWriter

    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    other = GraderConfig.from_dict({**cpu_config.as_dict(), "draws": cpu_config.draws + 1})
    with WorkerPool((fake_dsl,), device="cpu", depth=2) as pool, EventWriter(store) as writer:
        pool.wait_warm(60)
        w = pool.take_ready(fake_dsl)
        p = Prepared.for_job(w, None, _grade.plan_job_fields(28, fake_dsl, other, _grade.problem_identity(28)))
        p.start()
        v, _ = _grade.grade_with(28, fake_dsl, k, writer=writer, config=cpu_config, pool=pool, prepared=p)
        assert v.passed, v.message
        assert v.prefetch["state"] == "mismatch" and not v.prefetch["secret_used"] and not v.prefetch["plan_used"]
        assert not w.alive()  # the spare that holds another job's plan is killed, not handed a candidate
        _sums_to(v.phases_s, v.wall_s)


def test_a_cancelled_job_drops_its_prefetch_and_close_drains(tmp_path, fake_dsl, cpu_config, store):
    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    q = GradingQueue(device="cpu", store=store, config=cpu_config, dsls=(fake_dsl,), depth=3)
    q.pool.wait_warm(60)
    futs = [q.submit(GradeJob(28, fake_dsl, k, attempt_id=f"j{i}")) for i in range(1, 4)]
    prepared = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # j3's plan is prefetched once j2 starts compiling
        with q._cv:
            p = q._prepared
        if p is not None and p.job.attempt_id == "j3":
            prepared = p
            break
        time.sleep(0.01)
    assert prepared is not None, "no prefetch for j3"
    assert futs[2].cancel()  # j2 still verifies and times: j3 has not started
    q.close()  # drains: j1 and j2 graded, j3 skipped
    assert futs[0].result().passed and futs[1].result().passed and futs[2].cancelled()
    assert futs[1].result().prefetch["state"] == "ready"
    assert q._prepared is None and not prepared.worker.alive()  # the spare holding j3's plan is gone


def test_grader_bench_backlog_section_prints_the_prefetched_overhead(tmp_path, fake_dsl, cpu_config, store, monkeypatch,
                                                                      repo_script):
    from types import SimpleNamespace

    import mkb.problems

    bench = repo_script("benchmarks/grader_bench.py")
    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    monkeypatch.setattr(mkb.problems, "baselines",
                        lambda problems=None, dsls=None: [SimpleNamespace(problem=28, dsl=fake_dsl, path=good)])
    lines: list[str] = []
    b = bench.backlog(problem=28, repeats=3, config=cpu_config, store=store, device="cpu", depth=3, low_water=1,
                      log=lines.append)
    d = b["dsls"][fake_dsl]
    assert d["all_passed"] and len(d["runs"]) == 3 and d["eager"]["passed"]
    assert d["prefetch_states"].get("ready", 0) >= 1, d["prefetch_states"]
    assert d["overhead_s_median_prefetched"] is not None and d["prepare_s_median"] > 0
    assert any("prefetch=ready" in x for x in lines)
    text = bench.summary({"backlog": [b]})
    assert "backlog of 3" in text and "with the plan prefetched" in text and "largest phases" in text


def test_a_job_that_raises_before_taking_its_prefetch_does_not_leave_the_spare_behind(tmp_path, fake_dsl, cpu_config,
                                                                                      store):
    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    missing = tmp_path / "gone.py"
    missing.write_text(TORCH_BASELINE_28)
    with GradingQueue(device="cpu", store=store, config=cpu_config, dsls=(fake_dsl,), depth=3) as q:
        q.pool.wait_warm(60)
        first = q.submit(GradeJob(28, fake_dsl, k))
        doomed = q.submit(GradeJob(28, fake_dsl, missing))
        deadline = time.monotonic() + 120
        while q._prepared is None and not first.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        prepared = q._prepared
        missing.unlink()  # the kernel becomes unreadable before its grading starts: grade_with raises
        assert first.result(300).passed
        with pytest.raises(ValueError, match="cannot read the kernel"):
            doomed.result(300)
    if prepared is not None:
        assert prepared.job == GradeJob(28, fake_dsl, missing)
        assert not prepared.worker.alive()


def test_grader_bench_clock_warm_table_counts_warm_ups_that_found_the_clock_at_max(repo_script):
    bench = repo_script("benchmarks/grader_bench.py")
    rows = [{"device_idle_s": 0.02, "clock_warm": {"first_mhz": 1980, "max_mhz": 1980, "s": 0.031, "by": "clock"}},
            {"device_idle_s": 0.4, "clock_warm": {"first_mhz": 1900, "max_mhz": 1980, "s": 0.032, "by": "clock"}},
            {"device_idle_s": 5.0, "clock_warm": {"first_mhz": 345, "max_mhz": 1980, "s": 0.3, "by": "time"}},
            {"device_idle_s": None, "clock_warm": None}]
    t = bench.clock_warm_table(rows)
    assert t == {"n": 3, "first_at_max": 2, "s_median": 0.032, "s_median_first_at_max": pytest.approx(0.0315),
                 "idle_s_max_first_at_max": 0.4, "by_clock": 2}


def test_grader_bench_tables_timing_inputs_by_problem(repo_script):
    """Each problem's `timing_inputs` with the first pass's new segments where the grader recorded them (2.14)."""
    bench = repo_script("benchmarks/grader_bench.py")

    def row(problem: int, inputs: float, segs: int | None = None) -> dict:
        return {"problem": problem, "phases_s": {"worker.run.timing_inputs": inputs}, "first_pass_segments": segs}

    tab = bench.inputs_table([row(28, 0.025), row(1, 1.8, 112), row(1, 0.02, 0), row(1, 0.1)])
    assert list(tab) == [1, 28]
    assert tab[1]["n"] == 3 and tab[1]["over_1s"] == 1 and abs(tab[1]["mean_s"] - 0.64) < 1e-9
    assert tab[1]["first_pass_segments"] == [112, 0] and tab[28]["first_pass_segments"] == []
    (line,) = bench._inputs_line("FIGURE x", tab)
    assert line == "FIGURE x: 1: 0.640 s (1 of 3 over 1 s, first-pass segments [0, 112]); 28: 0.025 s (0 of 1 over 1 s)"
    made = {"first_pass_s": 1.6, "make_s": 0.25, "sets_made": 113, "cpu_s": 0.31, "device_mallocs": 260, "device_frees": 0,
            "alloc_retries": 0}  # grader 2.19: where the phase went, printed per grading beside its seconds
    tab = bench.inputs_table([{**row(1, 1.86, 250), "inputs_made": made}])
    (line,) = bench._inputs_line("FIGURE x", tab)
    assert line.endswith("made [1.86 s: first pass 1.60 + sets 0.25, cpu 0.31, mallocs 260 frees 0 retries 0])")


def test_grader_bench_tables_the_candidate_loop_by_part(repo_script):
    """Each problem's loop split (grader 2.21) as medians by part beside the phase; gradings without it are left out."""
    bench = repo_script("benchmarks/grader_bench.py")

    def row(problem: int, window: float, after: float, loop: float, timed: float) -> dict:
        return {"problem": problem, "timing_loop_s": loop, "timed_s": timed,
                "loop_split_s": {"inputs": 0.001, "before": 0.002, "window": window, "after": after, "between": 0.0}}

    rows = [row(25, 0.08, 0.06, 0.18, 0.003), row(25, 0.10, 0.02, 0.16, 0.002), row(25, 0.09, 0.04, 0.17, 0.004),
            row(1, 0.07, 0.05, 0.15, 0.012), {"problem": 28, "loop_split_s": None, "timing_loop_s": 0.2, "timed_s": 0.01}]
    tab = bench.loop_split_table(rows)
    assert list(tab) == [1, 25]  # problem 28's grading recorded no split (a grader before 2.21)
    assert tab[25]["n"] == 3 and tab[25]["median_s"]["window"] == pytest.approx(0.09)
    assert tab[25]["median_s"]["after"] == pytest.approx(0.04) and tab[25]["timing_loop_s"] == pytest.approx(0.17)
    (line,) = bench._loop_split_line("FIGURE x", tab)
    assert line.startswith("FIGURE x: 1: inputs 0.001 before 0.002 window 0.070 after 0.050 between 0.000 "
                           "(phase timing_loop 0.150, timed calls 0.012; n 1); 25: ")
    assert bench._loop_split_line("FIGURE x", {}) == []


def test_grader_bench_quiet_table_times_warm_ups_prefetches_and_deferred_gos(repo_script):
    bench = repo_script("benchmarks/grader_bench.py")
    history = [(0.5, "imported", 9), (0.6, "go", 9), (1.0, "warmed", 9),  # before `since`: not counted
               (10.0, "imported", 1), (10.0, "go", 1), (12.0, "warmed", 1),  # a warm-up of 2 s, no wait
               (10.5, "imported", 2), (10.5, "deferred", 2), (11.5, "hold:timing", 7), (11.8, "release", 7),
               (11.9, "timed", 7), (11.9, "go", 2), (13.4, "warmed", 2),  # deferred 1.4 s, warm-up 1.5 s
               (12.0, "prepare", 3), (12.25, "warmed", 3), (12.5, "imported", 4)]  # a prefetch; a spare still waiting
    q = bench.quiet_table(history, since=5.0)
    assert q["warm_ups"] == {"n": 2, "median_s": pytest.approx(1.75), "max_s": pytest.approx(2.0)}
    assert q["prepares"] == {"n": 1, "median_s": pytest.approx(0.25), "max_s": pytest.approx(0.25)}
    assert q["deferred_go"] == {"n": 1, "median_s": pytest.approx(1.4), "max_s": pytest.approx(1.4)}
    assert "go deferred behind a grading's timing phase for 1 spares" in bench._quiet_line("FIGURE x", q)[0]
    # the record itself from `since` on, in seconds after it, for reading the schedule offline
    assert q["timeline"][0] == [5.0, "imported", 1] and q["timeline"][-1] == [8.4, "warmed", 2]  # in time order
    assert len(q["timeline"]) == len(history) - 3
    assert q["at_once_max"] == 2  # spare 1's warm-up still ran when spare 2 got its go
    killed = [(20.0, "go", 5), (20.5, "forgotten", 5), (21.0, "go", 6), (22.0, "warmed", 6)]
    assert bench.quiet_table(killed, since=19.0)["at_once_max"] == 1  # a killed warm-up no longer counts


def test_a_prepared_worker_that_dies_before_its_job_is_replaced(tmp_path, fake_dsl, cpu_config, store):
    from mkb.events import EventWriter

    k = tmp_path / "kernel.py"
    k.write_text(TORCH_BASELINE_28)
    fields = _grade.plan_job_fields(28, fake_dsl, cpu_config, _grade.problem_identity(28))
    with WorkerPool((fake_dsl,), device="cpu", depth=3) as pool, EventWriter(store) as writer:
        pool.wait_warm(60)
        # the plain case first: a ready prefetch is used by grade_with, with its secret
        w = pool.take_ready(fake_dsl)
        p = Prepared.for_job(w, None, fields)
        p.start()
        assert p._done.wait(60) and p.state == "ready", (p.state, p.error)
        v, _ = _grade.grade_with(28, fake_dsl, k, writer=writer, config=cpu_config, pool=pool, prepared=p)
        assert v.passed and v.prefetch["state"] == "ready" and v.prefetch["plan_used"] is True, v.prefetch
        # then one whose worker dies after preparing, before its job
        w = pool.take_ready(fake_dsl)
        p = Prepared.for_job(w, None, fields)
        p.start()
        assert p._done.wait(60) and p.state == "ready", (p.state, p.error)
        os.killpg(w.pid, signal.SIGKILL)
        w.proc.wait(10)
        v, _ = _grade.grade_with(28, fake_dsl, k, writer=writer, config=cpu_config, pool=pool, prepared=p)
        assert v.passed, v.message
        assert v.prefetch["state"] == "failed" and "died before its job" in v.prefetch["error"]
        assert v.prefetch["plan_used"] is False and not v.prefetch["secret_used"]


def test_grader_bench_main_runs_the_lead_s_sections(grader_bench, tmp_path, fake_dsl, capsys):
    bench = grader_bench
    out = tmp_path / "out"
    bench.main(["--smoke", "--device", "cpu", "--sections", "backlog,throughput", "--problem", "28", "--repeats", "2",
                "--rounds", "2", "--depth", "3", "--low-water", "1", "--budget-s", "600", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "FIGURE overhead per evaluation, warm queue with a backlog of 2" in printed
    assert "FIGURE gradings per GPU-hour" in printed and "prefetch {" in printed
    assert "FIGURE throughput quiet rule: spares' GPU warm-ups" in printed and "FIGURE backlog quiet rule" in printed
    assert "FIGURE throughput quiet rule replayed: " in printed and " timing phases, 0 beside another's, 0 spares'" in printed
    assert "FIGURE throughput timing_inputs by problem (mean): 28: " in printed
    res = json.loads((out / "grader_bench.json").read_text())
    assert res["throughput"]["timing_inputs"]["28"]["n"] == res["throughput"]["gradings"]
    assert res["backlog"][0]["dsls"][fake_dsl]["all_passed"] and res["throughput"]["all_passed"]
    assert "overhead" not in res
