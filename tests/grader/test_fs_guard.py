"""A grading worker writes nowhere but its own scratch folder once its candidate can run (mkb.grader._fs_guard):
not the event store (a forged verdict), not the grader's source, not a compile cache another worker reads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fake_dsl import TORCH_BASELINE_28
from mkb.grader import GraderConfig, grade
from mkb.grader._fs_guard import FsGuard, landlock_abi

needs_landlock = pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock (Linux >= 5.13, enabled)")

_CONFINED = r'''
import json, subprocess, sys
from pathlib import Path
from mkb.grader._fs_guard import confine_writes

ok, outside = Path(sys.argv[1]), Path(sys.argv[2])
import os, resource, signal, socket, threading
before = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # outside the domain
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
go, done = threading.Event(), threading.Event()
def early():  # a thread that existed before the confinement: Landlock does not reach it (recorded, not hidden)
    go.wait()
    try:
        (outside / "from_early_thread.txt").write_text("x")
    except PermissionError:
        pass
    done.set()
threading.Thread(target=early, daemon=True).start()
g = confine_writes([ok, Path("/dev"), Path(sys.argv[3])])
go.set(); done.wait(10)
try:
    socket.create_connection(server.getsockname(), timeout=5).close()
    res_tcp = "connected"
except PermissionError:
    res_tcp = "refused"
fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
try:
    os.kill(before.pid, signal.SIGTERM)
    res_kill = "sent"
except PermissionError:
    res_kill = "refused"
res = {"confined": g.confined, "writable": list(g.writable), "describe": g.describe(), "tcp": res_tcp, "fsize": fsize,
       "threads_before": g.threads_before, "note": g.note}
(ok / "inside.txt").write_text("x")
open("/dev/null", "w").write("x")
for name, target in (("outside", outside / "outside.txt"), ("rename_out", outside / "moved.txt")):
    try:
        if name == "outside":
            target.write_text("x")
        else:
            (ok / "inside.txt").rename(target)
        res[name] = "written"
    except PermissionError:
        res[name] = "denied"
child = subprocess.run(["sh", "-c", f"echo x > {outside / 'child.txt'}"], capture_output=True)
res["child_rc"] = child.returncode
res["kill_outside"] = res_kill
mine = subprocess.Popen(["sleep", "30"])  # started inside: the worker may still end what it started
os.kill(mine.pid, signal.SIGKILL)
res["kill_inside"] = mine.wait()
res["before_pid"] = before.pid  # the test ends it: this process may not
print(json.dumps(res))
'''


@needs_landlock
def test_a_confined_process_and_its_children_write_only_beneath_the_folders_named(tmp_path):
    ok, outside = tmp_path / "scratch", tmp_path / "store"
    ok.mkdir()
    outside.mkdir()
    out = subprocess.run([sys.executable, "-c", _CONFINED, str(ok), str(outside), str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    os.kill(res["before_pid"], signal.SIGKILL)
    abi = landlock_abi()
    assert res["confined"] and res["writable"] == [str(ok), "/dev"]  # a missing folder is skipped and named
    assert res["note"] == f"missing, not writable: {tmp_path / 'missing'}"
    assert res["describe"].startswith(f"landlock abi {abi}: the candidate's thread and what it starts write only "
                                      f"beneath {ok}, /dev")
    assert res["outside"] == "denied" and res["rename_out"] == "denied" and res["child_rc"] != 0
    assert res["kill_inside"] == -9
    assert res["kill_outside"] == ("refused" if abi >= 6 else "sent")
    assert ("; no signals or abstract sockets outside" in res["describe"]) == (abi >= 6)
    assert res["tcp"] == ("refused" if abi >= 4 else "connected") and res["fsize"] == 1 << 30
    assert res["threads_before"] >= 1
    if abi >= 8:  # TSYNC: the thread started before is confined too
        assert f"the {res['threads_before']} threads started before too" in res["describe"]
        assert list(outside.iterdir()) == []
    else:  # the known gap, recorded: the thread started before writes where the confined one may not
        assert "threads started before not confined" in res["describe"]
        assert sorted(p.name for p in outside.iterdir()) == ["from_early_thread.txt"]
    assert (ok / "inside.txt").exists()


def test_without_landlock_nothing_is_confined_and_the_record_says_why(monkeypatch):
    from mkb.grader import _fs_guard

    monkeypatch.setattr(_fs_guard, "landlock_abi", lambda: 0)
    g = _fs_guard.confine_writes([Path("/tmp")])
    assert g == FsGuard(False, 0, (), g.note) and g.describe().startswith("not confined: no Landlock here")


_WRITER = '''import os
import torch


def solve(x, residual, weight):
    for target in {targets!r}:
        try:
            with open(target.replace("$SCRATCH", os.environ.get("MKB_WORKER_SCRATCH", "/nonexistent")), "w") as f:
                f.write("forged")
        except OSError:
            pass
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''


@needs_landlock
@pytest.mark.parametrize("guard", ["landlock", "required", "off"])
def test_a_kernel_cannot_forge_a_verdict_file_in_the_store_or_touch_the_grader_s_source(tmp_path, fake_dsl_runtime,
                                                                                       cpu_config, store, guard):
    forged = Path(store) / "forged-dataset" / "kind=verdict"
    forged.mkdir(parents=True)
    source = tmp_path / "mkb-copy"  # stands in for the grader's own files (writable by its user, like the store)
    source.mkdir()
    targets = [str(forged / "forged.parquet"), str(source / "_harness.py"), "$SCRATCH/mine.txt"]
    kernel = tmp_path / "kernel.py"
    kernel.write_text(_WRITER.format(targets=targets))
    cfg = GraderConfig.from_dict({**cpu_config.as_dict(), "fs_guard": guard})
    v = grade(28, fake_dsl_runtime, kernel, store=store, config=cfg)
    assert v.passed, v.message  # the writes fail quietly (the kernel swallows the error); its answer is right
    fig = v.stage("compile").typed.fs_guard
    if guard != "off":
        assert fig.startswith("landlock abi ") and "/dev" in fig, fig
        assert list(forged.iterdir()) == [] and list(source.iterdir()) == []  # neither write landed
    else:
        assert fig == "not confined: GraderConfig.fs_guard is off"
        assert (forged / "forged.parquet").read_text() == "forged"  # what the guard stops, shown with it off
        assert (source / "_harness.py").exists()


def test_the_worker_s_scratch_holds_its_temporary_files_and_dsl_cache_and_goes_with_it(fake_dsl, cpu_config):
    from mkb.grader import Worker

    w = Worker(fake_dsl, device="cpu")
    try:
        assert w.wait_ready(120), w.ready_error
        scratch = Path(w.scratch)
        assert scratch.is_dir() and scratch.name.startswith(f"mkb-worker-{fake_dsl}-")
        env = Path(f"/proc/{w.pid}/environ").read_bytes().split(b"\0")
        assert f"MKB_WORKER_SCRATCH={scratch}".encode() in env and f"TMPDIR={scratch}".encode() in env
        assert f"MKB_FAKE_DSL_CACHE={scratch / 'fake_cache'}".encode() in env  # the backend's private_environment
    finally:
        w.kill()
        w.cleanup()
    assert not scratch.exists()


def test_a_worker_killed_without_waiting_leaves_its_scratch_folder_to_the_reaper(fake_dsl, cpu_config):
    from mkb.grader import Worker
    from mkb.grader._pool import _REAPER, _join_reapers

    w = Worker(fake_dsl, device="cpu")
    try:
        assert w.wait_ready(120), w.ready_error
        scratch = Path(w.scratch)
        (scratch / "left.bin").write_bytes(b"x" * 1024)
        threads = threading.active_count()
    finally:
        w.kill(wait=False)
        w.cleanup()  # returns at once: the folder is the reaper's
    assert threading.active_count() <= threads  # the kill started no thread (the reaper runs since the worker's start)
    assert not Path(w.log.name).exists()
    assert _join_reapers()  # what the process does at exit: no scratch folder outlives it
    assert not scratch.exists() and w.proc.returncode is not None and w._reaped
    assert _REAPER.join(0)


def test_the_reaper_reaps_many_workers_and_one_that_outlives_its_limit_still_loses_its_folder(tmp_path, monkeypatch):
    import types

    from mkb.grader import _pool

    reaper = _pool._Reaper()
    monkeypatch.setattr(_pool, "REAP_LIMIT_S", 0.3)

    def fake(cmd: list[str]) -> types.SimpleNamespace:
        scratch = tmp_path / f"w{len(list(tmp_path.iterdir()))}"
        scratch.mkdir()
        w = types.SimpleNamespace(proc=subprocess.Popen(cmd), scratch=str(scratch), reaped=[])
        w._reap = lambda *, timeout, join_s: (w.reaped.append(timeout), shutil.rmtree(w.scratch))
        return w

    quick = [fake(["true"]) for _ in range(5)]
    stuck = fake(["sleep", "5"])
    for w in quick + [stuck]:
        reaper.submit(w)
    assert reaper.join(10)
    assert all(w.reaped == [0] and not Path(w.scratch).exists() for w in quick + [stuck])
    assert stuck.proc.poll() is None  # left running past the limit: its folder removed all the same
    stuck.proc.kill()
    stuck.proc.wait()


def test_every_registered_backend_keeps_its_compile_cache_in_the_scratch_folder(tmp_path):
    from mkb.dsl import get_backend
    from mkb.dsl._registry import BACKENDS

    for name in BACKENDS:
        env = get_backend(name).private_environment(tmp_path)
        assert all(Path(v).is_relative_to(tmp_path) for v in env.values()), (name, env)
    assert get_backend("cute").private_environment(tmp_path) == {"CUTE_DSL_CACHE_DIR": str(tmp_path / "cute_dsl_cache")}


def test_every_thread_is_confined_where_the_kernel_can():
    from mkb.grader._fs_guard import restrict_flags

    assert [restrict_flags(abi) for abi in (1, 6, 7, 8, 9)] == [0, 0, 0, 1 << 3, 1 << 3]  # TSYNC came with ABI 8
    some = FsGuard(True, 8, ("/s", "/dev"), threads_before=3, all_threads=True).describe()
    assert "the 3 threads started before too" in some and "not confined" not in some
    assert "3 threads started before not confined" in FsGuard(True, 7, ("/s",), threads_before=3).describe()


def test_a_required_guard_that_could_not_confine_fails_the_grading_as_infra(monkeypatch, tmp_path):
    """Checked in this process with the confinement calls replaced (the real ones would confine pytest for good)."""
    from mkb.grader import _harness
    from mkb.grader._syscall_guard import SyscallGuard

    monkeypatch.setenv("MKB_WORKER_SCRATCH", str(tmp_path))
    monkeypatch.setattr(_harness, "_FS_GUARD", [])
    monkeypatch.setattr(_harness, "_SYSCALL_GUARD", [])
    monkeypatch.setattr(_harness, "refuse_escapes", lambda: SyscallGuard(True))
    monkeypatch.setattr(_harness, "watch_descendants", lambda: True)  # the real ones would change pytest for good
    monkeypatch.setattr(_harness, "refuse_audit_hooks", lambda: None)
    monkeypatch.setattr(_harness, "confine_writes", lambda folders, readable=None: FsGuard(False, 0, (), "no Landlock here (test)"))
    with pytest.raises(_harness.Fail) as info:
        _harness.confine_candidate(GraderConfig(fs_guard="required"))
    assert (info.value.stage, info.value.reason) == ("compile", "infra_error")
    assert "not confined: no Landlock here (test)" in info.value.message and "hint: " in info.value.message
    fs, calls = _harness.confine_candidate(GraderConfig())  # the default goes on, and records why it is unconfined
    assert not fs.confined and calls.kept
    assert _harness.guard_figures() == {"fs_guard": "not confined: no Landlock here (test)",
                                        "syscall_guard": SyscallGuard(True).describe()}
    monkeypatch.setattr(_harness, "_FS_GUARD", [])
    monkeypatch.setattr(_harness, "confine_writes", lambda folders, readable=None: FsGuard(True, 7, tuple(map(str, folders))))
    fs, _ = _harness.confine_candidate(GraderConfig(fs_guard="required"))  # confined: required is met
    assert fs.confined and fs.writable == (str(tmp_path), "/dev")
    monkeypatch.setattr(_harness, "_SYSCALL_GUARD", [])
    monkeypatch.setattr(_harness, "_FS_GUARD", [])
    monkeypatch.setattr(_harness, "refuse_escapes", lambda: SyscallGuard(False, "no seccomp here (test)"))
    with pytest.raises(_harness.Fail) as info:  # the calls required and not refused: infra too
        _harness.confine_candidate(GraderConfig(syscall_guard="required"))
    assert info.value.reason == "infra_error" and "not kept: no seccomp here (test)" in info.value.message


def test_a_required_guard_on_a_kernel_without_landlock_grades_nothing(monkeypatch, tmp_path, fake_dsl, cpu_config,
                                                                     store):
    """Refused before any worker starts: an attempt stops on the error as infra instead of spending a submission on a
    grading that cannot be confined."""
    from mkb.grader import ConfinementUnavailable, _confine

    monkeypatch.setattr(_confine, "landlock_abi", lambda: 0)
    kernel = tmp_path / "kernel.py"
    kernel.write_text(TORCH_BASELINE_28)
    cfg = GraderConfig.from_dict({**cpu_config.as_dict(), "fs_guard": "required"})
    with pytest.raises(ConfinementUnavailable, match="has no Landlock") as info:
        grade(28, fake_dsl, kernel, store=store, config=cfg)
    assert "hint: " in str(info.value)
    assert not Path(store).exists() or not list(Path(store).rglob("*.parquet"))  # nothing was graded or written


def test_fs_guard_takes_landlock_required_or_off():
    assert GraderConfig().fs_guard == "landlock" and GraderConfig(fs_guard="off").overrides() == {"fs_guard": "off"}
    assert GraderConfig(fs_guard="required").fs_guard == "required"
    with pytest.raises(ValueError, match="fs_guard"):
        GraderConfig(fs_guard="bwrap")


_READER = '''import torch


def solve(x, residual, weight):
    try:
        learned = open({secret!r}).read()
    except PermissionError:
        learned = "refused"
    import wave  # noqa: F401 - a standard module not imported before: its Python stays readable
    if learned != "refused":
        raise RuntimeError("learned " + learned)
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''


@needs_landlock
@pytest.mark.parametrize("read_guard", ["landlock", "off"])
def test_with_reads_confined_a_kernel_cannot_read_a_user_s_files_and_still_grades(tmp_path, fake_dsl, cpu_config, store,
                                                                                 read_guard):
    """GraderConfig.read_guard (an arm until a GPU run): a kernel reads nothing outside the system's, its Python's,
    mkb's and its own folders (no ~/.aws to print into its events); with it off the read lands, as before."""
    home = tmp_path / "home" / ".aws"
    home.mkdir(parents=True)
    (home / "credentials").write_text("aws_secret_access_key = plainly-not-in-the-environment")
    kernel = tmp_path / "kernel.py"
    kernel.write_text(_READER.format(secret=str(home / "credentials")))
    cfg = GraderConfig.from_dict({**cpu_config.as_dict(), "read_guard": read_guard})
    v = grade(28, fake_dsl, kernel, store=store, config=cfg)
    fig = v.stage("compile").typed.fs_guard
    if read_guard == "landlock":
        assert v.passed, v.message  # the read was refused, and everything the grading needs was read
        assert "reads only beneath" in fig, fig
    else:
        assert v.reason == "runtime_error" and "plainly-not-in-the-environment" in v.message  # what the guard stops


def test_the_readable_folders_hold_this_python_and_mkb_and_no_home_or_tmp(tmp_path):
    from mkb.grader._fs_guard import default_readable

    own = tmp_path / "scratch"
    own.mkdir()
    got = {str(p) for p in default_readable([own])}
    assert str(own) in got and "/usr" in got and os.path.realpath(sys.prefix) in got
    assert str(Path(__file__).resolve().parents[2]) in got  # mkb's checkout
    assert "/tmp" not in got and "/home" not in got and "/root" not in got
    assert "/etc" not in got and "/run" not in got  # of /etc only what the loader and the C library read (no /etc/shadow)
    assert all(p.startswith("/etc/") for p in got if p.startswith("/etc"))
    with pytest.raises(ValueError, match="read_guard"):
        GraderConfig(read_guard="yes")
