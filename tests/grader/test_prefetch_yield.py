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


def test_grader_bench_counts_a_paused_prepare_once_and_times_its_yields(repo_script):
    bench = repo_script("benchmarks/grader_bench.py")
    history = [(10.0, "prepare", 3), (10.4, "yield", 3), (10.5, "yielded", 3), (10.5, "hold:timing", 7),
               (11.0, "release", 7), (11.0, "prepare", 3), (11.3, "warmed", 3)]
    q = bench.quiet_table(history, since=5.0)
    assert q["prepares"]["n"] == 1 and abs(q["prepares"]["median_s"] - 0.8) < 1e-9  # 0.5 s before the pause, 0.3 after
    assert q["yields"]["n"] == 1 and abs(q["yields"]["max_s"] - 0.1) < 1e-9  # the hold waited 0.1 s, not the rest
    assert "prefetches paused for a timing phase 1 times" in bench._quiet_line("FIGURE x", q)[0]
    assert q["yields_finished_instead"]["n"] == 0


def test_grader_bench_counts_a_yield_answered_by_the_prepare_finishing(repo_script):
    bench = repo_script("benchmarks/grader_bench.py")
    history = [(10.0, "prepare", 3), (10.4, "yield", 3), (10.45, "warmed", 3), (10.45, "hold:timing", 7),
               (11.0, "release", 7), (12.0, "prepare", 4), (12.1, "yield", 4), (12.2, "forgotten", 4),
               (13.0, "prepare", 4), (13.5, "warmed", 4)]
    q = bench.quiet_table(history, since=5.0)
    assert q["yields"]["n"] == 0
    assert q["yields_finished_instead"]["n"] == 1 and abs(q["yields_finished_instead"]["max_s"] - 0.05) < 1e-9
    assert q["prepares"]["n"] == 2  # 0.45 s and the later 0.5 s prepare; the killed one counts nowhere
    assert "asked but finished instead 1 times" in bench._quiet_line("FIGURE x", q)[0]


def test_grader_bench_runs_the_throughput_with_the_yield_off_then_on(grader_bench, tmp_path, fake_dsl, capsys):
    import json

    from mkb.grader import quiet_for

    out = tmp_path / "out"
    grader_bench.main(["--smoke", "--device", "cpu", "--sections", "throughput", "--rounds", "1", "--depth", "2",
                       "--low-water", "1", "--budget-s", "600", "--out", str(out), "--prefetch-yield", "both"])
    printed = capsys.readouterr().out
    assert "FIGURE gradings per GPU-hour (prefetch yield off)" in printed
    assert "FIGURE gradings per GPU-hour (prefetch yield on)" in printed
    res = json.loads((out / "grader_bench.json").read_text())
    assert "throughput" not in res and [t["prefetch_yield"] for t in res["throughput_arms"]] == [False, True]
    assert all(t["all_passed"] for t in res["throughput_arms"])
    assert quiet_for("cpu").yield_side_work is True  # the process's coordinator is left as shipped
    assert "FIGURE prefetch yield A/B, arms pooled: off: " in printed and "; on: " in printed


def test_grader_bench_pools_alternated_arms_by_setting(repo_script):
    bench = repo_script("benchmarks/grader_bench.py")

    def arm(on: bool, n: int, el: float, wait: float) -> dict:
        return {"prefetch_yield": on, "gradings": n, "elapsed_s": el, "steady_gradings_per_gpu_hour": 3600 * n / el,
                "runs": [{"phases_s": {"worker.run.quiet_wait": wait}}] * n}

    tab = bench.arms_table([arm(False, 10, 30.0, 0.4), arm(True, 10, 20.0, 0.1), arm(False, 10, 10.0, 0.2),
                            arm(True, 10, 20.0, 0.3)])
    assert tab["off"]["gradings_per_gpu_hour"] == 3600 * 20 / 40.0 and tab["on"]["gradings_per_gpu_hour"] == 3600 * 20 / 40.0
    assert abs(tab["off"]["quiet_wait_s_mean"] - 0.3) < 1e-9 and abs(tab["on"]["quiet_wait_s_mean"] - 0.2) < 1e-9
    assert tab["off"]["runs"] == 2 and len(tab["on"]["steady_per_run"]) == 2


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


def test_grader_bench_splits_timing_inputs_by_problem_and_by_a_paused_prepare(repo_script):
    """Where the yield arm's time went (h200-grader-bench-2-13): each problem's `timing_inputs`, apart for gradings
    whose prepare paused, with the first pass's new segments where the grader recorded them (2.14)."""
    bench = repo_script("benchmarks/grader_bench.py")

    def row(problem: int, yields: int | None, inputs: float, segs: int | None = None) -> dict:
        return {"problem": problem, "prefetch": None if yields is None else {"yields": yields},
                "phases_s": {"worker.run.timing_inputs": inputs}, "first_pass_segments": segs}

    tab = bench.inputs_table([row(1, 1, 1.8, 112), row(1, 1, 1.9, 110), row(1, 0, 0.02, 0), row(1, None, 0.1),
                              row(28, 0, 0.025)])
    assert list(tab) == [1, 28]
    assert tab[1]["paused"]["n"] == 2 and tab[1]["paused"]["over_1s"] == 2 and abs(tab[1]["paused"]["mean_s"] - 1.85) < 1e-9
    assert tab[1]["not_paused"]["n"] == 2 and tab[1]["not_paused"]["over_1s"] == 0
    assert tab[1]["paused"]["first_pass_segments"] == [112, 110] and tab[1]["not_paused"]["first_pass_segments"] == [0]
    assert "paused" not in tab[28]
    (line,) = bench._inputs_line("FIGURE x", tab)
    assert line.startswith("FIGURE x: 1: paused 1.850 s (2 of 2 over 1 s, first-pass segments [110, 112]) / not paused")
    assert "; 28: not paused 0.025 s (0 of 1 over 1 s)" in line

