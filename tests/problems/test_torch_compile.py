"""The torch.compile characterisation on the CPU at smoke size: concurrency with quiet timing windows, failures
recorded with their class, resume, the compile cap and the budget stop (fake compilers, and real dynamo)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import fake_compilers
from mkb.events import schema_for
from mkb.problems import get_problem
from mkb.problems._torch_compile import (ANCHOR_FACTOR, CONTEXT_BYTES, MEASURED_HEADROOM, OTHER_MODE_HEADROOM, Context, PeakEvidence,
                                         Task, _final, estimate_peak, fits, oom_need_bytes, peak_evidence, plan, recorded,
                                         run_torch_compile)

FAKE = f"{fake_compilers.__name__}:fake"


def _rows(store) -> list[dict]:
    out = []
    for f in sorted(store.rglob("kind=torch_compile/*.parquet")):
        t = pq.read_table(f)
        assert set(schema_for("torch_compile").names) == set(t.column_names)
        out += t.to_pylist()
    return out


def _run(store, only, behaviour, monkeypatch, **kw):
    monkeypatch.setenv("MKB_FAKE_COMPILE", json.dumps(behaviour))
    opts = dict(store=str(store), size="smoke", device="cpu", only=only, modes=("default",), compiler=FAKE,
                budget_s=300, concurrency=2, warm=False, share_s=0.5, kill_margin_s=1.0, min_start_s=0.0,
                cache_dir=str(store.parent / "cache"), log=lambda s: None)
    opts.update(kw)
    return run_torch_compile(**opts)


@pytest.mark.slow
def test_concurrent_compiles_are_paused_while_one_times_and_failures_are_recorded(tmp_path, monkeypatch):
    store, beats = tmp_path / "ds", tmp_path / "beats"
    monkeypatch.setenv("MKB_FAKE_HEARTBEAT", str(beats))
    monkeypatch.setenv("MKB_FAKE_BUSY_UNTIL_ROWS_IN", str(store / "kind=torch_compile"))  # a slow start cannot dodge it
    monkeypatch.setenv("MKB_FAKE_DYNAMO_AFTER_BEAT", "1")  # nor a slow start of the busy one
    rep = _run(store, ["25", "28", "29", "36"], {"25": "busy", "28": "dynamo", "29": "raise", "36": "wrong"},
               monkeypatch, concurrency=4)
    by = {r["problem"]: r for r in _rows(store)}
    assert sorted(by) == [25, 28, 29, 36] and not rep.unfinished
    assert by[28]["status"] == "ok" and by[28]["ok"] and by[28]["graphs"] >= 1  # a real dynamo compile
    for r in (by[25], by[28]):
        assert r["median_us"] > 0 and r["eager_median_us"] > 0 and r["n_timed"] >= 20 and r["compile_s"] > 0
        assert r["speedup_over_eager"] == pytest.approx(r["eager_median_us"] / r["median_us"])
        assert r["problem_hash"] == get_problem(r["problem"]).hash and r["concurrency"] == 4 and r["gpu"] == "cpu"
    assert by[29]["status"] == "compile_error" and not by[29]["ok"]
    assert by[29]["error_class"] == "fake_compilers.FakeCompilerError" and "refuses" in by[29]["error"]
    assert by[36]["status"] == "mismatch" and by[36]["error_class"].startswith("Mismatch(") and by[36]["median_us"] is None
    assert by[25]["backend"].startswith("inductor via ")  # a fake is named, never taken for torch.compile
    # the busy compile overlapped the others' timing windows, made no progress inside them, and their length is
    # not in its compile time
    times = [float(x) for x in beats.read_text().split()]
    windows = [(a, b) for name, a, b in rep.windows if not name.startswith("25_")]
    assert windows, "no timing window was recorded"
    t0, t1 = min(times), max(times)
    overlapped = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in windows)
    assert overlapped > 0, "the busy compile never ran beside a timing window: the test shows nothing"
    assert not [t for t in times for a, b in windows if a + 0.05 < t < b], "a compile made progress inside a quiet window"
    assert by[25]["compile_s"] < (t1 - t0) - overlapped + 1.0

    # resumed: everything recorded is skipped, nothing is started
    again = _run(store, ["25", "28", "29", "36"], {}, monkeypatch)
    assert not again.rows and len(again.skipped) == 4 and len(_rows(store)) == 4


@pytest.mark.slow
def test_budget_stop_leaves_the_task_for_the_next_run_and_the_cap_records_a_timeout(tmp_path, monkeypatch):
    store = tmp_path / "ds"
    stopped = _run(store, ["24"], {"24": "hang"}, monkeypatch, budget_s=4.0)
    assert stopped.stopped_by_budget and [t.problem for t in stopped.unfinished] == [get_problem(24).slug]
    assert not _rows(store)  # a task cut by the budget records nothing
    rep = _run(store, ["24"], {"24": "hang"}, monkeypatch, modes=("default", "max-autotune-no-cudagraphs"),
               caps={"default": 2.0, "max-autotune-no-cudagraphs": 2.0})
    rows = _rows(store)
    assert len(rep.rows) == 2 and {r["status"] for r in rows} == {"timeout"}
    assert all(r["error_class"] == "CompileTimeout" and r["compile_cap_s"] == 2.0 for r in rows)
    assert all(2.0 <= r["compile_s"] < 30 for r in rows)
    # the same cap: settled; a larger one: tried again
    same = _run(store, ["24"], {"24": "ok"}, monkeypatch, caps={"default": 2.0})
    assert not same.rows and len(same.skipped) == 1
    bigger = _run(store, ["24", "23"], {"24": "ok", "23": "die"}, monkeypatch, caps={"default": 60.0})
    by = {r["problem"]: r for r in bigger.rows}
    assert by[24]["status"] == "ok"
    assert by[23]["status"] == "compile_error" and by[23]["error_class"] == "WorkerDied(3)"  # recorded, the run went on


def test_what_was_recorded_is_read_without_polars(tmp_path, monkeypatch):
    """The resume reads the store on the GPU host, which has pyarrow but no polars."""
    import subprocess
    import sys

    from mkb.events import EventWriter

    store = tmp_path / "ds"
    p = get_problem(28)
    with EventWriter(str(store)) as w:
        w.emit("torch_compile", problem=28, problem_name=p.slug, family=p.family, problem_hash=p.hash, size="smoke", mode="default",
               backend="inductor", gpu="cpu", torch_version="9.9", status="timeout", ok=False, compile_cap_s=30.0)
    code = ("import sys; sys.modules['polars'] = None\n"
            "from mkb.problems._torch_compile import Context, recorded\n"
            f"d = recorded({str(store)!r}, size='smoke', ctx=Context('cpu', None, '9.9', None), backend='inductor')\n"
            "print(sorted((m, v) for (h, m), v in d.items()))\n"
            "from mkb.problems._torch_compile import peak_evidence\n"
            f"print(peak_evidence({str(store)!r}, [{str(store)!r}], size='smoke', ctx=Context('cpu', None, '9.9', None), backend='inductor'))\n"
            # what is asserted is printed by now; a native thread pool's teardown at interpreter exit once aborted the
            # process under CI load ("terminate called without an active exception", exit -6) after both lines
            "import os; sys.stdout.flush(); os._exit(0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines() == ["[('default', [('timeout', None, 30.0, None)])]", "{}"]


def test_plan_is_mode_major_and_only_final_outcomes_settle_a_key():
    ps = [get_problem(28), get_problem(29)]
    caps = {"default": 100.0, "max-autotune-no-cudagraphs": 50.0}
    done = {(ps[0].hash, "default"): [("ok", None, 100.0)],
            (ps[1].hash, "default"): [("timeout", "CompileTimeout", 30.0)],
            (ps[0].hash, "max-autotune-no-cudagraphs"): [("timeout", "CompileTimeout", 50.0)],
            (ps[1].hash, "max-autotune-no-cudagraphs"): [("runtime_error", "torch.OutOfMemoryError", 50.0)]}
    todo, skipped = plan(ps, modes=("default", "max-autotune-no-cudagraphs"), caps=caps, done=done)
    assert [(t.number, t.mode) for t in todo] == [(29, "default"), (29, "max-autotune-no-cudagraphs")]
    assert [(t.number, t.mode) for t in skipped] == [(28, "default"), (28, "max-autotune-no-cudagraphs")]
    assert isinstance(todo[0], Task) and todo[0].cap_s == 100.0
    assert _final("compile_error", "torch._dynamo.exc.Unsupported", None, 1.0)
    assert _final("mismatch", "Mismatch(wrong_values)", 1.0, 1.0)
    assert not _final("runtime_error", "WorkerDied(-9)", 1.0, 1.0)
    assert not _final("weird", None, 1.0, 1.0)
    assert _final("oom_alone", "torch.OutOfMemoryError", 1.0, 1.0)  # out of memory with the GPU to itself: final
    assert not _final("runtime_error", "torch.OutOfMemoryError", 1.0, 1.0)  # beside others: tried again
    # dynamo/inductor may wrap torch's OOM in their own class: the message still tells
    assert not _final("compile_error", "torch._inductor.exc.InductorError", 1.0, 1.0, "OutOfMemoryError: CUDA out of memory. Tried")
    assert _final("compile_error", "torch._inductor.exc.InductorError", 1.0, 1.0, "LoweringException: no")


def test_bad_modes_and_sizes_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown torch.compile mode"):
        run_torch_compile(store=str(tmp_path), modes=("reduce-overhead",), device="cpu")
    with pytest.raises(ValueError, match="unknown size"):
        run_torch_compile(store=str(tmp_path), size="huge", device="cpu")


@pytest.mark.slow
def test_the_gpu_script_records_packs_and_summarises(tmp_path):
    """scripts/torch_compile.py on the CPU at smoke size (real dynamo, eager backend): what the lead runs on the H200."""
    import os
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    store, pack, summary, wlog = tmp_path / "ds", tmp_path / "ds.tar", tmp_path / "summary.jsonl", tmp_path / "workers.log"
    env = {"PYTHONPATH": f"{repo}{os.pathsep}{Path(__file__).parent}", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "MKB_FAKE_COMPILE": json.dumps({"28": "dynamo"})}
    cmd = [sys.executable, str(repo / "scripts" / "torch_compile.py"), "--size", "smoke", "--device", "cpu", "--problem", "28",
           "--mode", "default", "--compiler", FAKE, "--concurrency", "1", "--budget-s", "200", "--store", str(store),
           "--pack", str(pack), "--summary", str(summary), "--worker-log", str(wlog)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with tarfile.open(pack) as tar:
        assert any("kind=torch_compile" in n and n.endswith(".parquet") for n in tar.getnames())
    rows = [json.loads(x) for x in summary.read_text().splitlines()]
    assert [(x["problem"], x["mode"], x["status"]) for x in rows] == [(28, "default", "ok")]
    assert "all selected tasks recorded" in r.stdout
    assert "=== warm-up" in wlog.read_text() and "=== 28_" in wlog.read_text()  # the workers' output, apart from the run's
    r2 = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)  # a second call resumes: nothing left
    assert r2.returncode == 0 and "0 to run, 1 already recorded" in r2.stdout, r2.stdout[-2000:] + r2.stderr[-2000:]


GIB = 1 << 30
# a message of h200-torch-compile call 4 (problem 38), as torch writes it
OOM_38 = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
          "3.41 GiB is free. Process 1911 has 29.01 GiB memory in use. Including non-PyTorch memory, this process has 75.60 GiB "
          "memory in use. Process 1908 has 14.98 GiB memory in use. Of the allocated memory 51.25 GiB is allocated by PyTorch")


def test_an_oom_message_gives_a_lower_bound_on_the_need():
    assert oom_need_bytes(OOM_38) == int(75.60 * GIB) + 30 * GIB  # what this process held, plus the request that failed
    assert oom_need_bytes(OOM_38, peak_bytes=90 * GIB) == 120 * GIB  # the worker's own reserved peak, where larger
    assert oom_need_bytes("Tried to allocate 480.00 MiB. this process has 512 bytes memory in use") == 480 * (1 << 20) + 512
    assert oom_need_bytes("RuntimeError: something else") is None and oom_need_bytes(None) is None


def test_the_expected_peak_prefers_measurements_and_an_oom_raises_it():
    dev = 100 * GIB
    assert estimate_peak(None, "default", dev) == (25 * GIB, "default")  # nothing known: a quarter of the device
    ev = PeakEvidence(eager_peak=2 * GIB)
    assert estimate_peak(ev, "default", dev) == (int(2 * GIB * ANCHOR_FACTOR) + CONTEXT_BYTES, "characterisation")
    ev = PeakEvidence(measured={"default": 10 * GIB}, eager_peak=2 * GIB)
    assert estimate_peak(ev, "default", dev) == (int(10 * GIB * MEASURED_HEADROOM) + CONTEXT_BYTES, "measured")
    assert estimate_peak(ev, "max-autotune-no-cudagraphs", dev) == (int(10 * GIB * OTHER_MODE_HEADROOM) + CONTEXT_BYTES,
                                                                    "measured-other-mode")
    ev = PeakEvidence(oom_need=40 * GIB, eager_peak=2 * GIB)  # the OOM's lower bound beats the factor's guess
    assert estimate_peak(ev, "default", dev) == (int(40 * GIB * MEASURED_HEADROOM), "characterisation+oom")
    ev = PeakEvidence(oom_need=GIB, eager_peak=2 * GIB)  # a lower bound under the estimate changes nothing
    assert estimate_peak(ev, "default", dev)[1] == "characterisation"


def test_admission_sums_expected_peaks_within_the_budget_and_a_too_big_task_runs_alone():
    t = lambda gib: Task("p", 1, "h", "default", 1.0, expected_peak_bytes=gib * GIB)  # noqa: E731
    assert fits(t(200), [], 85 * GIB)  # nothing running: even over the budget (it runs alone)
    assert not fits(t(1), [t(200)], 85 * GIB)  # nothing beside a task over the budget
    assert fits(t(30), [t(50)], 85 * GIB) and not fits(t(40), [t(50)], 85 * GIB)
    assert fits(t(40), [t(50)], None)  # no memory figure (the CPU): the count alone admits


def _characterisation(store, peaks_gib: dict[int, float]) -> None:
    from mkb.events import EventWriter

    with EventWriter(str(store)) as w:
        for n, gib in peaks_gib.items():
            p = get_problem(n)
            w.emit("characterisation", problem=n, problem_name=p.slug, family=p.family, problem_hash=p.hash, size="smoke", gpu="cpu",
                   ok=True, peak_memory_bytes=int(gib * GIB))


@pytest.mark.slow
def test_memory_admission_keeps_big_tasks_apart_fills_around_them_and_a_lone_oom_is_final(tmp_path, monkeypatch):
    """Device 100 GiB, budget 85: 23 expects 97 GiB (alone), 24 and 28 49 GiB each (never together), 25 and 29 3 GiB."""
    store, peaks = tmp_path / "ds", tmp_path / "char"
    _characterisation(peaks, {23: 12.0, 24: 6.0, 25: 0.25, 28: 6.0, 29: 0.25})
    kw = dict(concurrency=4, peak_stores=[str(peaks)], device_memory_bytes=100 * GIB)
    rep = _run(store, ["23", "24", "25", "28", "29"], {"23": "oom", "25": "oom"}, monkeypatch, **kw)
    by = {r["problem"]: r for r in _rows(store)}
    assert sorted(by) == [23, 24, 25, 28, 29] and not rep.unfinished
    span = {name.split("_")[0]: (a, b) for name, a, b in rep.spans}
    over = lambda x, y: min(span[x][1], span[y][1]) - max(span[x][0], span[y][0])  # noqa: E731 - > 0: they overlapped
    assert all(over("23", o) <= 0 for o in ("24", "25", "28", "29"))  # over the budget: alone
    assert over("24", "28") <= 0  # two big ones never together
    assert over("24", "25") > 0 and over("28", "29") > 0  # small ones beside the big ones
    assert by[23]["status"] == "oom_alone" and by[23]["ran_alone"] and by[23]["error_class"] == "torch.OutOfMemoryError"
    assert by[23]["expected_peak_bytes"] == int(12 * GIB * ANCHOR_FACTOR) + CONTEXT_BYTES
    assert by[23]["expected_peak_source"] == "characterisation"
    assert by[25]["status"] == "compile_error" and not by[25]["ran_alone"] and by[25]["error_class"] == "torch.OutOfMemoryError"
    assert {by[n]["status"] for n in (24, 28, 29)} == {"ok"}
    # the next call: the lone OOM is settled, the shared one is tried again, and its OOM raised its estimate
    ctx = Context("cpu", None, by[25]["torch_version"], None)
    done = recorded(str(store), size="smoke", ctx=ctx, backend=by[25]["backend"])
    todo, skipped = plan([get_problem(n) for n in (23, 24, 25, 28, 29)], modes=("default",), caps={"default": 240.0}, done=done)
    assert [t.number for t in todo] == [25] and [t.number for t in skipped] == [23, 24, 28, 29]
    ev = peak_evidence(str(store), [str(peaks)], size="smoke", ctx=ctx, backend=by[25]["backend"])
    # (1 GiB held + 2 GiB asked, from the OOM's message) x the headroom, above the characterisation's 0.25 x 8 + 1 GiB
    assert estimate_peak(ev[get_problem(25).hash], "default", 100 * GIB) == (int(3 * GIB * MEASURED_HEADROOM), "characterisation+oom")


def test_peak_evidence_reads_measured_peaks_oom_needs_and_the_newest_characterisation(tmp_path):
    from mkb.events import EventWriter

    store, char = tmp_path / "ds", tmp_path / "char"
    p, q = get_problem(28), get_problem(29)
    base = dict(problem_name=p.slug, family=p.family, size="full", torch_version="2.11", backend="inductor", compile_cap_s=240.0)
    with EventWriter(str(store)) as w:
        w.emit("torch_compile", problem=28, problem_hash=p.hash, mode="default", gpu="NVIDIA H200", gpu_model="H200", status="ok",
               ok=True, peak_memory_bytes=10 * GIB, **base)
        w.emit("torch_compile", problem=28, problem_hash=p.hash, mode="default", gpu="NVIDIA H200", gpu_model="H200", status="ok",
               ok=True, peak_memory_bytes=50 * GIB, **{**base, "size": "smoke"})  # another size: not this run's
        w.emit("torch_compile", problem=28, problem_hash=p.hash, mode="default", gpu="NVIDIA B200", gpu_model="B200", status="ok",
               ok=True, peak_memory_bytes=70 * GIB, **base)  # another GPU model
        w.emit("torch_compile", problem=28, problem_hash=p.hash, mode="max-autotune-no-cudagraphs", gpu="NVIDIA H200",
               gpu_model="H200", status="runtime_error", ok=False, error_class="torch.OutOfMemoryError", error=OOM_38, **base)
    with EventWriter(str(char)) as w:
        for gib in (3, 2):  # the newer row counts
            w.emit("characterisation", problem=29, problem_name=q.slug, family=q.family, problem_hash=q.hash, size="full",
                   gpu="NVIDIA H200", ok=True, peak_memory_bytes=gib * GIB)
    ctx = Context("NVIDIA H200", "H200", "2.11", None)
    ev = peak_evidence(str(store), [str(char)], size="full", ctx=ctx, backend="inductor")
    assert ev[p.hash] == PeakEvidence(measured={"default": 10 * GIB}, oom_need=int(75.60 * GIB) + 30 * GIB, eager_peak=None)
    assert ev[q.hash] == PeakEvidence(eager_peak=2 * GIB)
    assert estimate_peak(ev[p.hash], "max-autotune-no-cudagraphs", 140 * GIB)[1] == "measured-other-mode+oom"


def test_the_committed_rows_of_schema_1_0_still_give_their_oom_needs():
    """h200-torch-compile calls 1-4 wrote torch_compile 1.0 (no peak column): their OOM messages are the evidence."""
    from pathlib import Path

    ds = Path(__file__).resolve().parents[2] / "events" / "h200-torch-compile"
    ev = peak_evidence(str(ds), [], size="full", ctx=Context("NVIDIA H200", "H200", "2.11.0+cu130", None), backend="inductor")
    assert max(e.oom_need or 0 for e in ev.values()) >= int((75.60 + 30.0) * GIB)  # problem 38, call 4


def test_resume_and_memory_evidence_match_a_row_to_this_machine_the_same_way(tmp_path):
    # a row written before gpu_model existed names only the driver's GPU name: both readers must take it as this H200's
    from mkb.events import EventWriter
    from mkb.problems._torch_compile import Context, peak_evidence, recorded

    store = tmp_path / "ds"
    p = get_problem(28)
    with EventWriter(str(store)) as w:
        for gpu, model, status in (("NVIDIA H200", None, "ok"), ("NVIDIA H100 80GB HBM3", None, "timeout")):
            w.emit("torch_compile", problem=28, problem_name=p.slug, family=p.family, problem_hash=p.hash, size="full",
                   mode="default", backend="inductor", gpu=gpu, gpu_model=model, torch_version="9.9", status=status,
                   ok=status == "ok", compile_cap_s=30.0, peak_memory_bytes=2**30)
    ctx = Context("NVIDIA H200", "H200", "9.9", None)
    done = recorded(str(store), size="full", ctx=ctx, backend="inductor")
    assert done == {(p.hash, "default"): [("ok", None, 30.0, None)]}  # the H100's row is another machine's
    ev = peak_evidence(str(store), [], size="full", ctx=ctx, backend="inductor")
    assert ev[p.hash].measured == {"default": 2**30}
