"""What a candidate starts stays in its worker's process group, so the pool's killpg ends it (mkb.grader._group_guard):
the filter's verdict for every call number it names, the real kernel's answer (threads that existed before
included), and a real grading whose kernel tries to leave a process behind."""

from __future__ import annotations

import errno
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mkb.grader import GraderConfig, grade
from mkb.grader._group_guard import _ARCHES, GroupGuard, program
from mkb.problems import baselines

_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
needs_table = pytest.mark.skipif(platform.machine() not in _ARCHES, reason="no seccomp table for this machine")


def _run_bpf(rows: list[tuple[int, int, int, int]], *, arch: int, nr: int) -> int:
    """A classic-BPF interpreter for the three instructions the filter uses (load word absolute, jeq k, ret k)."""
    data, pc, acc = {0: nr & 0xFFFFFFFF, 4: arch}, 0, 0
    for _ in range(len(rows) + 1):
        code, jt, jf, k = rows[pc]
        if code == 0x20:
            acc, pc = data[k], pc + 1
        elif code == 0x15:
            pc = pc + 1 + (jt if acc == k else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")
    raise AssertionError("the program did not return")


@pytest.mark.parametrize("machine", sorted(_ARCHES))
def test_the_filter_refuses_setsid_and_setpgid_in_every_abi_of_the_host_and_nothing_else(machine):
    rows = program(machine)
    for arch, numbers in _ARCHES[machine][1]:
        for nr in numbers:
            assert _run_bpf(rows, arch=arch, nr=nr) == _EPERM, (machine, hex(arch), nr)
        for nr in (0, 1, 39, 56, 57 + 1000, 59, 231, 435, max(numbers) + 1):  # read, write, getpid, clone, exec, ...
            if nr not in numbers:
                assert _run_bpf(rows, arch=arch, nr=nr) == _ALLOW, (machine, hex(arch), nr)
    # one arch's numbers are not another's: x86_64's 57 is fork, i386's 57 is setpgid
    native = _ARCHES[machine][1][0][0]
    assert _run_bpf(rows, arch=native, nr=57) == _ALLOW
    assert _run_bpf(rows, arch=0x12345678, nr=_ARCHES[machine][1][0][1][0]) == _ALLOW  # an arch no host here runs
    assert program("riscv64") == []


_PROBE = r'''
import json, os, subprocess, sys, threading
from mkb.grader._group_guard import keep_in_group

res = {}
go, done = threading.Event(), threading.Event()
def early():  # a thread that existed before the filter: TSYNC brings it along
    go.wait()
    r = subprocess.run([sys.executable, "-c", "import os; os.setsid()"], capture_output=True)
    res["early_thread_child"] = r.returncode
    done.set()
threading.Thread(target=early, daemon=True).start()
if sys.argv[1] == "guarded":
    res["describe"] = keep_in_group().describe()
go.set(); done.wait(30)
res["child_setsid"] = subprocess.run([sys.executable, "-c", "import os; os.setsid()"], capture_output=True).returncode
res["child_setpgid"] = subprocess.run([sys.executable, "-c", "import os; os.setpgid(0, 0)"], capture_output=True).returncode
try:
    subprocess.run(["true"], start_new_session=True)
    res["new_session"] = "started"
except PermissionError:
    res["new_session"] = "refused"
res["ordinary_child"] = subprocess.run(["sh", "-c", "exit 7"]).returncode
print(json.dumps(res))
'''


@needs_table
@pytest.mark.parametrize("mode", ["guarded", "control"])
def test_no_thread_of_a_kept_process_nor_anything_it_starts_can_leave_its_group(mode):
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ordinary_child"] == 7  # everything else works as before
    if mode == "guarded":
        assert res["describe"] == GroupGuard(True).describe()
        assert res["early_thread_child"] == res["child_setsid"] == res["child_setpgid"] == 1  # PermissionError
        assert res["new_session"] == "refused"
    else:  # what the filter stops, shown without it
        assert res["early_thread_child"] == res["child_setsid"] == res["child_setpgid"] == 0
        assert res["new_session"] == "started"


def test_a_machine_without_a_table_is_recorded_as_not_kept(monkeypatch):
    from mkb.grader import _group_guard

    monkeypatch.setattr(_group_guard.platform, "machine", lambda: "riscv64")
    g = _group_guard.keep_in_group()
    assert not g.kept and g.describe() == "not kept: no seccomp table for riscv64 (x86_64 and aarch64 have one)"


_LINGERER = '''import os
import subprocess
import sys

import torch

# started at import, as a kernel that meant to outlive its grading would: the child tries to leave the worker's group,
# then sleeps; its pid goes where the test can read it (the write guard is off in this test)
_CHILD = subprocess.Popen([sys.executable, "-c", "import os, time\\ntry:\\n    os.setsid()\\nexcept OSError:\\n    pass\\n"
                           "time.sleep(120)"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open({pid_file!r}, "w") as f:
    f.write(str(_CHILD.pid))


def solve(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''


def _gone(pid: int, within_s: float) -> bool:
    """Whether `pid` is dead (gone, or a zombie nobody reaped yet) within `within_s`."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@needs_table
@pytest.mark.parametrize("guard", ["seccomp", "off"])
def test_a_process_a_kernel_starts_dies_with_its_worker(tmp_path, fake_dsl_runtime, cpu_config, store, guard):
    pid_file = tmp_path / "child.pid"
    kernel = tmp_path / "kernel.py"
    kernel.write_text(_LINGERER.format(pid_file=str(pid_file)))
    cfg = GraderConfig.from_dict({**cpu_config.as_dict(), "fs_guard": "off", "group_guard": guard})
    v = grade(28, fake_dsl_runtime, kernel, store=store, config=cfg)
    pid = int(pid_file.read_text())
    try:
        assert v.passed, v.message  # leaving a process behind is not a wrong answer; it is contained, not judged
        fig = v.stage("compile").typed.group_guard
        if guard == "seccomp":
            assert fig == GroupGuard(True).describe()
            assert _gone(pid, 30), "the kernel's child outlived its worker"
        else:
            assert fig == "not kept: GraderConfig.group_guard is off"
            time.sleep(1.0)
            assert not _gone(pid, 0.5)  # the escape the guard closes, shown with it off
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_group_guard_takes_seccomp_or_off():
    assert GraderConfig().group_guard == "seccomp"
    assert GraderConfig(group_guard="off").overrides() == {"group_guard": "off"}
    with pytest.raises(ValueError, match="group_guard"):
        GraderConfig(group_guard="cgroup")


_CONFINED_CHECK = r'''
import runpy, sys
from pathlib import Path
from mkb.grader._fs_guard import confine_writes
from mkb.grader._group_guard import keep_in_group

import torch  # the worker's imports come before its confinement; the DSL's compile (nvcc, ptxas, MLIR) after it
fs, group = confine_writes([Path(sys.argv[1]), Path("/dev")]), keep_in_group()
assert fs.confined and group.kept, (fs.describe(), group.describe())
sys.argv = ["mkb.dsl._check", *sys.argv[2:]]
runpy.run_module("mkb.dsl._check", run_name="__main__")
'''


@pytest.mark.dsl
@pytest.mark.slow
@needs_table
@pytest.mark.parametrize("baseline", baselines(), ids=lambda b: f"{b.problem}-{b.dsl}")
def test_every_baseline_compiles_for_real_under_both_guards(baseline, tmp_path):
    """The DSLs' real compile paths (CuTe's MLIR pipeline, TIRx through nvcc and ptxas) as a grading worker runs
    them: writes confined to its scratch folder and /dev, no new process group (on the CPU, compile only)."""
    from mkb.dsl import get_backend
    from mkb.grader._fs_guard import landlock_abi

    if landlock_abi() < 1:
        pytest.skip("this kernel has no Landlock")
    backend = get_backend(baseline.dsl)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, **backend.environment("sm_90a"), **backend.private_environment(scratch), "TMPDIR": str(scratch),
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", _CONFINED_CHECK, str(scratch), baseline.dsl, str(baseline.path),
                          str(baseline.problem)], capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("MKB_CHECK ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    res = json.loads(lines[-1][len("MKB_CHECK "):])
    assert res["ok"] and "sm_90a" in res["messages"][0], res["messages"]
