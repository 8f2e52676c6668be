"""Every second of a grading's wall time in a named phase (mkb.grader._phases), on the CPU with the fake DSL."""

from __future__ import annotations

import glob
import json
import math

import pyarrow.parquet as pq
import pytest

from fake_dsl import TORCH_BASELINE_28
from mkb.grader import GradeJob, GradingQueue, grade
from mkb.grader._phases import KERNEL_PHASES, UNATTRIBUTED, PhaseClock, attribute, clean_timeline, overhead_of


def _sums_to(phases: dict[str, float], total: float) -> None:
    assert sum(phases.values()) == pytest.approx(total, abs=1e-4)


# ---------------- the join, as a pure function ----------------

def test_attribute_splices_the_worker_in_and_takes_the_kernel_out():
    parent = {"read_kernel": 0.01, "problem_identity": 0.005, "pool_take": 0.002, "worker_wait": 0.3,
              "trusted_lookup": 0.001, "worker_job": 2.0, "teardown": 0.02, "verdict": 0.001}
    worker = {"setup": 0.01, "trusted.draws_and_recheck_sets": 0.4, "trusted.other": 0.01, "run.compile": 1.0,
              "run.timing_loop": 0.3, "run.other": 0.05, "integrity": 0.01, "report": 0.0}
    wall = sum(parent.values()) + 0.004  # 4 ms the parent's clock did not cover
    ph = attribute(wall_s=wall, parent=parent, worker=worker, compile_s=0.8, timed_s=0.05)
    _sums_to(ph, wall)
    assert ph["parent.ipc"] == pytest.approx(2.0 - sum(worker.values()))
    assert "parent.worker_job" not in ph  # replaced by the worker's own phases
    assert ph["kernel.compile"] == pytest.approx(0.8) and ph["worker.run.compile"] == pytest.approx(0.2)
    assert ph["kernel.timed"] == pytest.approx(0.05) and ph["worker.run.timing_loop"] == pytest.approx(0.25)
    assert ph[UNATTRIBUTED] == pytest.approx(0.004)
    assert overhead_of(ph) == pytest.approx(wall - 0.8 - 0.05)  # Verdict.overhead_s's definition
    assert ph["worker.trusted.draws_and_recheck_sets"] == 0.4


def test_attribute_without_a_worker_timeline_keeps_the_drive_loop_as_one_phase():
    parent = {"read_kernel": 0.01, "worker_wait": 0.1, "trusted_lookup": 0.0, "worker_job": 3.0, "teardown": 0.5}
    ph = attribute(wall_s=3.7, parent=parent, worker=None, compile_s=1.0, timed_s=None)
    _sums_to(ph, 3.7)
    assert ph["parent.worker_job"] == pytest.approx(2.0) and ph["kernel.compile"] == pytest.approx(1.0)
    assert "parent.ipc" not in ph and "kernel.timed" not in ph


def test_attribute_takes_kernel_time_from_the_next_holder_when_a_phase_is_short():
    # a compile that failed after the first call: run.compile was never marked, run.other holds it
    ph = attribute(wall_s=1.0, parent={"worker_job": 1.0}, worker={"run.other": 0.9, "report": 0.05}, compile_s=0.7)
    _sums_to(ph, 1.0)
    assert ph["worker.run.other"] == pytest.approx(0.2) and ph["kernel.compile"] == pytest.approx(0.7)
    assert all(v >= 0 for k, v in ph.items() if k != UNATTRIBUTED)


@pytest.mark.parametrize("bad", [None, [], "x", {"a": "1"}, {"a": math.nan}, {"a": math.inf}, {"a": -1.0},
                                 {"a": True}, {str(i): 0.1 for i in range(65)}, {"x" * 65: 0.1}, {1: 0.1}])
def test_a_malformed_worker_timeline_is_dropped(bad):
    assert clean_timeline(bad) is None


def test_a_clean_timeline_is_kept_with_floats():
    assert clean_timeline({"setup": 1, "report": 0.0}) == {"setup": 1.0, "report": 0.0}


def test_phase_clock_spans_are_consecutive():
    c = PhaseClock(start=0.0)  # a start long ago: the first span holds everything since
    c.mark("a")
    c.mark("b")
    assert c.s["a"] > 0 and c.s["b"] >= 0 and list(c.s) == ["a", "b"]


# ---------------- end to end: the verdict and its event ----------------

CRASH_IN_COMPILE = "import os\n\n\ndef solve(x, residual, weight):\n    os._exit(7)\n"


def _verdict_details(store: str) -> dict[str, dict]:
    rows = []
    for f in sorted(glob.glob(f"{store}/kind=verdict/*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return {r["evaluation_id"]: json.loads(r["details"]) for r in rows}


def test_queue_verdicts_attribute_every_second(tmp_path, fake_dsl, cpu_config, store):
    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    with GradingQueue(device="cpu", store=store, config=cpu_config, dsls=(fake_dsl,), depth=2) as q:
        first = q.submit(GradeJob(28, fake_dsl, good)).result()
        second = q.submit(GradeJob(28, fake_dsl, good)).result()
    for v in (first, second):
        assert v.passed, v.message
        ph = v.phases_s
        _sums_to(ph, v.wall_s)
        assert overhead_of(ph) == pytest.approx(v.overhead_s, abs=1e-4)
        for name in ("parent.problem_identity", "parent.static_rules", "parent.pool_take", "parent.worker_wait",
                     "parent.ipc", "parent.teardown", "worker.setup", "worker.trusted.load_problem",
                     "worker.trusted.draws_and_recheck_sets", "worker.trusted.guard_snapshot", "worker.run.verify_checks",
                     "worker.run.timing_loop", "worker.run.final_check", "worker.integrity", *KERNEL_PHASES):
            assert name in ph, name
        assert "parent.worker_job" not in ph  # the worker's timeline arrived and was spliced in
        assert abs(ph[UNATTRIBUTED]) < 0.05 * v.wall_s + 0.01
        assert ph["kernel.compile"] == pytest.approx(v.stage("compile").figures["compile_s"], abs=1e-6)
        assert ph["kernel.timed"] == pytest.approx(v.stage("timing").figures["timed_s"], abs=1e-6)
        t = v.stage("timing").typed  # what sets the timed sets' cost (grader 2.14): one set's bytes, the budget, the segments
        assert t.input_set_bytes and t.input_set_bytes > 0 and t.input_sets_alive
        assert t.input_budget_bytes is None and t.input_sets_first_pass_segments is None  # off the GPU: no budget, no allocator
        made = t.input_sets_made  # grader 2.19: the phase split (first pass, sets, CPU) beside the allocator's counters
        assert made["sets_made"] == t.input_sets_alive and made["device_frees"] is None
        assert made["first_pass_s"] + made["make_s"] <= ph["worker.run.timing_inputs"] + 1e-3
        split = t.loop_split_s  # grader 2.21: the candidate loop by part, all inside its phases
        assert set(split) == {"inputs", "before", "window", "after", "between"} and split["window"] > 0
        loop_phases = ph["worker.run.timing_loop"] + ph.get("worker.run.profiled_calls", 0.0) + ph["kernel.timed"]
        assert sum(split.values()) <= loop_phases + 2e-3
    # the eager timing is measured once per session: the first grading has it, the second not
    assert "worker.trusted.eager_timing" in first.phases_s and "worker.trusted.eager_timing" not in second.phases_s
    details = _verdict_details(store)
    for v in (first, second):
        assert details[v.evaluation_id]["phases_s"] == pytest.approx(v.phases_s)
        _sums_to(details[v.evaluation_id]["phases_s"], details[v.evaluation_id]["wall_s"])


def test_a_static_rule_failure_is_attributed_without_a_worker(tmp_path, fake_dsl, cpu_config, store):
    bad = tmp_path / "bad.py"
    bad.write_text(TORCH_BASELINE_28 + "\nimport subprocess\n")
    v = grade(28, fake_dsl, bad, store=store, config=cpu_config)
    assert not v.passed and v.reason == "static_subprocess", v.message
    _sums_to(v.phases_s, v.wall_s)
    assert set(v.phases_s) == {"parent.read_kernel", "parent.problem_identity", "parent.static_rules", "parent.verdict",
                               UNATTRIBUTED}


def test_a_worker_that_dies_sends_no_timeline_and_its_drive_loop_stays_one_phase(tmp_path, fake_dsl_runtime,
                                                                                  cpu_config, store):
    crash = tmp_path / "crash.py"
    crash.write_text(CRASH_IN_COMPILE)
    v = grade(28, fake_dsl_runtime, crash, store=store, config=cpu_config)
    assert not v.passed, v.message
    _sums_to(v.phases_s, v.wall_s)
    assert "parent.worker_job" in v.phases_s and not any(k.startswith("worker.") for k in v.phases_s)
    assert "parent.pool_close" in v.phases_s  # grade() without a pool spawns one worker and closes it
    assert _verdict_details(store)[v.evaluation_id]["phases_s"] == pytest.approx(v.phases_s)


# ---------------- the benchmark's sections on the CPU (the GPU run's code path, with the fake DSL) ----------------

def test_grader_bench_sections_print_overhead_by_phase_and_respect_the_budget(grader_bench, fake_dsl, cpu_config, store):
    import time

    bench = grader_bench
    lines: list[str] = []
    o = bench.overhead(problem=28, repeats=2, config=cpu_config, store=store, device="cpu", log=lines.append)
    d = o["dsls"][fake_dsl]
    assert len(d["runs"]) == 2 and d["all_passed"]
    phases = {p["phase"]: p for p in d["phases"]}
    assert "worker.trusted.draws_and_recheck_sets" in phases and "kernel.compile" in phases
    mean_ovh = sum(p["mean_s"] for p in d["phases"] if not p["phase"].startswith("kernel."))
    assert mean_ovh == pytest.approx(sum(r["overhead_s"] for r in d["runs"]) / 2, abs=1e-3)
    assert any("overhead by phase" in x and "worker.trusted.draws_and_recheck_sets" in x for x in lines)
    # throughput with a budget already spent once the first grading is running: the rest are cancelled, none cut short
    t = bench.throughput(rounds=4, config=cpu_config, store=store, device="cpu", depth=2, low_water=1,
                         log=lines.append, deadline=time.monotonic())
    assert t["cancelled"] >= 1 and t["gradings"] + t["cancelled"] == 4 and t["all_passed"]
    full = bench.throughput(rounds=2, config=cpu_config, store=store, device="cpu", depth=2, low_water=1, log=lines.append)
    assert full["gradings"] == 2 and full["cancelled"] == 0 and full["all_passed"] and full["gradings_per_gpu_hour"] > 0
    assert full["steady_gradings"] == 1  # the second found the session's eager and reference timings
    assert any("throughput: overhead by phase" in x for x in lines)
    assert "n/a" in bench.summary({"throughput": t}) or t["gradings"]  # nothing finished: printed, not a crash
    text = bench.summary({"overhead": [o], "throughput": full})
    assert "FIGURE overhead per evaluation" in text and "largest phases" in text and "eager and reference timings cached" in text
    assert "FIGURE throughput candidate loop by part (median s): 28: inputs " in text


def test_grader_bench_attributes_a_committed_pre_2_4_store(repo_script):
    from pathlib import Path

    bench = repo_script("benchmarks/grader_bench.py")
    store = Path(__file__).resolve().parents[2] / "events" / "h200-checks-ab-2"
    if not store.is_dir():
        pytest.skip("the committed H200 dataset is not in this checkout")
    c = bench.committed(str(store), log=lambda *_: None)
    assert c["passed"] == 64 and 0 < c["warm"] < 64
    names = {p["phase"] for p in c["phases"]}
    assert {"worker.trusted.draws_and_recheck_sets", "worker.run.timing_loop", "kernel.compile", "rest"} <= names
    mean_ovh = sum(p["mean_s"] for p in c["phases"] if not p["phase"].startswith("kernel."))
    mean_kernel = sum(p["mean_s"] for p in c["phases"] if p["phase"].startswith("kernel."))
    assert mean_ovh > 0 and mean_kernel > 0
    assert "FIGURE committed" in bench.summary({"committed": [c]})


def test_grader_bench_main_writes_the_json_and_the_packed_store(grader_bench, tmp_path, fake_dsl, capsys):
    import json
    import tarfile

    bench = grader_bench
    out = tmp_path / "out"
    bench.main(["--smoke", "--device", "cpu", "--problem", "28", "--repeats", "1", "--rounds", "1", "--depth", "2",
                "--low-water", "1", "--budget-s", "600", "--out", str(out), "--name", "bench-test"])
    printed = capsys.readouterr().out
    assert "FIGURE overhead per evaluation" in printed and "FIGURE gradings per GPU-hour" in printed
    res = json.loads((out / "grader_bench.json").read_text())
    assert res["overhead"][0]["dsls"][fake_dsl]["all_passed"] and res["throughput"]["gradings"] == 1
    with tarfile.open(out / "events.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.startswith("bench-test/kind=verdict/") and n.endswith(".parquet") for n in names)


def test_a_worker_that_never_starts_is_attributed_to_the_wait(tmp_path, monkeypatch, cpu_config, store):
    import os

    from mkb.dsl import _registry
    from mkb.grader._backends import backend_from_target

    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setitem(_registry.BACKENDS, "broken", "fake_dsl:FakeBackendBrokenToolchain")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    backend_from_target.cache_clear()
    try:
        good = tmp_path / "good.py"
        good.write_text(TORCH_BASELINE_28)
        v = grade(28, "broken", good, store=store, config=cpu_config)
    finally:
        backend_from_target.cache_clear()
    assert not v.passed and v.reason == "infra_error", v.message
    _sums_to(v.phases_s, v.wall_s)
    assert v.phases_s["parent.worker_wait"] > 0.5 * (v.wall_s - v.phases_s["parent.pool_take"])
    assert "parent.worker_job" not in v.phases_s and not any(k.startswith("worker.") for k in v.phases_s)
