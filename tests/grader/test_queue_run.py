"""scripts/gpu_queue_run.py judges what it should from whatever sections finished (a killed run keeps its serial pass)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import gpu_queue_run as qr  # noqa: E402

CASES = [qr.Case("baseline/28/cute", 28, "cute", Path("b.py"), None),
         qr.Case("redteam/host_compute/cute", 28, "cute", Path("h.py"), ("integrity_host_compute",)),
         qr.Case("redteam/kill_self/cute", 28, "cute", Path("k.py"), ("crash",))]


def _r(passed: bool, reason: str | None, us: float | None = None) -> dict:
    return {"passed": passed, "reason": reason, "candidate_median_us": us}


def _summary(serial: dict, queue: dict | None = None) -> dict:
    return {"serial": serial, "queue": queue or {}, "pair": [], "compare": []}


def test_a_serial_pass_alone_counts_its_red_team_forms_and_names_a_hole() -> None:
    s = _summary({"baseline/28/cute": _r(True, None, 82.0), "redteam/host_compute/cute": _r(False, "integrity_host_compute"),
                  "redteam/kill_self/cute": _r(True, None, 80.0)})
    lines: list[str] = []
    qr.conclude(s, CASES, log=lambda *a: lines.append(" ".join(map(str, a))))
    res = s["result"]
    assert res["redteam_serial_rejected"] == 1 and res["redteam_serial_forms"] == 2 and res["redteam_serial_all_rejected"] is False
    assert res["serial_must_pass_passed"] is True
    assert res["compared"] == 0 and s["compare"] == []
    # no queue verdict yet: the queue-side flags say nothing, rather than "all rejected"
    assert res["redteam_all_rejected"] is None and res["controls_and_baselines_pass"] is None
    assert any(line.startswith("HOLE") and "kill_self" in line for line in lines)


def test_the_queue_pass_is_compared_per_job_and_recomputed_from_scratch() -> None:
    serial = {"baseline/28/cute": _r(True, None, 82.0), "redteam/host_compute/cute": _r(False, "integrity_host_compute"),
              "redteam/kill_self/cute": _r(False, "crash")}
    s = _summary(serial, {"baseline/28/cute": _r(True, None, 82.5), "redteam/host_compute/cute": _r(False, "crash")})
    qr.conclude(s, CASES)
    qr.conclude(s, CASES)  # called after every section: the comparison is rebuilt, never appended twice
    res = s["result"]
    assert res["compared"] == 2 and res["same_verdict"] == 1 and len(s["compare"]) == 2
    assert res["medians_compared"] == 1 and res["medians_within_0_5pct"] == 0  # 0.61% apart
    assert not res["redteam_all_rejected"] and res["controls_and_baselines_pass"]
    assert res["redteam_serial_rejected"] == 2


def test_a_serial_pass_from_an_earlier_call_is_read_only_from_the_same_environment(tmp_path) -> None:
    import json

    import pytest

    here = {"torch": "2.11.0", "mkb_grader": "2.9", "timing_policy": "p/v6", "mkb_commit": "abc", "gpu_uuid": "GPU-1",
            "nvidia-smi": "NVIDIA H200, 580.159.04, 345 MHz, 1980 MHz, 3201 MHz, 34, 78.11 W"}
    serial = {"baseline/28/cute": _r(True, None, 82.0)}
    f = tmp_path / "summary.json"
    f.write_text(json.dumps({"versions": {**here, "nvidia-smi": "NVIDIA H200, 580.159.04, 1980 MHz, 1980 MHz, 3201 MHz, 41, 90 W"},
                             "serial": serial}))
    assert qr.load_serial(f, here) == serial  # the clocks and temperature differ, the machine does not
    for other in ({"torch": "2.12.0"}, {"mkb_grader": "2.8"}, {"timing_policy": "p/v5"}, {"mkb_commit": "def"},
                  {"gpu_uuid": "GPU-2"}):
        f.write_text(json.dumps({"versions": {**here, **other}, "serial": serial}))
        with pytest.raises(SystemExit, match="another environment"):
            qr.load_serial(f, here)
    f.write_text(json.dumps({"versions": here, "serial": {}}))
    with pytest.raises(SystemExit, match="no serial pass"):
        qr.load_serial(f, here)
    with pytest.raises(SystemExit, match="cannot read"):
        qr.load_serial(tmp_path / "missing.json", here)


def test_outputs_are_replaced_whole_and_a_failed_write_keeps_the_last_copy(tmp_path) -> None:
    import json
    import tarfile

    import pytest

    store = tmp_path / "store"
    (store / "kind=verdict").mkdir(parents=True)
    (store / "kind=verdict" / "a.parquet").write_bytes(b"serial")
    out = tmp_path / "out"
    out.mkdir()
    qr.write_outputs(out, {"serial": {"k": 1}}, stage="serial", store=store, name="ds")
    assert json.loads((out / "summary.json").read_text())["saved_after"] == "serial"
    with tarfile.open(out / "events.tar.gz") as tar:
        assert "ds/kind=verdict/a.parquet" in tar.getnames()
    with pytest.raises(FileNotFoundError):  # the store vanished mid-run: the serial section's archive stays
        qr.write_outputs(out, {"serial": {"k": 1}, "queue": {}}, stage="queue", store=tmp_path / "gone", name="ds")
    with tarfile.open(out / "events.tar.gz") as tar:
        assert "ds/kind=verdict/a.parquet" in tar.getnames()
    assert json.loads((out / "summary.json").read_text())["saved_after"] == "queue"  # written before the archive


def test_several_rounds_each_way_are_pooled_per_job_and_a_single_pair_is_not_the_verdict() -> None:
    import pytest

    serial = {"baseline/28/cute": _r(True, None, 100.0), "baseline/28/cute#s1": _r(True, None, 101.0),
              "redteam/host_compute/cute": _r(False, "integrity_host_compute"), "redteam/kill_self/cute": _r(False, "crash")}
    queue = {"baseline/28/cute#r0": _r(True, None, 101.2), "baseline/28/cute#r1": _r(True, None, 100.2)}
    s = _summary(serial, queue)
    lines: list[str] = []
    qr.conclude(s, CASES, log=lambda *a: lines.append(" ".join(map(str, a))))
    res = s["result"]
    # one queue grading against the first serial one: 1.2% apart, outside; the means (100.5 vs 100.7) are 0.2% apart
    assert res["medians_compared"] == 2 and res["medians_within_0_5pct"] == 1
    (p,) = s["pooled"]  # only jobs that must pass, and only those with gradings on both sides
    assert p["key"] == "baseline/28/cute" and p["a_us"] == [100.0, 101.0] and p["b_us"] == [101.2, 100.2]
    assert p["a_vs_b"] == pytest.approx(0.2 / 100.5) and p["within_tol"] and p["a_vs_b_se"] is not None
    assert res["medians_pooled_compared"] == 1 and res["medians_pooled_within_0_5pct"] == 1
    assert any(line.startswith("POOLED baseline/28/cute") and "within 0.5%" in line for line in lines)
    # a failed serial round of a must-pass job is a failure of the serial pass, whichever round it was
    s2 = _summary({**serial, "baseline/28/cute#s1": _r(False, "timeout")})
    qr.conclude(s2, CASES)
    assert s2["result"]["serial_must_pass_passed"] is False
    assert s2["pooled"] == [] and s2["result"]["medians_pooled_compared"] == 0  # no queue pass yet


def test_the_serial_pass_grades_the_chosen_jobs_round_after_round() -> None:
    assert [k for k, _ in qr.serial_jobs(CASES)] == [c.key for c in CASES]
    keys = [k for k, _ in qr.serial_jobs(CASES, jobs="passing", rounds=3)]
    assert keys == ["baseline/28/cute", "baseline/28/cute#s1", "baseline/28/cute#s2"]
    both = [k for k, _ in qr.serial_jobs(CASES, rounds=2)]
    assert both[:3] == [c.key for c in CASES] and both[3:] == [f"{c.key}#s1" for c in CASES]


class _FakeVerdict:
    def __init__(self, job, *, wait: float = 0.0) -> None:
        self.problem, self.dsl = job.problem, job.dsl
        passed = "hole" not in str(job.kernel_path)
        self.passed, self.reason = passed, None if passed else "integrity_host_compute"
        self.candidate_median_us, self.eager_median_us, self.speedup = 82.0, 1000.0, 12.2
        self.wall_s = self.overhead_s = 0.01
        self.queue_wait_s, self.evaluation_id, self.message = wait, f"ev-{id(self)}", ""

    def stage(self, name):
        import types

        if name != "compile":
            return None
        scratch = f"/tmp/mkb-worker-{self.dsl}-{self.evaluation_id}"  # one folder per worker
        return types.SimpleNamespace(figures={"fs_guard": f"landlock abi 7: ... write only beneath {scratch}, /dev; no TCP",
                                              "syscall_guard": "seccomp: setsid, ... refused"})


class _FakeQueue:
    """One job at a time on a thread, `step_s` each, like a GradingQueue on one GPU."""

    step_s = 0.0

    def __init__(self, **kw) -> None:
        import concurrent.futures
        import types

        self._ex = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.pool = types.SimpleNamespace(wait_warm=lambda *a: True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._ex.shutdown(wait=True, cancel_futures=False)

    def _grade(self, job):
        import time

        time.sleep(self.step_s)
        return _FakeVerdict(job)

    def submit(self, job):
        return self._ex.submit(self._grade, job)

    def submit_batch(self, jobs):
        return [self._ex.submit(self._grade, j) for j in jobs]


def _fake_run(monkeypatch, tmp_path, argv: list[str], *, step_s: float) -> dict:
    """gpu_queue_run.main end to end on fakes (no GPU): its sections, keys, budget and summary as a device call runs them."""
    import json
    import types

    import mkb.grader

    cases = [qr.Case("baseline/28/cute", 28, "cute", tmp_path / "b28c.py", None),
             qr.Case("baseline/28/tirx", 28, "tirx", tmp_path / "b28t.py", None),
             qr.Case("redteam/control/cute", 28, "cute", tmp_path / "ctl.py", None),
             qr.Case("redteam/host_compute/cute", 28, "cute", tmp_path / "hole.py", ("integrity_host_compute",))]
    monkeypatch.setattr(qr, "cases", lambda tmp: cases)
    monkeypatch.setitem(sys.modules, "gpu_grader_run", types.SimpleNamespace(versions=lambda: {"mkb_grader": "test"},
                                                                            preflight=lambda *a: None))
    monkeypatch.setattr(mkb.grader, "WorkerPool", lambda **kw: _FakeQueue())
    monkeypatch.setattr(mkb.grader, "grade", lambda problem, dsl, path, **kw: _FakeVerdict(
        mkb.grader.GradeJob(problem, dsl, path)))
    monkeypatch.setattr(_FakeQueue, "step_s", step_s)
    monkeypatch.setattr(mkb.grader, "GradingQueue", _FakeQueue)
    out = tmp_path / "out"
    assert qr.main([*argv, "--out", str(out), "--name", f"test-{tmp_path.name}"]) == 0
    return json.loads((out / "summary.json").read_text())


def test_one_call_of_the_jobs_that_must_pass_runs_both_passes_and_pools_them(monkeypatch, tmp_path) -> None:
    s = _fake_run(monkeypatch, tmp_path, ["--sections", "serial,queue", "--serial-jobs", "passing", "--queue-jobs", "passing",
                                          "--serial-rounds", "2", "--queue-rounds", "2"], step_s=0.0)
    assert sorted(s["serial"]) == sorted(["baseline/28/cute", "baseline/28/cute#s1", "baseline/28/tirx", "baseline/28/tirx#s1",
                                          "redteam/control/cute", "redteam/control/cute#s1"])  # no red-team form graded
    assert len(s["queue"]) == 6 and all("#r" in k for k in s["queue"])
    res = s["result"]
    assert res["serial_gradings"] == 6 and res["queue_gradings"] == 6 and res["medians_pooled_compared"] == 3
    assert res["controls_and_baselines_pass"] is True and res["redteam_all_rejected"] is None
    assert len(s["pair"]) == 2 and not s["skipped"] and not s["errors"]
    assert s["queue_quiet_replayed"]["beside_timing"] == []  # recorded (nothing held a phase on this fake device)
    # every worker's guards on one line, its own scratch folder left out
    assert res["guards"] == {"landlock abi 7: ... write only beneath <scratch>, /dev; no TCP | seccomp: setsid, ... refused": 12}


def test_past_the_budget_the_queue_cancels_what_has_not_started_and_still_writes_its_summary(monkeypatch, tmp_path) -> None:
    """On the script's own clock, never the machine's speed: the budget runs out while the queue's pool warms (the fake
    clock jumps there), so the section cancels every job not yet started and skips the pair batch."""
    import time
    import types

    clock = {"now": 1000.0}
    fake_time = types.SimpleNamespace(monotonic=lambda: clock["now"], strftime=time.strftime)
    monkeypatch.setattr(qr, "time", fake_time)

    def warm_then_late(*a) -> bool:
        clock["now"] += 60.0  # past --budget-s 30: the section started in budget, its pushes end past it
        return True

    real_init = _FakeQueue.__init__

    def init(self, **kw) -> None:
        real_init(self, **kw)
        self.pool.wait_warm = warm_then_late

    monkeypatch.setattr(_FakeQueue, "__init__", init)
    s = _fake_run(monkeypatch, tmp_path, ["--sections", "queue", "--queue-rounds", "8", "--budget-s", "30"], step_s=0.2)
    skipped = [k for k in s["skipped"] if k.startswith("queue ")]
    assert len(skipped) >= 28 and "pair" in s["skipped"]  # at most the one running (and a push-time race) finishes
    assert len(s["queue"]) + len(skipped) == 32  # every job either graded or named as skipped
    assert not s["errors"]


def test_a_hole_in_a_later_serial_round_or_in_a_queue_job_without_a_serial_grading_is_named() -> None:
    serial = {"baseline/28/cute": _r(True, None, 82.0), "redteam/host_compute/cute": _r(False, "integrity_host_compute"),
              "redteam/host_compute/cute#s1": _r(True, None, 80.0)}  # slipped through in the second round
    queue = {"redteam/kill_self/cute": _r(True, None, 80.0)}  # never graded serially (--serial-jobs passing elsewhere)
    s = _summary(serial, queue)
    lines: list[str] = []
    qr.conclude(s, CASES, log=lambda *a: lines.append(" ".join(map(str, a))))
    res = s["result"]
    assert res["redteam_serial_forms"] == 2 and res["redteam_serial_rejected"] == 1 and res["redteam_serial_all_rejected"] is False
    assert res["redteam_all_rejected"] is False and res["compared"] == 0
    assert any(line.startswith("HOLE") and "host_compute/cute#s1" in line for line in lines)
    assert any(line.startswith("HOLE") and "kill_self/cute" in line and "no serial grading" in line for line in lines)


def test_a_producer_that_fails_mid_push_neither_hangs_the_run_nor_loses_what_it_submitted(monkeypatch, tmp_path) -> None:
    calls = {"n": 0}
    real = _FakeQueue.submit

    def flaky(self, job):
        calls["n"] += 1
        if job.experiment == "producer-asyncio" and calls["n"] > 2:
            raise RuntimeError("the queue refused the job")
        return real(self, job)

    monkeypatch.setattr(_FakeQueue, "submit", flaky)
    s = _fake_run(monkeypatch, tmp_path, ["--sections", "queue", "--queue-jobs", "passing", "--queue-rounds", "2"], step_s=0.0)
    never = [e for e in s["errors"] if e["traceback"].startswith("never submitted")]
    assert never and len(s["queue"]) + len(never) == 6  # every job graded or named
    assert any(e["what"] == "queue producer" and "the queue refused the job" in e["traceback"] for e in s["errors"])


def _job(*, serial: list[float], queue: list[float], syncs: int = 0, key: str = "baseline/28/cute") -> dict:
    s = {(key if i == 0 else f"{key}#s{i}"): _r(True, None, us) | {"host_syncs": syncs} for i, us in enumerate(serial)}
    q = {f"{key}#r{i}": _r(True, None, us) | {"host_syncs": syncs} for i, us in enumerate(queue)}
    return {"serial": s, "queue": q}


def test_the_queue_effect_is_read_over_jobs_and_leaves_out_calls_that_read_the_host() -> None:
    import pytest

    jobs = [_job(key=f"baseline/{p}/cute", serial=[100.0, 100.4], queue=[100.0 + d, 100.4 + d])
            for p, d in ((1, 0.3), (25, -0.3), (28, 0.1), (72, -0.1))]
    host = _job(key="baseline/23/cute", serial=[100.0, 150.0], queue=[60.0, 70.0], syncs=2)
    s = _summary({k: v for j in jobs + [host] for k, v in j["serial"].items()},
                 {k: v for j in jobs + [host] for k, v in j["queue"].items()})
    cases = [qr.Case(f"baseline/{p}/cute", p, "cute", Path("b.py"), None) for p in (1, 23, 25, 28, 72)]
    lines: list[str] = []
    qr.conclude(s, cases, log=lambda *a: lines.append(" ".join(map(str, a))))
    e = s["queue_effect"]
    # 23 reads the host: left out and named, though its 40% shift would swamp the rest
    assert e["jobs"] == 4 and e["left_out_host"] == ["baseline/23/cute"]
    assert e["mean"] == pytest.approx(0.0, abs=1e-4) and e["within_tol"] and s["result"]["queue_effect_within_0_5pct"]
    assert e["same_arm_pairs"] == 4 and e["cross_pairs"] == 16
    assert any(line.startswith("EFFECT over 4 jobs") and "within 0.5%" in line for line in lines)
    # a shift every job shares is the queue's, and is not hidden by each job's own spread
    shifted = [_job(key=f"baseline/{p}/cute", serial=[100.0, 100.4], queue=[100.9 + d, 101.3 + d])
               for p, d in ((1, 0.1), (25, -0.1), (28, 0.05), (72, -0.05))]
    s2 = _summary({k: v for j in shifted for k, v in j["serial"].items()}, {k: v for j in shifted for k, v in j["queue"].items()})
    qr.conclude(s2, cases)
    assert s2["queue_effect"]["mean"] == pytest.approx(0.009, abs=5e-4) and not s2["queue_effect"]["within_tol"]
    # spread across jobs widens the interval: a mean of 0 with jobs at +-0.6% is not shown within 0.5% from two jobs
    wide = [_job(key=f"baseline/{p}/cute", serial=[100.0], queue=[100.0 + d]) for p, d in ((1, 0.6), (25, -0.6))]
    s3 = _summary({k: v for j in wide for k, v in j["serial"].items()}, {k: v for j in wide for k, v in j["queue"].items()})
    qr.conclude(s3, cases)
    assert not s3["queue_effect"]["within_tol"] and s3["queue_effect"]["same_arm_median"] is None
    # no job graded both ways: nothing to read
    s4 = _summary({k: v for k, v in jobs[0]["serial"].items()})
    qr.conclude(s4, cases)
    assert s4["queue_effect"] is None and s4["result"]["queue_effect_within_0_5pct"] is None


def test_host_syncs_is_the_most_of_any_profiled_call() -> None:
    assert qr.host_syncs({"profiled": [{"host_syncs": 0}, {"host_syncs": 2}, {"other": 1}]}) == 2
    assert qr.host_syncs({"profiled": []}) is None and qr.host_syncs(None) is None


def test_a_recorded_run_is_judged_again_from_its_summary_and_its_events(tmp_path, monkeypatch) -> None:
    import json

    import pytest

    from mkb.events import EventWriter

    store = tmp_path / "events" / "run"
    w = EventWriter(str(store))
    for eid, syncs in (("e-host", 2), ("e-host-q", 2), ("e-dev", 0), ("e-dev-q", 0)):
        w.emit("integrity", evaluation_id=eid, problem=23 if "host" in eid else 28, dsl="cute", kernel_sha256="x", ok=True,
               details=json.dumps({"profiled": [{"host_syncs": syncs}]}))
    w.close()
    summary = {"serial": {"baseline/23/cute": _r(True, None, 100.0) | {"evaluation_id": "e-host"},
                          "baseline/28/cute": _r(True, None, 82.0) | {"evaluation_id": "e-dev"}},
               "queue": {"baseline/23/cute#r0": _r(True, None, 140.0) | {"evaluation_id": "e-host-q"},
                         "baseline/28/cute#r0": _r(True, None, 82.1) | {"evaluation_id": "e-dev-q"}}}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    monkeypatch.setattr(qr, "cases", lambda tmp: [qr.Case("baseline/23/cute", 23, "cute", Path("b.py"), None),
                                                  qr.Case("baseline/28/cute", 28, "cute", Path("c.py"), None)])
    out = qr.rejudge(path, store)
    assert out["serial"]["baseline/23/cute"]["host_syncs"] == 2  # read from the run's own integrity events
    assert out["queue_effect"]["left_out_host"] == ["baseline/23/cute"] and out["queue_effect"]["jobs"] == 1
    with pytest.raises(SystemExit, match="hint: pass a gpu_queue_run summary.json"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        qr.rejudge(bad, None)
    with pytest.raises(SystemExit, match="not a readable summary.json"):
        qr.rejudge(tmp_path / "missing.json", None)


def test_the_effect_pooled_over_runs_counts_each_job_once() -> None:
    import pytest

    a = {"queue_effect": {"per_job": {"baseline/1/cute": 0.004, "baseline/25/cute": -0.002}}}
    b = {"queue_effect": {"per_job": {"baseline/1/cute": 0.000, "baseline/28/cute": 0.001}}}
    e = qr.pooled_effect([a, b])
    # 1 cute's two runs averaged (0.2%), then the mean over the three jobs
    assert e["jobs"] == 3 and e["runs"] == 2 and e["mean"] == pytest.approx((0.002 - 0.002 + 0.001) / 3)
    assert e["within_tol"]
    assert qr.pooled_effect([{"queue_effect": None}]) is None
    shifted = [{"queue_effect": {"per_job": {f"baseline/{p}/cute": 0.01 + 0.0001 * p for p in (1, 25, 28)}}}]
    assert not qr.pooled_effect(shifted)["within_tol"]


def test_the_source_digest_names_the_code_not_the_commit(tmp_path) -> None:
    import gpu_grader_run as gr

    (tmp_path / "mkb" / "grader").mkdir(parents=True)
    (tmp_path / "mkb" / "__init__.py").write_text("")
    (tmp_path / "mkb" / "grader" / "_x.py").write_text("A = 1\n")
    (tmp_path / "README.md").write_text("not code")
    first = gr.source_digest(tmp_path)
    (tmp_path / "README.md").write_text("changed, still not code")
    assert gr.source_digest(tmp_path) == first
    (tmp_path / "mkb" / "grader" / "_x.py").write_text("A = 2\n")
    assert gr.source_digest(tmp_path) != first
    second = gr.source_digest(tmp_path)
    (tmp_path / "problems" / "x").mkdir(parents=True)
    (tmp_path / "problems" / "x" / "problem.py").write_text("N = 1\n")  # the problems it times are the code too
    assert gr.source_digest(tmp_path) != second
    (tmp_path / "problems" / "x" / "problem.py").unlink()
    (tmp_path / "mkb" / "grader" / "_x.py").write_text("A = 1\n")
    assert gr.source_digest(tmp_path) == first
    # a file moved is other code, though its bytes are the same
    (tmp_path / "mkb" / "grader" / "_x.py").write_text("A = 1\n")
    (tmp_path / "mkb" / "grader" / "_x.py").rename(tmp_path / "mkb" / "_x.py")
    assert gr.source_digest(tmp_path) != first


def test_an_unknown_host_syncs_is_not_taken_for_device_only_and_rejudge_asks_for_the_store(tmp_path) -> None:
    import json

    import pytest

    # a summary older than the figure: 23's rows have no host_syncs; taken as 0, its 40% shift would swamp the effect
    serial = {"baseline/23/cute": _r(True, None, 100.0), "baseline/28/cute": _r(True, None, 82.0) | {"host_syncs": 0}}
    queue = {"baseline/23/cute#r0": _r(True, None, 140.0), "baseline/28/cute#r0": _r(True, None, 82.1) | {"host_syncs": 0}}
    s = _summary(serial, queue)
    cases = [qr.Case("baseline/23/cute", 23, "cute", Path("b.py"), None), qr.Case("baseline/28/cute", 28, "cute", Path("c.py"), None)]
    lines: list[str] = []
    qr.conclude(s, cases, log=lambda *a: lines.append(" ".join(map(str, a))))
    assert s["queue_effect"]["jobs"] == 1 and s["queue_effect"]["left_out_unknown"] == ["baseline/23/cute"]
    assert any("not known to: ['baseline/23/cute']" in line for line in lines)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(_summary(serial, queue)))
    with pytest.raises(SystemExit, match="no host_syncs.*hint: add --store"):
        qr.rejudge(path, None)


def test_a_store_that_holds_none_of_the_summarys_verdicts_is_refused(tmp_path) -> None:
    import json

    import pytest

    from mkb.events import EventWriter

    store = tmp_path / "other"
    w = EventWriter(str(store))
    w.emit("integrity", evaluation_id="someone-else", problem=23, dsl="cute", kernel_sha256="x", ok=True,
           details=json.dumps({"profiled": [{"host_syncs": 2}]}))
    w.close()
    summary = {"serial": {"baseline/23/cute": _r(True, None, 100.0) | {"evaluation_id": "e1"}}, "queue": {}}
    with pytest.raises(SystemExit, match="none of the summary's 1 verdicts.*hint: pass the dataset folder"):
        qr.with_host_syncs(summary, store)


def test_only_grades_the_jobs_its_pattern_finds_in_every_section_and_an_empty_pick_is_refused(monkeypatch, tmp_path) -> None:
    s = _fake_run(monkeypatch, tmp_path, ["--sections", "serial,queue", "--only", "/tirx$|host_compute"], step_s=0.0)
    assert sorted(s["serial"]) == ["baseline/28/tirx", "redteam/host_compute/cute"]
    assert sorted(s["queue"]) == ["baseline/28/tirx", "redteam/host_compute/cute"]
    assert s["result"]["gradings_per_pass"] == 2
    with pytest.raises(SystemExit, match="finds no job"):
        _fake_run(monkeypatch, tmp_path / "none", ["--sections", "serial", "--only", "nothing-like-this"], step_s=0.0)


def test_an_abba_plan_alternates_the_sides_so_a_linear_drift_lands_on_both() -> None:
    assert qr.pass_plan(serial_rounds=2, queue_rounds=3) == [("serial", [0, 1]), ("queue", [0, 1, 2])]
    assert qr.pass_plan(serial_rounds=0, queue_rounds=1) == [("queue", [0])]  # --serial-from: the queue alone
    plan = qr.pass_plan(serial_rounds=4, queue_rounds=4, order="abba")
    assert plan == [("serial", [0]), ("queue", [0, 1]), ("serial", [1, 2]), ("queue", [2, 3]), ("serial", [3])]
    # the rounds in time order: each side's mean position is the same, so a drift linear in time cancels
    order = [(side, r) for side, rounds in plan for r in rounds]
    pos = {side: [i for i, (s, _) in enumerate(order) if s == side] for side in ("serial", "queue")}
    assert sum(pos["serial"]) == sum(pos["queue"]) and sorted(r for s, r in order if s == "queue") == [0, 1, 2, 3]
    assert qr.pass_plan(serial_rounds=1, queue_rounds=1, order="abba") == [("serial", [0]), ("queue", [0])]
    for s, q in ((2, 3), (0, 2)):
        with pytest.raises(SystemExit, match="as many serial as queue rounds"):
            qr.pass_plan(serial_rounds=s, queue_rounds=q, order="abba")


def test_an_abba_run_grades_every_round_once_in_its_own_steps_and_pools_them(monkeypatch, tmp_path) -> None:
    s = _fake_run(monkeypatch, tmp_path, ["--sections", "serial,queue", "--serial-jobs", "passing", "--queue-jobs", "passing",
                                          "--serial-rounds", "4", "--queue-rounds", "4", "--order", "abba"], step_s=0.0)
    assert s["plan"] == [["serial", [0]], ["queue", [0, 1]], ["serial", [1, 2]], ["queue", [2, 3]], ["serial", [3]]]
    jobs = ["baseline/28/cute", "baseline/28/tirx", "redteam/control/cute"]
    assert sorted(s["serial"]) == sorted([j if r == 0 else f"{j}#s{r}" for j in jobs for r in range(4)])
    assert sorted(s["queue"]) == sorted(f"{j}#r{r}" for j in jobs for r in range(4))
    assert len(s["pair"]) == 2  # one pair batch, in the last queue step
    res = s["result"]
    assert res["serial_gradings"] == 12 and res["queue_gradings"] == 12 and res["medians_pooled_compared"] == 3
    assert s["queue_quiet_replayed"]["beside_timing"] == [] and not s["skipped"] and not s["errors"]
    assert res["guards"] == {"landlock abi 7: ... write only beneath <scratch>, /dev; no TCP | seccomp: setsid, ... refused": 24}


def test_replays_of_several_queue_steps_add_up() -> None:
    a = {"timing_phases": 3, "beside_timing": [], "warm_ups_beside_timing": 1, "go_beside_timing": ["x"], "beside_teardown": 0}
    b = {"timing_phases": 2, "beside_timing": ["y"], "warm_ups_beside_timing": 0, "go_beside_timing": [], "beside_teardown": 2}
    assert qr.merged_replays(None, a) == a
    assert qr.merged_replays(a, b) == {"timing_phases": 5, "beside_timing": ["y"], "warm_ups_beside_timing": 1,
                                       "go_beside_timing": ["x"], "beside_teardown": 2}


def test_under_an_interleaved_plan_a_job_missing_a_planned_round_is_left_out_and_named() -> None:
    import pytest

    full = [_job(key=f"baseline/{p}/cute", serial=[100.0, 100.4], queue=[100.0, 100.4]) for p in (1, 25, 28)]
    cut = _job(key="baseline/72/cute", serial=[100.0], queue=[103.0, 103.0])  # its last serial round never ran
    serial = {k: v for j in full + [cut] for k, v in j["serial"].items()}
    queue = {k: v for j in full + [cut] for k, v in j["queue"].items()}
    cases = [qr.Case(f"baseline/{p}/cute", p, "cute", Path("b.py"), None) for p in (1, 25, 28, 72)]
    s = {**_summary(serial, queue), "plan": [["serial", [0]], ["queue", [0, 1]], ["serial", [1]]]}
    lines: list[str] = []
    qr.conclude(s, cases, log=lambda *a: lines.append(" ".join(map(str, a))))
    e = s["queue_effect"]
    assert e["jobs"] == 3 and e["left_out_unbalanced"] == ["baseline/72/cute"] and e["mean"] == pytest.approx(0.0)
    assert any("missing a planned round: ['baseline/72/cute']" in line for line in lines)
    # one pass each way (no plan recorded, or --order passes): whatever rounds ran are read, as before
    for plan in (None, [["serial", [0, 1]], ["queue", [0, 1]]]):
        s2 = {**_summary(serial, queue), **({"plan": plan} if plan else {})}
        qr.conclude(s2, cases)
        assert s2["queue_effect"]["jobs"] == 4 and s2["queue_effect"]["left_out_unbalanced"] == []
    assert qr.planned_rounds([["serial", [0]], ["queue", [0, 1]], ["serial", [1, 2]], ["queue", [2, 3]], ["serial", [3]]]) \
        == {"serial": 4, "queue": 4}
