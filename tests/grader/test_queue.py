"""GradingQueue: order (round-robin across experiments, FIFO within), futures from threads and asyncio,
close() drains, failures as failed futures, exclusive batches with one eager timing, quiet per device."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from fake_dsl import TORCH_BASELINE_28
from mkb.grader import GradeJob, GradingQueue, Verdict, quiet_for
from mkb.grader import _grade
from mkb.grader._pool import Worker, normalize_device, visible_device


class _NullWriter:
    def __init__(self) -> None:
        self.flushes = 0

    def emit(self, *a, **k) -> str:
        return ""

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


class _FakeGrader:
    """Stands in for one grading: records the order and arguments; the first call can be held at a gate."""

    def __init__(self, gate_first: bool = True) -> None:
        self.calls: list[tuple[GradeJob | str, dict]] = []
        self.gate = threading.Event()
        self.started = threading.Event()
        if not gate_first:
            self.gate.set()
        self.lock = threading.Lock()

    def __call__(self, problem, dsl, kernel_path, **kw):
        with self.lock:
            first = not self.calls
            self.calls.append((Path(kernel_path).name, kw))
        if first:
            self.started.set()
            assert self.gate.wait(30)
        if "raise" in str(kernel_path):
            raise ValueError(f"{kernel_path}: cannot read the kernel")
        v = Verdict(evaluation_id=str(kernel_path), problem=problem, dsl=dsl, kernel_sha256="0" * 64, passed=True,
                    reason=None, speedup=1.0, eager_median_us=10.0, candidate_median_us=10.0, gpu="cpu",
                    queue_wait_s=kw.get("queue_wait_s"))
        return v, {"eager": {"median_us": 10.0, "by": Path(kernel_path).name}}


@pytest.fixture
def fake_grader(monkeypatch):
    g = _FakeGrader()
    monkeypatch.setattr(_grade, "grade_with", g)
    return g


def _queue(**kw) -> GradingQueue:
    return GradingQueue(device="cpu", writer=_NullWriter(), dsls=(), **kw)


def _job(name: str, experiment: str = "default", **kw) -> GradeJob:
    return GradeJob(problem=28, dsl="fake", kernel_path=Path(f"/snap/{name}.py"), experiment=experiment, **kw)


def test_round_robin_across_experiments_fifo_within_one(fake_grader):
    q = _queue()
    try:
        first = q.submit(_job("a1", "A"))
        assert fake_grader.started.wait(30)  # a1 is being graded; everything below waits in the queue
        futs = [q.submit(_job(n, e)) for n, e in
                (("a2", "A"), ("a3", "A"), ("a4", "A"), ("b1", "B"), ("b2", "B"), ("c1", "C"))]
        assert q.pending() == 6
        fake_grader.gate.set()
        for f in [first, *futs]:
            assert f.result(30).passed
    finally:
        q.close()
    order = [name.removesuffix(".py") for name, _ in fake_grader.calls]
    # A's backlog does not starve B and C: one turn each, in the order the experiments arrived
    assert order == ["a1", "a2", "b1", "c1", "a3", "b2", "a4"]
    waits = [f.result().queue_wait_s for f in futs]
    assert all(w is not None and w >= 0 for w in waits)
    assert waits[-1] > waits[0] - 1e-3  # c1 waited behind a2 and b1 as well


def test_futures_work_from_threads_and_asyncio(fake_grader):
    fake_grader.gate.set()
    q = _queue()
    results: list[Verdict] = []
    lock = threading.Lock()

    def producer(k: int) -> None:
        fs = [q.submit(_job(f"t{k}_{i}", f"exp{k}")) for i in range(3)]
        with lock:
            results.extend(f.result(30) for f in fs)

    async def main() -> list[Verdict]:
        return list(await asyncio.gather(*(asyncio.wrap_future(q.submit(_job(f"aio{i}", "aio"))) for i in range(3))))

    try:
        threads = [threading.Thread(target=producer, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        aio = asyncio.run(main())
        for t in threads:
            t.join(30)
    finally:
        q.close()
    assert len(results) == 6 and len(aio) == 3
    assert {v.evaluation_id for v in aio} == {f"/snap/aio{i}.py" for i in range(3)}
    # FIFO within each producer's experiment
    for k in range(2):
        names = [n for n, _ in fake_grader.calls if n.startswith(f"t{k}_")]
        assert names == [f"t{k}_{i}.py" for i in range(3)]


def test_close_drains_everything_submitted_and_refuses_more(fake_grader):
    q = _queue()
    futs = [q.submit(_job(f"j{i}", f"e{i % 2}")) for i in range(5)]
    assert fake_grader.started.wait(30)
    closer = threading.Thread(target=q.close)
    closer.start()
    time.sleep(0.2)
    with pytest.raises(RuntimeError, match="closed"):
        q.submit(_job("late"))
    assert not any(f.done() for f in futs[1:])
    fake_grader.gate.set()
    closer.join(30)
    assert not closer.is_alive()
    assert all(f.done() and f.result().passed for f in futs)
    assert q.writer.flushes >= 1


def test_a_grading_that_raises_fails_its_future_and_the_queue_goes_on(fake_grader):
    fake_grader.gate.set()
    q = _queue()
    try:
        bad = q.submit(_job("raise_me"))
        good = q.submit(_job("fine"))
        with pytest.raises(ValueError, match="cannot read"):
            bad.result(30)
        assert good.result(30).passed
    finally:
        q.close()


def test_cancelled_job_is_skipped(fake_grader):
    q = _queue()
    try:
        q.submit(_job("a"))
        assert fake_grader.started.wait(30)
        skipped = q.submit(_job("b"))
        after = q.submit(_job("c"))
        assert skipped.cancel()
        fake_grader.gate.set()
        assert after.result(30).passed
    finally:
        q.close()
    assert [n for n, _ in fake_grader.calls] == ["a.py", "c.py"]


def test_bad_jobs_are_refused_at_submit():
    q = GradingQueue(device="cpu", writer=_NullWriter(), dsls=())
    try:
        with pytest.raises(TypeError):
            q.submit({"problem": 28})
        with pytest.raises(ValueError, match="scope"):
            q.submit(_job("x", scope="final"))
        with pytest.raises(ValueError, match="one problem"):
            q.submit_batch([_job("x"), GradeJob(problem=29, dsl="fake", kernel_path=Path("/snap/y.py"))])
        assert q.submit_batch([]) == []
    finally:
        q.close()


def test_batch_is_exclusive_and_graded_against_one_eager_timing(fake_grader):
    q = _queue()
    try:
        first = q.submit(_job("other0", "Y"))
        assert fake_grader.started.wait(30)
        others = [q.submit(_job(f"other{i}", "Y")) for i in (1, 2)]
        batch = q.submit_batch([_job(f"arm{i}", "X", scope="pair") for i in range(3)])
        more = q.submit(_job("other3", "Z"))
        fake_grader.gate.set()
        vs = [f.result(30) for f in batch]
        for f in [first, *others, more]:
            f.result(30)
    finally:
        q.close()
    names = [n.removesuffix(".py") for n, _ in fake_grader.calls]
    i = names.index("arm0")
    assert names[i:i + 3] == ["arm0", "arm1", "arm2"]  # nothing in between
    kws = [kw for n, kw in fake_grader.calls if n.startswith("arm")]
    assert kws[0]["fresh_eager"] is True and kws[0]["pinned"] is None
    assert all(kw["fresh_eager"] is False and kw["pinned"] == {"eager": {"median_us": 10.0, "by": "arm0.py"}} for kw in kws[1:])
    assert len({kw["pair_id"] for kw in kws}) == 1 and kws[0]["pair_id"]
    assert all(kw["pair_id"] is None for n, kw in fake_grader.calls if n.startswith("other"))
    assert all(v.passed for v in vs)


# ---------------- devices ----------------

def test_device_names_and_visible_gpu(monkeypatch):
    assert normalize_device("cuda") == "cuda:0" == normalize_device("cuda:0")
    assert normalize_device("cpu") == "cpu" and normalize_device("cpu:1") == "cpu:1"
    with pytest.raises(ValueError, match="hint"):
        normalize_device("gpu:0")
    assert visible_device("cuda:1", {}) == "1"
    assert visible_device("cuda:1", {"CUDA_VISIBLE_DEVICES": "4,6"}) == "6"
    with pytest.raises(ValueError, match="not visible"):
        visible_device("cuda:2", {"CUDA_VISIBLE_DEVICES": "4,6"})
    assert quiet_for("cuda") is quiet_for("cuda:0") and quiet_for("cuda:0") is not quiet_for("cuda:1")


def test_a_timing_on_one_device_does_not_hold_warm_ups_of_another(fake_dsl):
    """One process drives several devices: a hold on cpu:0 keeps cpu:0's spare waiting, not cpu:1's."""
    token = object()
    quiet_for("cpu:0").hold(token, "timing")
    same = other = None
    try:
        same, other = Worker(fake_dsl, device="cpu:0"), Worker(fake_dsl, device="cpu:1")
        assert other.wait_ready(120), other.ready_error  # its device is quiet
        deadline = time.monotonic() + 60
        while same.imported_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert same.imported_at is not None, same.log_text()
        assert same.go_at is None and same.pid in quiet_for("cpu:0").busy()["waiting"]
        quiet_for("cpu:0").release(token)
        assert same.wait_ready(60), same.ready_error
        assert same.ready["gpu_warm_started"] > other.ready["gpu_warm_started"]
    finally:
        quiet_for("cpu:0").release(token)
        for w in (same, other):
            if w is not None:
                w.kill()
                w.cleanup()


# ---------------- real gradings (fake DSL on the CPU) ----------------

def test_queue_grades_real_kernels_and_records_queue_wait(tmp_path, fake_dsl, cpu_config, store):
    import polars as pl

    from mkb.events import read

    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    zero = tmp_path / "zero.py"
    zero.write_text("import torch\n\n\ndef solve(x, residual, weight):\n    return torch.zeros_like(x)\n")
    with GradingQueue(device="cpu", store=store, config=cpu_config, dsls=(fake_dsl,)) as q:
        pair = q.submit_batch([GradeJob(28, fake_dsl, good, experiment="e1", scope="pair"),
                               GradeJob(28, fake_dsl, good, experiment="e1", scope="pair")])
        single = q.submit(GradeJob(28, fake_dsl, zero, experiment="e2", attempt_id="att-1"))
        missing = q.submit(GradeJob(28, fake_dsl, tmp_path / "nope.py", experiment="e2"))
    v1, v2 = (f.result() for f in pair)
    assert v1.passed and v2.passed, (v1.message, v2.message)
    t1, t2 = v1.stage("timing").figures, v2.stage("timing").figures
    assert t1["eager_cached"] is False and t2["eager_cached"] is True and t1["eager_median_us"] == t2["eager_median_us"]
    vz = single.result()
    assert not vz.passed and vz.reason == "all_zero"
    assert vz.queue_wait_s is not None and vz.queue_wait_s > 0  # it waited for the batch
    with pytest.raises(ValueError, match="nope.py"):
        missing.result()
    rows = read("verdict", store)
    assert rows.height == 3
    assert rows["queue_wait_s"].null_count() == 0
    pairs = rows.filter(pl.col("scope") == "pair")
    assert pairs.height == 2 and pairs["pair_id"].n_unique() == 1 and pairs["pair_id"][0]
    assert rows.filter(pl.col("attempt_id") == "att-1")["reason"].to_list() == ["all_zero"]


def test_pool_refills_in_batches_below_its_low_water_mark(monkeypatch):
    """Spares are spawned together (their GPU warm-ups then share one quiet gap), not one per take."""
    from mkb.grader import _pool

    spawned: list[str] = []

    class _W:
        def __init__(self, dsl, **kw):
            spawned.append(dsl)
            self.pid = len(spawned)

        def alive(self):
            return True

        def kill(self, **kw):
            pass

        def cleanup(self):
            pass

    monkeypatch.setattr(_pool, "Worker", _W)
    pool = _pool.WorkerPool(("x",), device="cpu", depth=4, low_water=1)
    assert len(spawned) == 4
    pool.take("x")
    pool.take("x")
    assert len(spawned) == 4  # 2 left: above the mark
    pool.take("x")
    assert len(spawned) == 7  # 1 left: three spawned together
    with pytest.raises(ValueError):
        _pool.WorkerPool(("x",), device="cpu", depth=2, low_water=2, prestart=False)
    one = _pool.WorkerPool(("x",), device="cpu", depth=1, prestart=False)
    n = len(spawned)
    one.take("x")
    assert len(spawned) == n + 2  # default: a cold worker for the take, and its successor at once


def test_one_open_queue_per_device_and_a_closed_one_frees_it(fake_grader):
    """Two queues of one GPU would grade one job each at a time, one's candidate beside the other's timing loop."""
    first = GradingQueue(device="cpu:3", writer=_NullWriter(), dsls=())
    try:
        with pytest.raises(ValueError, match=r"cpu:3 is already open.*\nhint: one queue per GPU"):
            GradingQueue(device="cpu:3", writer=_NullWriter(), dsls=())
        other = GradingQueue(device="cpu:4", writer=_NullWriter(), dsls=())  # another device is another coordinator
        other.close()
    finally:
        first.close()
    again = GradingQueue(device="cpu:3", writer=_NullWriter(), dsls=())  # closed: the device is free again
    again.close()
    third = GradingQueue(device="cpu:3", writer=_NullWriter(), dsls=())
    try:
        again.close()  # a queue closed twice frees nothing of the queue now open on its device
        with pytest.raises(ValueError, match="cpu:3 is already open"):
            GradingQueue(device="cpu:3", writer=_NullWriter(), dsls=())
    finally:
        third.close()
    a, b = GradingQueue(device="cpu", writer=_NullWriter(), dsls=()), GradingQueue(device="cpu", writer=_NullWriter(), dsls=())
    a.close()
    b.close()  # a bare "cpu" times nothing: smoke runs and tests may open several


def test_a_queue_that_fails_to_start_frees_its_device(monkeypatch, fake_grader):
    import mkb.grader._queue as Q

    def broken(self, **kw):
        raise RuntimeError("pool could not start")

    monkeypatch.setattr(Q.GradingQueue, "_start", broken)
    with pytest.raises(RuntimeError, match="pool could not start"):
        GradingQueue(device="cpu:5", writer=_NullWriter(), dsls=())
    monkeypatch.undo()
    GradingQueue(device="cpu:5", writer=_NullWriter(), dsls=()).close()


def test_the_experiment_grader_closes_what_it_opened_when_two_names_are_one_gpu(monkeypatch):
    from mkb.experiment._graders import LocalGpuGrader

    with pytest.raises(ValueError, match="cpu:6 is already open"):
        LocalGpuGrader(writer=_NullWriter(), devices=["cpu:6", "cpu:6"])
    GradingQueue(device="cpu:6", writer=_NullWriter(), dsls=()).close()  # the first one was closed, not leaked
