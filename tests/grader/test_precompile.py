"""Device code made ahead (grader 2.17, mkb.grader._precompile): a queued TIRx kernel's nvcc builds are made outside
the GPU by a confined sandbox and a trusted builder, and a worker's own compiler call reads them only under its key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mkb.grader import GradeJob, GradingQueue, Verdict
from mkb.grader import _grade
from mkb.grader._fs_guard import landlock_abi
from mkb.grader._harness import _device_code_figures
from mkb.grader._precompile import OFF, DeviceCode, Precompiler
from mkb.problems import baselines

pytestmark = [pytest.mark.dsl]

needs_landlock = pytest.mark.skipif(landlock_abi() < 6, reason="the sandbox refuses to run without Landlock ABI >= 6")
ROOT = Path(__file__).resolve().parents[2]
TIRX_28 = next(b for b in baselines([28], dsls=["tirx"]))


def _job(path: Path, problem: int = 28, dsl: str = "tirx") -> GradeJob:
    return GradeJob(problem=problem, dsl=dsl, kernel_path=path)


def _wait(pc: Precompiler, job: GradeJob, limit_s: float = 120.0) -> None:
    task = pc._tasks[pc._key(job)][-1]
    deadline = time.monotonic() + limit_s
    while not (task.future and task.future.done()):
        assert time.monotonic() < deadline, "the precompile never finished"
        time.sleep(0.05)


def _lookup(folder: Path, sources: list[str], *, arch: str = "sm_90a", env: dict | None = None) -> dict:
    """A worker's side, in a process of the DSL's environment: the wrapped compiler called as TVM's build calls it."""
    from mkb.dsl import get_backend

    code = (
        "import json, sys\n"
        "import tvm\n"
        "from mkb.dsl import get_backend\n"
        "from tvm.support import nvcc\n"
        "made = []\n"
        "nvcc_real = nvcc.compile_cuda\n"
        "stats = get_backend('tirx').use_device_code(__import__('pathlib').Path(sys.argv[1]))\n"
        "nvcc.compile_cuda.__wrapped__  # the wrapper is installed\n"
        "import tvm.support.nvcc as m\n"
        "m._compile_cuda_nvcc = lambda *a, **k: made.append(1) or bytearray(b'built here')\n"
        f"with tvm.target.Target({{'kind': 'cuda', 'arch': {arch!r}}}):\n"
        "    outs = [bytes(nvcc.compile_cuda(c, target_format='fatbin', compiler='nvcc')) for c in json.load(open(sys.argv[2]))]\n"
        "print('LOOKUP ' + json.dumps({'stats': stats, 'built_here': len(made), 'sizes': [len(o) for o in outs]}))\n"
    )
    src = folder.parent / "lookup_sources.json"
    src.write_text(json.dumps(sources))
    full = {**os.environ, **get_backend("tirx").environment("sm_90a"), **(env or {}),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run([sys.executable, "-c", code, str(folder), str(src)], env=full, capture_output=True, text=True,
                         timeout=120)
    line = next((x for x in reversed(out.stdout.splitlines()) if x.startswith("LOOKUP ")), None)
    assert line is not None, out.stderr[-3000:]
    return json.loads(line[len("LOOKUP "):])


@needs_landlock
def test_a_queued_tirx_kernel_is_built_ahead_and_only_a_call_with_its_key_reads_the_build(tmp_path) -> None:
    pytest.importorskip("tvm")
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path)
    try:
        job = _job(TIRX_28.path)
        assert pc.request(job) and pc.request(job)  # queued twice: made for each grading
        _wait(pc, job)
        twice = pc.take(job)
        assert twice.state == "ready" and twice.folder != pc._tasks[pc._key(job)][0].folder / "out"
        pc.release(twice)
        code = pc.take(job)
        assert code.state == "ready", code
        assert pc.take(job) == OFF  # taken as often as asked
        assert code.sources == 1 and code.builds == 2 and code.seconds > 0  # sm_90a, and sm_90 for a call without a target
        assert code.seconds >= code.waited_s + code.sandbox_s + code.build_s - 0.01 and code.sandbox_s > 0
        # a fork of the server, which has one thread: the confinement reaches every thread the candidate will have
        assert "0 threads started before not confined" in code.sandbox, code.sandbox
        builds = list(code.folder.glob("*.bin"))
        assert len(builds) == 2 and all(b.stat().st_size > 1000 for b in builds)  # real fatbins from nvcc
        assert "device nodes and ioctls refused; no capabilities" in code.sandbox and "the sandbox's" in code.sandbox
        assert not (code.folder.parent / "sandbox").exists()  # nothing of the sandbox's is kept
        # the source the sandbox recorded, as the worker's TVM passes it: read back, nvcc not run
        sources = _sources_of(TIRX_28.path, tmp_path)
        hit = _lookup(code.folder, sources)
        assert hit["stats"]["hits"] == 1 and hit["stats"]["misses"] == 0 and hit["built_here"] == 0
        assert hit["sizes"][0] in {b.stat().st_size for b in builds}
        plain = _lookup(code.folder, sources, arch="sm_90")
        assert plain["stats"]["hits"] == 1 and plain["built_here"] == 0
        # another arch, or another policy, is another key: compiled in the worker
        miss = _lookup(code.folder, sources, arch="sm_80")
        assert miss["stats"] == {**miss["stats"], "hits": 0, "misses": 1} and miss["built_here"] == 1
        fast = _lookup(code.folder, sources, env={"TVM_CUDA_NVCC_NO_FAST_MATH": ""})
        assert fast["stats"]["hits"] == 0 and fast["built_here"] == 1
        pc.release(code)
        assert not code.folder.parent.exists()
    finally:
        pc.close()
    assert not pc.root.exists()


def _run_sandbox(kernel: Path, folder: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """The sandbox process as the precompiler starts it, on problem 28 at smoke size."""
    from mkb.dsl import get_backend

    env = {**os.environ, **get_backend("tirx").environment("sm_90a"), "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(folder),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
           **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "mkb.grader._precompile_child", "sources", "tirx", str(kernel), "28",
                           "smoke", str(folder)], env=env, capture_output=True, text=True, timeout=120)


def _sources_of(kernel: Path, tmp: Path) -> list[str]:
    folder = tmp / "record"
    folder.mkdir()
    out = _run_sandbox(kernel, folder)
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("MKB_PRECOMPILE "), out.stderr[-2000:]
    return json.loads(line[len("MKB_PRECOMPILE "):])["sources"]


@needs_landlock
def test_the_sandbox_writes_nowhere_but_its_own_folder(tmp_path) -> None:
    """A kernel's code runs there beside another grading's timing: it may not write the builds, the store or /dev."""
    pytest.importorskip("tvm")
    outside = tmp_path / "builds"
    outside.mkdir()
    shm = Path("/dev/shm") / f"mkb-precompile-test-{os.getpid()}"
    kernel = tmp_path / "kernel.py"
    kernel.write_text(TIRX_28.path.read_text() + (
        "\n\nimport os as _os\n"
        "for _p in (%r, %r):\n"
        "    try:\n"
        "        _fd = _os.open(_p, _os.O_WRONLY | _os.O_CREAT, 0o644)\n"
        "        _os.write(_fd, b'forged')\n"
        "        _os.close(_fd)\n"
        "        print('WROTE', _p)\n"
        "    except OSError as _e:\n"
        "        print('REFUSED', _p, _e.errno)\n"
        "import fcntl as _fcntl, termios as _termios, stat as _stat, tempfile as _tf\n"
        "with open('/dev/null', 'rb') as _f:\n"
        "    try:\n"
        "        _fcntl.ioctl(_f, _termios.TIOCGWINSZ, b'\\0' * 8)\n"
        "    except OSError as _e:\n"
        "        print('IOCTL', _e.errno)\n"
        "for _name, _call in (('MKNOD', lambda: _os.mknod(_os.path.join(_tf.gettempdir(), 'n'), 0o600 | _stat.S_IFCHR, _os.makedev(1, 3))),\n"
        "                     ('NICE', lambda: _os.nice(-5)),\n"
        "                     ('SCHED', lambda: _os.sched_setscheduler(0, _os.SCHED_FIFO, _os.sched_param(1))),\n"
        "                     ('CHMOD', lambda: _os.chmod(%r, 0)),\n"
        "                     ('UTIME', lambda: _os.utime(%r, (0, 0)))):\n"
        "    try:\n"
        "        _call()\n"
        "        print(_name, 'DONE')\n"
        "    except OSError as _e:\n"
        "        print(_name, 'REFUSED', _e.errno)\n") % (str(outside / "forged.bin"), str(shm), str(outside), str(outside)))
    folder = tmp_path / "sandbox"
    folder.mkdir()
    out = _run_sandbox(kernel, folder)
    try:
        assert f"REFUSED {outside / 'forged.bin'}" in out.stdout and f"REFUSED {shm}" in out.stdout, out.stdout
        assert "WROTE" not in out.stdout and " DONE" not in out.stdout, out.stdout + out.stderr[-2000:]
        assert not (outside / "forged.bin").exists() and not shm.exists()
        assert out.stdout.strip().splitlines()[-1].startswith("MKB_PRECOMPILE {\"sources\"")  # and it still recorded
        # no ioctl on a device file (every GPU driver call is one): EACCES, not /dev/null's ENOTTY
        assert "IOCTL 13" in out.stdout, out.stdout
        # no device node of its own, no priority or real-time scheduling, no metadata change outside (the sandbox's
        # seccomp calls, and no capabilities even where the grader runs as root)
        for name in ("MKNOD", "NICE", "SCHED", "CHMOD", "UTIME"):
            assert f"{name} REFUSED" in out.stdout, (name, out.stdout)
        assert outside.stat().st_mode & 0o777 != 0
    finally:
        shm.unlink(missing_ok=True)


@needs_landlock
@pytest.mark.parametrize("read_guard", ["landlock", "off"])
def test_with_reads_confined_the_sandbox_reads_no_user_file_and_still_records(tmp_path, read_guard) -> None:
    """GraderConfig.read_guard reaches the precompile's forks (READ_GUARD_ENV): the candidate's code runs there too,
    and what it prints reaches the device-code note; with it off the read lands, as before."""
    pytest.importorskip("tvm")
    from mkb.grader._fs_guard import READ_GUARD_ENV

    secret = tmp_path / "home" / ".netrc"
    secret.parent.mkdir()
    secret.write_text("machine example.org password not-for-kernels")
    kernel = tmp_path / "kernel.py"
    kernel.write_text(TIRX_28.path.read_text() + (
        "\n\ntry:\n    print('READ', open(%r).read())\nexcept PermissionError:\n    print('READ REFUSED')\n") % str(secret))
    folder = tmp_path / "sandbox"
    folder.mkdir()
    out = _run_sandbox(kernel, folder, {READ_GUARD_ENV: read_guard})
    assert out.stdout.strip().splitlines()[-1].startswith("MKB_PRECOMPILE {\"sources\""), out.stdout + out.stderr[-2000:]
    if read_guard == "landlock":
        assert "READ REFUSED" in out.stdout and "not-for-kernels" not in out.stdout
    else:
        assert "not-for-kernels" in out.stdout


@needs_landlock
def test_a_precompiler_with_reads_confined_still_makes_a_baseline_s_builds(tmp_path) -> None:
    """The whole path under read_guard="landlock": the fork server's sandbox records, its builder runs nvcc, and the
    guards the sandbox reported say its reads were confined."""
    pytest.importorskip("tvm")
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path, read_guard="landlock")
    try:
        job = _job(TIRX_28.path, problem=28)
        assert pc.request(job)
        _wait(pc, job)
        code = pc.take(job)
        assert code.state == "ready" and code.builds >= 1, code
        assert "reads only beneath" in code.sandbox, code.sandbox
    finally:
        pc.close()


@needs_landlock
def test_a_kernel_that_is_not_done_when_its_grading_starts_is_stopped_and_left_to_the_worker(tmp_path) -> None:
    kernel = tmp_path / "kernel.py"
    kernel.write_text(TIRX_28.path.read_text() + "\n\nimport time as _t\n_t.sleep(600)\n")
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path)
    try:
        job = _job(kernel)
        assert pc.request(job)
        task = pc._tasks[pc._key(job)][0]
        deadline = time.monotonic() + 120
        while task.child is None or task.child.pid is None:  # the sandbox has been forked and confined itself
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child = task.child
        time.sleep(1.0)  # into the candidate's sleep
        code = pc.take(job)
        assert code.state == "late" and code.folder is None and code.note == "stopped in the sandbox"
        assert child.done.wait(10) and child.rc == -9  # killed, with its session; its server reaped it
        assert not Path(f"/proc/{child.pid}").exists()
        task.future.result(timeout=30)
        deadline = time.monotonic() + 10
        while task.folder.exists():
            assert time.monotonic() < deadline, "the stopped task's folder was kept"
            time.sleep(0.02)
        assert pc.take(job) == OFF  # taken once
    finally:
        pc.close()


def test_only_a_dsl_whose_compile_needs_no_gpu_is_asked_and_a_broken_kernel_fails_without_a_process(tmp_path) -> None:
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path)
    try:
        cute = next(b for b in baselines([28], dsls=["cute"]))
        assert not pc.request(_job(cute.path, dsl="cute"))
        assert pc.take(_job(cute.path, dsl="cute")) == OFF
        bad = tmp_path / "bad.py"
        bad.write_text("import subprocess\nsubprocess.run(['true'])\n")  # a static rule refuses it
        job = _job(bad)
        assert pc.request(job)
        _wait(pc, job)
        code = pc.take(job)
        assert code.state == "failed" and "static rule" in code.note and code.folder is None
    finally:
        pc.close()


def test_the_compile_figures_record_what_was_made_and_what_the_compile_read() -> None:
    counts = {"builds": 2, "hits": 0, "misses": 0, "uncacheable": 0}
    rec = {"state": "ready", "seconds": 3.2, "sources": 2, "builds": 2, "note": "", "counts": counts}
    counts["hits"] = 2  # the worker's calls count after the figures' record was made
    assert _device_code_figures(rec) == {"state": "ready", "seconds": 3.2, "sources": 2, "builds": 2, "note": "",
                                         "hits": 2, "misses": 0, "uncacheable": 0}
    assert _device_code_figures({"state": "late", "seconds": 0.4}) == {"state": "late", "seconds": 0.4}
    assert _device_code_figures(None) is None
    assert DeviceCode("ready", folder=Path("/x/out"), builds=1, sandbox_s=0.5).as_dict() == {
        "state": "ready", "seconds": None, "sources": 0, "builds": 1, "note": "", "sandbox": "", "waited_s": None,
        "sandbox_s": 0.5, "build_s": None}


class _NullWriter:
    def emit(self, *a, **k) -> str:
        return ""

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_queue_asks_for_each_queued_job_and_hands_each_grading_what_was_made(monkeypatch, tmp_path) -> None:
    asked, taken, released, paused = [], [], [], []

    class _FakePrecompiler:
        def __init__(self, **kw) -> None:
            self.kw = kw

        def request(self, job):
            asked.append(job.kernel_path.name)
            return True

        def take(self, job):
            taken.append(job.kernel_path.name)
            return DeviceCode("ready", folder=tmp_path / job.kernel_path.stem / "out", builds=1)

        def release(self, code):
            released.append(code.folder.parent.name)

        def prestart(self, dsls):
            asked.append("prestart")

        def pause(self, held):
            paused.append(held)

        def close(self):
            asked.append("closed")

    got: list[dict] = []
    gate = threading.Event()

    def fake_grade_with(problem, dsl, kernel_path, **kw):
        got.append({"name": Path(kernel_path).name, "code": kw.get("device_code")})
        gate.wait(10)
        return Verdict(evaluation_id=str(kernel_path), problem=problem, dsl=dsl, kernel_sha256="0" * 64, passed=True,
                       reason=None, speedup=1.0, eager_median_us=1.0, candidate_median_us=1.0, gpu="cpu"), {}

    import mkb.grader._queue as q

    monkeypatch.setattr(q, "Precompiler", _FakePrecompiler)
    monkeypatch.setattr(q, "landlock_abi", lambda: 7, raising=False)
    monkeypatch.setattr("mkb.grader._fs_guard.landlock_abi", lambda: 7)
    monkeypatch.setattr(_grade, "grade_with", fake_grade_with)
    with GradingQueue(device="cpu", writer=_NullWriter(), dsls=(), precompile_arch="sm_90a") as queue:
        assert isinstance(queue.precompiler, _FakePrecompiler) and queue.precompiler.kw["gpu_arch"] == "sm_90a"
        futs = [queue.submit(_job(Path(f"/snap/k{i}.py"))) for i in range(3)]
        gate.set()
        for f in futs:
            f.result(timeout=30)
    # its servers started with the queue, every job asked for when queued, closed with the queue
    assert asked == ["prestart", "k0.py", "k1.py", "k2.py", "closed"]
    assert paused == [False]  # it listens to the device's coordinator (told the state at once; nothing timed here)
    from mkb.grader._pool import quiet_for

    assert not quiet_for("cpu")._listeners  # and stops listening when closed
    assert taken == ["k0.py", "k1.py", "k2.py"] and released == ["k0", "k1", "k2"]
    assert [g["code"].state for g in got] == ["ready"] * 3
    # a CPU queue not asked, and a config that turns it off, make nothing ahead
    with GradingQueue(device="cpu", writer=_NullWriter(), dsls=()) as queue:
        assert queue.precompiler is None
    from mkb.grader import GraderConfig

    with GradingQueue(device="cpu", writer=_NullWriter(), dsls=(), precompile_arch="sm_90a",
                      config=GraderConfig(device="cpu", precompile="off")) as queue:
        assert queue.precompiler is None


def test_the_bench_tables_what_each_dsl_got_made_ahead_and_the_compile_with_and_without_it() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import grader_bench as gb

    rows = [{"dsl": "tirx", "compile_s": 0.3, "device_code": {"state": "ready", "hits": 1, "misses": 0, "uncacheable": 0}},
            {"dsl": "tirx", "compile_s": 1.1, "device_code": {"state": "late", "seconds": 2.0}},
            {"dsl": "tirx", "compile_s": 0.5, "device_code": {"state": "ready", "hits": 2, "misses": 1, "uncacheable": 0}},
            {"dsl": "cute", "compile_s": 0.9, "device_code": None}]
    t = gb.device_code_table(rows)
    assert t["tirx"]["states"] == {"ready": 2, "late": 1} and (t["tirx"]["hits"], t["tirx"]["misses"]) == (3, 1)
    assert t["tirx"]["n_read"] == 2 and t["tirx"]["compile_s_mean_read"] == pytest.approx(0.4)
    assert t["tirx"]["n_not_read"] == 1 and t["tirx"]["compile_s_mean_not_read"] == pytest.approx(1.1)
    assert t["cute"] == {"states": {"none": 1}, "hits": 0, "misses": 0, "uncacheable": 0, "n_read": 0,
                         "compile_s_mean_read": None, "n_not_read": 1, "compile_s_mean_not_read": 0.9}
    line = "\n".join(gb._throughput_lines({"problems": [28], "gradings_per_gpu_hour": 1.0, "gradings": 4, "elapsed_s": 1.0,
                                            "cancelled": 0, "all_passed": True, "overhead_s_median": 0.1,
                                            "wall_s_median": 1.0, "worker_wait_s_median": 0.0, "device_code": t,
                                            "precompiler": {"servers": {"tirx": {"seconds": 8.3}}, "pauses": 21,
                                                            "paused_s": 17.04}}))
    assert "device code made ahead, tirx: states {'ready': 2, 'late': 1}; worker reads: 3 hits" in line
    assert "precompiler: stopped for 21 timing phases, 17.0 s in all; servers tirx ready in 8.3 s" in line


@needs_landlock
def test_a_kernel_cannot_forge_the_sandbox_s_guards_and_a_broken_path_never_raises(tmp_path) -> None:
    pytest.importorskip("tvm")
    kernel = tmp_path / "kernel.py"
    kernel.write_text(TIRX_28.path.read_text() + (
        "\n\nimport json as _json\n"
        "print('MKB_PRECOMPILE ' + _json.dumps({'sources': [], 'guards': 'forged: nothing refused'}))\n"))
    loop = tmp_path / "loop.py"
    loop.symlink_to(loop)  # resolves to nothing
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path)
    try:
        job = _job(kernel)
        assert pc.request(job)
        _wait(pc, job)
        code = pc.take(job)
        assert code.state == "ready", code
        assert "forged" not in code.sandbox and "no capabilities" in code.sandbox
        pc.release(code)
        bad = _job(loop)
        pc.request(bad)
        assert pc.take(bad).state in ("off", "failed", "late")  # never an exception: a precompile never fails a grading
    finally:
        pc.close()


def test_a_source_whose_build_depends_on_where_or_when_it_runs_is_left_to_the_worker(tmp_path) -> None:
    nvcc = pytest.importorskip("tvm.support.nvcc")
    from mkb.dsl import get_backend
    from mkb.dsl.tirx import _PLACE_BOUND

    plain = "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }\n"
    for bound in ('#include "../sources.json"\n', "#include </etc/hostname>\n", "#if __has_include(<x>)\n#endif\n",
                  "const char* t = __TIME__;\n", "const char* f = __FILE__;\n"):
        assert _PLACE_BOUND.search(bound + plain), bound
    assert not _PLACE_BOUND.search("#include <cuda_bf16.h>\n#include <cuda/std/cstdint>\n" + plain)
    built: list[str] = []
    import unittest.mock as um

    with um.patch.object(nvcc, "compile_cuda", lambda code, **kw: built.append(code) or bytearray(b"x")):
        keys = get_backend("tirx").build_device_code(['const char* t = __TIME__;\n' + plain], tmp_path, gpu_arch="sm_90a")
    assert keys == [] and built == [] and not list(tmp_path.glob("*.bin"))


@needs_landlock
def test_one_fork_server_per_dsl_imports_once_and_a_dead_one_is_started_again(tmp_path) -> None:
    pytest.importorskip("tvm")
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path, slots=2)
    try:
        jobs = [_job(b.path, problem=b.problem) for b in baselines([23, 28], dsls=["tirx"])]
        for job in jobs:
            assert pc.request(job)
        for job in jobs:
            _wait(pc, job)
            code = pc.take(job)
            assert code.state == "ready", code
            pc.release(code)
        first = pc.servers()["tirx"]
        assert first["ready"] and first["seconds"] > 0 and list(pc.servers()) == ["tirx"]  # one server, two jobs
        os.kill(first["pid"], 9)  # the server dies between jobs
        deadline = time.monotonic() + 10
        while pc._servers["tirx"].alive:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        job = jobs[0]
        assert pc.request(job)
        _wait(pc, job)
        code = pc.take(job)
        assert code.state == "ready", code
        assert pc.servers()["tirx"]["pid"] != first["pid"]  # started again
        pc.release(code)
    finally:
        pc.close()


def test_a_fork_server_that_cannot_start_fails_its_jobs_with_why_and_is_not_started_again(tmp_path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ImportError: no tvm here' >&2\nexit 1\n")
    fake.chmod(0o755)
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path, python=str(fake), slots=1)
    try:
        a, b = (_job(x.path, problem=x.problem) for x in baselines([23, 28], dsls=["tirx"]))
        for job in (a, b):
            assert pc.request(job)
            _wait(pc, job)
            code = pc.take(job)
            assert code.state == "failed" and "the fork server of tirx ended (exit 1)" in code.note, code
            assert "no tvm here" in code.note
        assert len([p for p in tmp_path.glob("mkb-precompile-*/server-tirx.err")]) == 1  # started once
    finally:
        pc.close()


def test_a_free_slot_starts_the_waiting_job_the_queue_grades_first(monkeypatch, tmp_path) -> None:
    made: list[str] = []
    gate = threading.Event()

    def fake_make(self, task):
        made.append(Path(task.job.kernel_path).stem)
        gate.wait(10)
        return DeviceCode("failed", note="fake")

    monkeypatch.setattr(Precompiler, "_make", fake_make)
    jobs = {n: _job(tmp_path / f"{n}.py") for n in ("k0", "k1", "k2", "k3", "k4")}
    for j in jobs.values():
        j.kernel_path.write_text("")
    order = [jobs["k0"], jobs["k3"], jobs["k1"]]  # the queue grades k3 before k1; k2 and k4 it does not list
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path, slots=1, order=lambda: list(order))
    try:
        assert pc.request(jobs["k0"])
        deadline = time.monotonic() + 10
        while made != ["k0"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for n in ("k1", "k2", "k3", "k4"):
            assert pc.request(jobs[n])
        gate.set()
        for n in jobs:
            _wait(pc, jobs[n])
        assert made == ["k0", "k3", "k1", "k2", "k4"]  # those listed in the queue's order, then the others as asked
    finally:
        gate.set()
        pc.close()


def test_the_queue_lists_its_jobs_in_the_order_it_grades_them(monkeypatch) -> None:
    graded: list[str] = []
    gate = threading.Event()

    def fake_grade_with(problem, dsl, kernel_path, **kw):
        graded.append(Path(kernel_path).stem)
        gate.wait(10)
        return Verdict(evaluation_id=str(kernel_path), problem=problem, dsl=dsl, kernel_sha256="0" * 64, passed=True,
                       reason=None, speedup=1.0, eager_median_us=1.0, candidate_median_us=1.0, gpu="cpu"), {}

    monkeypatch.setattr(_grade, "grade_with", fake_grade_with)
    with GradingQueue(device="cpu", writer=_NullWriter(), dsls=()) as queue:
        first = queue.submit(GradeJob(problem=28, dsl="tirx", kernel_path=Path("/s/a0.py"), experiment="a"))
        deadline = time.monotonic() + 10
        while graded != ["a0"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        futs = [queue.submit(GradeJob(problem=28, dsl="tirx", kernel_path=Path(f"/s/{n}.py"), experiment=n[0]))
                for n in ("a1", "a2", "a3", "b1", "c1", "b2")]
        listed = [Path(j.kernel_path).stem for j in queue._upcoming()]
        gate.set()
        for f in [first, *futs]:
            f.result(timeout=30)
    assert listed == graded[1:], (listed, graded)
    assert listed[:3] == ["a1", "b1", "c1"]  # round-robin over experiments


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _settles(pid: int, states: str, limit_s: float = 5.0) -> bool:
    """Whether `pid` reaches one of `states` (a signal is delivered after kill() returns, not by then)."""
    deadline = time.monotonic() + limit_s
    while _state(pid) not in states:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@needs_landlock
def test_the_forks_stop_while_the_device_times_a_grading_and_a_late_one_is_still_killed(tmp_path) -> None:
    from mkb.grader._pool import GpuQuiet

    kernel = tmp_path / "kernel.py"
    kernel.write_text(TIRX_28.path.read_text() + "\n\nimport time as _t\n_t.sleep(600)\n")
    pc = Precompiler(gpu_arch="sm_90a", size="smoke", root=tmp_path)
    quiet = GpuQuiet("cpu:7")
    quiet.listen(pc.pause)
    try:
        job = _job(kernel)
        assert pc.request(job)
        task = pc._tasks[pc._key(job)][0]
        deadline = time.monotonic() + 120
        while task.child is None or task.child.pid is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child, server = task.child, pc.servers()["tirx"]["pid"]
        quiet.hold("grading-1", "timing")  # a timing phase begins: the server and its fork stop
        assert _settles(child.pid, "T") and _settles(server, "T")
        quiet.release("grading-1")
        assert _settles(child.pid, "SR") and _settles(server, "SR")
        quiet.hold("grading-2", "timing")
        during = pc.figures()  # a pause still running counts up to now
        code = pc.take(job)  # its grading starts while it is stopped: killed all the same
        assert code.state == "late"
        quiet.release("grading-2")
        assert child.done.wait(20) and child.rc == -9
        assert pc.pauses == 2 and pc.paused_s > 0
        figs = pc.figures()
        assert during.pauses == 2 and 0 < during.paused_s <= figs.paused_s == pc.paused_s
        assert figs.as_dict() == {"servers": pc.servers(), "pauses": 2, "paused_s": figs.paused_s}
    finally:
        quiet.unlisten(pc.pause)
        pc.close()


def test_a_coordinator_tells_its_listeners_when_the_first_hold_begins_and_the_last_ends() -> None:
    from mkb.grader._pool import GpuQuiet

    told: list[bool] = []
    quiet = GpuQuiet("cpu:6")
    quiet.listen(told.append)
    quiet.hold("a", "timing")
    quiet.hold("b", "trusted_timing")  # already held: not told again
    quiet.release("a")
    quiet.release("b")
    quiet.release("b")  # idempotent
    quiet.listen(lambda held: 1 / 0)  # a listener that raises never reaches a hold
    quiet.hold("c", "timing")
    quiet.unlisten(told.append)
    quiet.release("c")
    assert told == [False, True, False, True]
