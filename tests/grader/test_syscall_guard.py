"""The calls a grading worker's candidate is refused (mkb.grader._syscall_guard): the filter's verdict for every number
it names and for ordinary calls, the real kernel's answer (a thread started before included), and real gradings whose
kernel tries to leave a process behind or to have a service of the user start one."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mkb.grader import GraderConfig, grade
from mkb.grader._syscall_guard import _ARCHES, REFUSED, SyscallGuard, program
from mkb.problems import baselines

_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
needs_table = pytest.mark.skipif(platform.machine() not in _ARCHES, reason="no seccomp table for this machine")
# ordinary calls a worker makes: read, write, openat, mmap, clone, execve, exit_group, socketpair, ioctl, futex
_ORDINARY = {"x86_64": (0, 1, 257, 9, 56, 59, 231, 53, 16, 202), "aarch64": (63, 64, 56, 222, 220, 221, 94, 199, 29, 98)}
_OTHER_ABIS = (0x40000003, 0x40000028, 0x12345678)  # i386, arm compat, none that exists


def _run_bpf(rows: list[tuple[int, int, int, int]], *, arch: int, nr: int) -> int:
    """A classic-BPF interpreter for the instructions the filter uses (load word absolute, jeq k, jge k, ret k)."""
    data, pc, acc = {0: nr & 0xFFFFFFFF, 4: arch}, 0, 0
    for _ in range(len(rows) + 1):
        code, jt, jf, k = rows[pc]
        if code == 0x20:
            acc, pc = data[k], pc + 1
        elif code == 0x15:
            pc = pc + 1 + (jt if acc == k else jf)
        elif code == 0x35:
            pc = pc + 1 + (jt if acc >= k else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")
    raise AssertionError("the program did not return")


@pytest.mark.parametrize("machine", sorted(_ARCHES))
def test_the_filter_refuses_exactly_the_named_calls_and_every_other_abi(machine):
    rows, arch = program(machine), _ARCHES[machine]
    assert set(arch.numbers) == set(REFUSED)
    for name, nr in arch.numbers.items():
        assert _run_bpf(rows, arch=arch.audit_arch, nr=nr) == _EPERM, (machine, name)
    for nr in _ORDINARY[machine]:
        assert _run_bpf(rows, arch=arch.audit_arch, nr=nr) == _ALLOW, (machine, nr)
    for other in _OTHER_ABIS:  # i386's int 0x80 setsid is 66, which x86_64 calls semget: refused by the ABI, not the number
        for nr in (0, 1, 57, 66, 102):
            assert _run_bpf(rows, arch=other, nr=nr) == _EPERM, (machine, hex(other), nr)
    if machine == "x86_64":  # x32: the same arch with bit 30 in the number
        assert _run_bpf(rows, arch=arch.audit_arch, nr=0x40000000 | 0) == _EPERM
        assert _run_bpf(rows, arch=arch.audit_arch, nr=-1) == _EPERM  # (u32) -1: no such call anyway
    assert program("riscv64") == []


_PROBE = r'''
import ctypes, errno, json, os, socket, subprocess, sys, threading
from mkb.grader._syscall_guard import refuse_escapes

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
res = {}
go, done = threading.Event(), threading.Event()
def early():  # a thread that existed before the filter: TSYNC brings it along
    go.wait()
    r = subprocess.run([sys.executable, "-c", "import os; os.setsid()"], capture_output=True)
    res["early_thread_child"] = r.returncode
    done.set()
threading.Thread(target=early, daemon=True).start()
sleeper = subprocess.Popen(["sleep", "30"])
if sys.argv[1] == "guarded":
    res["describe"] = refuse_escapes().describe()
go.set(); done.wait(30)
res["child_setsid"] = subprocess.run([sys.executable, "-c", "import os; os.setsid()"], capture_output=True).returncode
res["child_setpgid"] = subprocess.run([sys.executable, "-c", "import os; os.setpgid(0, 0)"], capture_output=True).returncode
try:
    subprocess.run(["true"], start_new_session=True)
    res["new_session"] = "started"
except PermissionError:
    res["new_session"] = "refused"
for fam in ("AF_UNIX", "AF_INET", "AF_INET6"):
    try:
        socket.socket(getattr(socket, fam), socket.SOCK_STREAM).close()
        res[fam] = "made"
    except PermissionError:
        res[fam] = "refused"
a, b = socket.socketpair()  # an unconnected pair reaches nobody: allowed
a.close(); b.close()
PTRACE_SEIZE = 0x4206
r = libc.ptrace(ctypes.c_long(PTRACE_SEIZE), ctypes.c_long(sleeper.pid), None, None)
res["ptrace"] = "attached" if r == 0 else errno.errorcode[ctypes.get_errno()]
params = (ctypes.c_char * 120)()
r = libc.syscall(ctypes.c_long({io_uring_setup}), ctypes.c_uint(1), params)
res["io_uring"] = "fd" if r >= 0 else errno.errorcode[ctypes.get_errno()]
if r >= 0:
    os.close(r)
sleeper.kill(); sleeper.wait()
res["ordinary_child"] = subprocess.run(["sh", "-c", "exit 7"]).returncode
print(json.dumps(res))
'''


@needs_table
@pytest.mark.parametrize("mode", ["guarded", "control"])
def test_no_thread_of_a_guarded_process_nor_anything_it_starts_gets_the_refused_calls(mode):
    probe = _PROBE.replace("{io_uring_setup}", str(_ARCHES[platform.machine()].numbers["io_uring_setup"]))
    out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ordinary_child"] == 7  # everything else works as before
    if mode == "guarded":
        assert res["describe"] == SyscallGuard(True).describe()
        assert res["early_thread_child"] == res["child_setsid"] == res["child_setpgid"] == 1  # PermissionError
        assert res["new_session"] == "refused"
        assert res["AF_UNIX"] == res["AF_INET"] == res["AF_INET6"] == "refused"
        assert res["ptrace"] == "EPERM" and res["io_uring"] == "EPERM"
    else:  # what the filter stops, shown without it (io_uring may be off by sysctl; ptrace by a Yama policy)
        assert res["early_thread_child"] == res["child_setsid"] == res["child_setpgid"] == 0
        assert res["new_session"] == "started" and res["AF_UNIX"] == res["AF_INET"] == "made"


_DESCENDANTS = r'''
import json, os, platform, subprocess, sys, time
from mkb.grader._guards import processes_left_running, watch_descendants

def names(procs):
    return sorted(c for _, c in procs)

p = subprocess.Popen(["sleep", "30"])
res = {"not_watching": processes_left_running()}  # outside a grading worker nothing is looked at
res["watching"] = watch_descendants()
res["child"] = names(processes_left_running())
p.kill(); p.wait()
# a grandchild orphaned by its parent, and one that left the session first: the worker reaps both, so both are seen
subprocess.run(["sh", "-c", "sleep 30 & exit 0"])
subprocess.run([sys.executable, "-c", "import os, subprocess; os.setsid(); subprocess.Popen(['sleep', '31'])"])
time.sleep(0.3)
res["orphans"] = names(processes_left_running())
for pid, _ in processes_left_running():
    os.kill(pid, 9)
time.sleep(0.3)
res["zombies"] = processes_left_running()  # dead, not yet reaped: they can do nothing
if platform.machine() == "x86_64":  # the main thread ends by a raw exit(2), another thread runs on: Z, yet alive
    code = ("import ctypes, threading, time\n"
            "threading.Thread(target=time.sleep, args=(30,)).start()\n"
            "ctypes.CDLL(None).syscall(60, 0)")
    q = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(1.0)
    res["half_dead"] = names(processes_left_running())
    q.kill()
print(json.dumps(res))
'''


def test_every_live_descendant_of_a_worker_is_found_however_it_left(tmp_path):
    from mkb.grader._guards import processes_left_running

    assert processes_left_running() == []  # pytest watches nothing
    out = subprocess.run([sys.executable, "-c", _DESCENDANTS], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["not_watching"] == [] and res["watching"] is True
    assert res["child"] == ["sleep"] and res["orphans"] == ["sleep", "sleep"] and res["zombies"] == []
    if platform.machine() == "x86_64":
        assert res["half_dead"] == ["python3"] or len(res["half_dead"]) == 1, res["half_dead"]


_AUDIT = r'''
import json, sys
from mkb.grader._guards import refuse_audit_hooks

seen = []
sys.addaudithook(lambda event, args: seen.append("before") if event == "open" else None)  # added before: kept
refuse_audit_hooks()
sys.addaudithook(lambda event, args: seen.append("after") if event == "open" else None)  # dropped, quietly
open(__file__ if "__file__" in globals() else "/dev/null").close()
print(json.dumps(sorted(set(seen))))
'''


def test_no_audit_hook_is_added_once_the_worker_refuses_them():
    out = subprocess.run([sys.executable, "-c", _AUDIT], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["before"]


def test_the_guard_sees_the_interpreter_s_hooks_change():
    import gc

    from mkb.grader._guards import Guard

    g = Guard.take("cpu")
    assert g.check(identities=False) is None
    cb = lambda phase, info: None  # noqa: E731
    gc.callbacks.append(cb)
    try:
        assert g.check(identities=False) == ("integrity_identity", "interpreter hooks changed: gc.callbacks")
    finally:
        gc.callbacks.remove(cb)
    old = sys.getprofile()
    sys.setprofile(lambda *a: None)
    try:
        assert g.check(identities=False)[1] == "interpreter hooks changed: sys.getprofile"
    finally:
        sys.setprofile(old)
    assert g.check(identities=False) is None


def test_a_machine_without_a_table_is_recorded_as_not_kept(monkeypatch):
    from mkb.grader import _syscall_guard

    monkeypatch.setattr(_syscall_guard.platform, "machine", lambda: "riscv64")
    g = _syscall_guard.refuse_escapes()
    assert not g.kept and g.describe() == "not kept: no seccomp table for riscv64 (x86_64 and aarch64 have one)"


_LINGERER = '''import os
import subprocess
import sys

import torch

# started at import, as a kernel that meant to outlive its grading would: the child tries to leave the worker's group,
# then sleeps; its pid goes where the test can read it (the write guard is off in this test)
_CHILD = subprocess.Popen([sys.executable, "-c", "import os, time\\ntry:\\n    os.setsid()\\nexcept OSError:\\n    pass\\n"
                           "print('tried', flush=True)\\ntime.sleep(120)"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
with open({pid_file!r}, "w") as f:
    f.write(str(_CHILD.pid))
_CHILD.stdout.readline()  # once it has tried to leave the group


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
    cfg = GraderConfig.from_dict({**cpu_config.as_dict(), "fs_guard": "off", "syscall_guard": guard})
    v = grade(28, fake_dsl_runtime, kernel, store=store, config=cfg)
    pid = int(pid_file.read_text())
    try:
        fig = v.stage("compile").typed.syscall_guard
        # found either way (the worker reaps its orphans, whatever their session) and judged
        assert not v.passed and v.reason == "integrity_thread", (v.reason, v.message)
        assert "processes left running after the call" in v.message and str(pid) in v.message
        if guard == "seccomp":  # the child could not leave the group: ended with the worker
            assert fig == SyscallGuard(True).describe()
            assert _gone(pid, 30), "the kernel's child outlived its worker"
        else:  # the escape the filter closes, shown with it off: out of the group, alive after the worker's killpg
            assert fig == "not kept: GraderConfig.syscall_guard is off"
            time.sleep(1.0)
            assert not _gone(pid, 0.5)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_CALLER = '''import socket

import torch

# at import, as a kernel that wanted a process outside its worker would: ask a service of the user that starts what it
# is told (a tmux or screen server, a user systemd) over its named unix socket
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect({path!r})
        s.sendall(b"sleep 120\\n")
        s.recv(16)
except OSError:
    pass


def solve(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''


@needs_table
@pytest.mark.parametrize("guard", ["seccomp", "off"])
def test_a_kernel_cannot_have_a_service_of_the_user_start_a_process_for_it(tmp_path, fake_dsl_runtime, cpu_config,
                                                                           store, guard):
    """Landlock (below ABI 9) does not cover connecting to a named unix socket; refusing `socket` does."""
    started: list[int] = []

    class _Service(socketserver.StreamRequestHandler):  # a stand-in for a tmux server: runs what it is sent
        def handle(self):
            cmd = self.rfile.readline().decode().split()
            started.append(subprocess.Popen(cmd, start_new_session=True).pid)
            self.wfile.write(b"ok\n")

    path = str(tmp_path / "service.sock")
    server = socketserver.ThreadingUnixStreamServer(path, _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kernel = tmp_path / "kernel.py"
    kernel.write_text(_CALLER.format(path=path))
    try:
        cfg = GraderConfig.from_dict({**cpu_config.as_dict(), "syscall_guard": guard})  # Landlock on, as shipped
        v = grade(28, fake_dsl_runtime, kernel, store=store, config=cfg)
        assert v.passed, v.message
        if guard == "seccomp":
            assert started == []
        else:  # the hole, shown with the filter off: the service ran the kernel's command outside the worker
            assert len(started) == 1 and not _gone(started[0], 0.5)
    finally:
        server.shutdown()
        server.server_close()
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_whether_seccomp_is_there_is_asked_without_installing_anything(monkeypatch):
    from mkb.grader import _syscall_guard

    if platform.machine() in _ARCHES:
        assert _syscall_guard.seccomp_unavailable() is None  # this kernel has filters (the tests above install them)
    monkeypatch.setattr(_syscall_guard.platform, "machine", lambda: "riscv64")
    assert _syscall_guard.seccomp_unavailable().startswith("no seccomp table for riscv64")


def test_syscall_guard_takes_seccomp_required_or_off():
    assert GraderConfig(syscall_guard="required").syscall_guard == "required"
    assert GraderConfig().syscall_guard == "seccomp"
    assert GraderConfig(syscall_guard="off").overrides() == {"syscall_guard": "off"}
    with pytest.raises(ValueError, match="syscall_guard"):
        GraderConfig(syscall_guard="cgroup")


_CONFINED_CHECK = r'''
import json, sys
from pathlib import Path

import torch  # the worker's imports come before its confinement; the DSL's compile (nvcc, ptxas, MLIR) after it

from mkb.dsl import get_backend
from mkb.grader._fs_guard import confine_writes
from mkb.grader._guards import Guard, refuse_audit_hooks, watch_descendants
from mkb.grader._syscall_guard import refuse_escapes
from mkb.problems import load_problem_module

scratch, dsl, path, problem = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
backend = get_backend(dsl)
stats = backend.compile_only_patches()  # the DSL imported, as a worker has it before its candidate
inputs = load_problem_module(problem).make_inputs(0, device="cpu", size="smoke")
fs, calls = confine_writes([scratch, Path("/dev")]), refuse_escapes()
assert fs.confined and calls.kept and watch_descendants(), (fs.describe(), calls.describe())
refuse_audit_hooks()
guard = Guard.take("cpu")
mod = backend.load(path)
with torch.no_grad():
    mod.solve(*(inputs if isinstance(inputs, tuple) else (inputs,)))
print("MKB_CONFINED " + json.dumps({"compiled": stats["compiled"], "arch": stats["arch"], "guard": guard.check()}))
'''


@pytest.mark.dsl
@pytest.mark.slow
@needs_table
@pytest.mark.parametrize("baseline", baselines(), ids=lambda b: f"{b.problem}-{b.dsl}")
def test_every_baseline_compiles_for_real_under_both_guards(baseline, tmp_path):
    """The DSLs' real compile paths (CuTe's MLIR pipeline, TIRx through nvcc and ptxas) as a grading worker runs
    them: writes confined to its scratch folder and /dev, the calls refused, the worker reaping its orphans; and the
    guard finds nothing after the compile (no process left running, no hook, no identity moved; on the CPU, compile
    only)."""
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
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("MKB_CONFINED ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    res = json.loads(lines[-1][len("MKB_CONFINED "):])
    assert res["compiled"] >= 1 and res["arch"] == "sm_90a", res
    assert res["guard"] is None, res["guard"]  # nothing left running, no hook, no identity moved by a real compile
