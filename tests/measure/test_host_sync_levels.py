"""benchmarks/host_sync_levels.py: its plan, budget, host helpers and table on the CPU; a tiny run on a GPU."""

import argparse
import ctypes.util
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hs(repo_script):
    return repo_script("benchmarks/host_sync_levels.py")


# ---------------------------------------------------------------------------------------------------- the plan

def test_arm_rotation_runs_every_arm_once_a_round_starting_one_later_each_round(hs):
    arms = ["a", "b", "c", "d", "e"]
    plan = hs.plan_arms(12, arms)
    assert plan[:5] == arms
    assert plan[5:10] == ["b", "c", "d", "e", "a"]
    assert plan[10:] == ["c", "d"]
    for r in range(2):
        assert sorted(plan[5 * r:5 * r + 5]) == arms
    firsts = [plan[5 * r] for r in range(2)]
    assert len(set(firsts)) == 2


def test_arm_rotation_continues_across_calls_and_survives_skipped_arms(hs):
    arms = ["a", "b", "c", "d", "e"]
    assert hs.plan_arms(4, arms) + hs.plan_arms(8, arms, start=4) == hs.plan_arms(12, arms)
    three = hs.plan_arms(6, ["a", "b", "c"])  # pinned arms skipped: the rotation runs over the others
    assert three == ["a", "b", "c", "b", "c", "a"]
    assert hs.plan_arms(3, []) == []


def test_budget_stops_new_processes_and_keeps_the_run_under_its_total(hs):
    b = hs.Budget(start_by_s=150, child_timeout_s=60, total_s=195, min_child_s=15)
    assert b.timeout(0) == 60
    assert b.timeout(140) == pytest.approx(55)  # the last process gets what is left, not 60 s
    assert b.timeout(150) == pytest.approx(45)
    assert b.timeout(150.5) is None  # no new process after 150 s
    assert hs.Budget(start_by_s=500, total_s=195, min_child_s=15).timeout(185) is None  # too little left to start one
    for t in range(0, 200, 7):  # whatever the start, the process's end is within the total
        lim = b.timeout(t)
        assert lim is None or t + lim <= 195


# ---------------------------------------------------------------------------------------------- host helpers

class _FakeCuda:
    """libcuda's entry points the experiment calls, as Python functions that write through ctypes' byref."""

    def __init__(self, *, init=0, flags=0, active=0, v2=True):
        self.init, self.flags, self.active, self.set_calls = init, flags, active, []
        if v2:
            self.cuDevicePrimaryCtxSetFlags_v2 = self._set
        else:
            self.cuDevicePrimaryCtxSetFlags = self._set

    def cuInit(self, _flags):
        return self.init

    def cuGetErrorName(self, code, p):
        p._obj.value = {100: b"CUDA_ERROR_NO_DEVICE", 708: b"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"}.get(code)
        return 0 if p._obj.value else 1

    def cuDeviceGet(self, d, ordinal):
        d._obj.value = ordinal
        return 0

    def cuDriverGetVersion(self, v):
        v._obj.value = 13000
        return 0

    def cuDevicePrimaryCtxGetState(self, dev, flags, active):
        flags._obj.value, active._obj.value = self.flags, self.active
        return 0

    def _set(self, dev, flags):
        if self.active:
            return 708
        self.set_calls.append(flags.value)
        self.flags = flags.value
        return 0

    def cuDeviceGetPCIBusId(self, buf, n, dev):
        buf.value = b"00000000:19:00.0"
        return 0


def test_no_libcuda_is_a_one_line_skip_not_a_traceback(hs, tmp_path, capsys):
    with pytest.raises(hs.Unavailable, match="^no libcuda"):
        hs.Driver.open("libcuda-that-is-not-here.so.1")
    a = argparse.Namespace(out=str(tmp_path / "o"))
    assert hs.gpu_main(a, open_driver=lambda: hs.Driver.open("libcuda-that-is-not-here.so.1")) == 2
    err = capsys.readouterr().err
    assert err.startswith("host_sync_levels: skipped: no libcuda (")
    assert "hint:" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing written for a run that did not happen


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this host has a CUDA driver")
def test_the_script_without_a_driver_says_skipped(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/host_sync_levels.py"), "--gpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "skipped: no libcuda" in r.stderr and "Traceback" not in r.stderr


def test_driver_errors_are_named(hs):
    with pytest.raises(hs.DriverError, match=r"cuInit failed: CUDA_ERROR_NO_DEVICE \(100\)"):
        hs.Driver.open("x", loader=lambda name: _FakeCuda(init=100))
    drv = hs.Driver(_FakeCuda(active=1))
    with pytest.raises(hs.DriverError, match=r"cuDevicePrimaryCtxSetFlags_v2 failed: CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"):
        drv.set_primary_flags(0, hs.CU_CTX_SCHED_SPIN)
    with pytest.raises(hs.DriverError, match=r"\(999\)"):  # an unnamed code still says its number
        hs.Driver(_FakeCuda())._check("cuX", 999)


def test_driver_sets_and_reads_back_the_primary_context_flags(hs):
    lib = _FakeCuda()
    drv = hs.Driver.open("x", loader=lambda name: lib)
    dev = drv.device(0)
    assert drv.primary_state(dev) == {"flags": 0, "sched": "auto", "active": False}
    drv.set_primary_flags(dev, hs.CU_CTX_SCHED_BLOCKING_SYNC)
    assert lib.set_calls == [4] and drv.primary_state(dev)["sched"] == "blocking_sync"
    assert drv.version() == 13000 and drv.pci_bus_id(dev) == "00000000:19:00.0"
    old = _FakeCuda(v2=False)  # a driver with only the pre-11 entry point
    hs.Driver(old).set_primary_flags(0, hs.CU_CTX_SCHED_SPIN)
    assert old.set_calls == [1]
    assert hs.sched_name(0x9) == "spin"  # the scheduling bits only (0x8 is CU_CTX_MAP_HOST)
    assert hs.sched_name(None) == "unknown"


def test_cpu_lists_masks_and_pci_addresses(hs):
    assert hs.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert hs.parse_cpulist("") == []
    assert hs.cpus_from_mask([0b101, 1]) == [0, 2, 64]
    assert hs.normalise_bdf("00000000:19:00.0") == "0000:19:00.0"
    assert hs.normalise_bdf("0000:9A:00.1") == "0000:9a:00.1"
    with pytest.raises(ValueError, match="not a PCI address"):
        hs.normalise_bdf("GPU-0")
    assert hs._ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and hs._ranges([]) == "-"


def test_stat_cpu_is_field_39_even_with_spaces_and_parens_in_the_name(hs):
    fields = [str(i) for i in range(3, 53)]  # fields 3..52 after "pid (comm)"
    stat = "4242 (py (x) 3) " + " ".join(fields)
    assert hs.parse_stat_cpu(stat) == 39
    assert isinstance(hs.current_cpu(), int)  # this host's /proc


def _sysfs(tmp_path, cpulist="0-7", numa="1"):
    d = tmp_path / "0000:19:00.0"
    d.mkdir(parents=True)
    (d / "local_cpulist").write_text(cpulist + "\n")
    (d / "numa_node").write_text(numa + "\n")
    return tmp_path


def test_local_cpus_prefer_nvml_and_fall_back_to_sysfs(hs, tmp_path):
    sysfs = _sysfs(tmp_path)
    got = hs.gpu_local_cpus("00000000:19:00.0", sysfs=sysfs, nvml=lambda bus: [4, 5, 6, 7], allowed=range(16))
    assert got["source"] == "nvml" and got["local"] == [4, 5, 6, 7] and got["sysfs"] == list(range(8))
    assert got["usable"] == [4, 5, 6, 7] and got["why"] is None and got["numa_node"] == 1

    def no_nvml(bus):
        raise hs.Unavailable("no NVML (libnvidia-ml.so.1: cannot open)")

    got = hs.gpu_local_cpus("00000000:19:00.0", sysfs=sysfs, nvml=no_nvml, allowed=[2, 3, 12])
    assert got["source"] == "sysfs" and got["usable"] == [2, 3] and got["nvml_error"].startswith("no NVML")


def test_local_cpus_unknown_or_unusable_say_why(hs, tmp_path):
    def no_nvml(bus):
        raise hs.Unavailable("no NVML (x)")

    got = hs.gpu_local_cpus("00000000:19:00.0", sysfs=tmp_path, nvml=no_nvml, allowed=[0, 1])
    assert got["usable"] == [] and got["why"].startswith("unknown: no NVML (x); FileNotFoundError")
    got = hs.gpu_local_cpus("00000000:19:00.0", sysfs=_sysfs(tmp_path, "32-63"), nvml=no_nvml, allowed=[0, 1])
    assert got["usable"] == [] and "none of the GPU-local CPUs" in got["why"]
    got = hs.gpu_local_cpus(None, allowed=[0])
    assert got["usable"] == [] and got["why"].startswith("unknown")
    got = hs.gpu_local_cpus("00000000:19:00.0", sysfs=tmp_path, nvml=lambda b: [0, 1, 2], allowed=[0, 1])
    assert got["usable"] == [0, 1] and "changes nothing" in got["why"]  # recorded, still run


def test_nvml_missing_is_unavailable(hs):
    with pytest.raises(hs.Unavailable, match="^no NVML"):
        hs.nvml_cpus("00000000:19:00.0", name="libnvidia-ml-that-is-not-here.so.1")


# ---------------------------------------------------------------------------------------------------- the run

def _args(hs, tmp_path, **kw):
    base = dict(out=str(tmp_path / "out"), processes=7, start=0, arms=list(hs.ARMS), budget_s=150.0,
                child_timeout_s=60.0, total_s=195.0, kernels=["23/cute"], reps=1, n=3, warm=1, arch="sm_90a")
    base.update(kw)
    return argparse.Namespace(**base)


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _spawner(clock, *, seconds=40.0, die=(), hang=()):
    """A stand-in for subprocess.run: a 'process' that takes `seconds`, writes one grading to its --child-out and
    prints a line; the ones in `die` exit 1 after writing nothing, those in `hang` run past their timeout."""
    calls = []

    def spawn(cmd, timeout, **_kw):
        i = int(cmd[cmd.index("--child") + 1])
        arm = cmd[cmd.index("--arm") + 1]
        cpus = [int(c) for c in cmd[cmd.index("--cpus") + 1:]] if "--cpus" in cmd else None
        calls.append({"i": i, "arm": arm, "timeout": timeout, "cpus": cpus})
        if i in hang:
            clock.t += timeout
            raise subprocess.TimeoutExpired(cmd, timeout, output=b"[proc] compiling\n")
        clock.t += seconds
        if i in die:
            return subprocess.CompletedProcess(cmd, 1, stdout="Traceback ...\nRuntimeError: CUDA error: boom\n")
        Path(cmd[cmd.index("--child-out") + 1]).write_text(json.dumps(_proc(i, arm, [_grading("23/cute", 0, 100.0 + i)])))
        return subprocess.CompletedProcess(cmd, 0, stdout=f"[proc {i}] 23/cute rep 0\n")

    return spawn, calls


def _local(usable):
    return lambda bus: {"bus_id": bus, "source": "sysfs" if usable else None, "local": usable or None,
                        "usable": usable, "allowed": [0, 1, 2, 3], "why": None if usable else "unknown: no NVML; no sysfs"}


def test_run_rotates_arms_passes_the_local_cpus_and_stops_on_budget(hs, tmp_path, capsys):
    clock = _Clock()
    spawn, calls = _spawner(clock, seconds=40.0)
    a = _args(hs, tmp_path)
    assert hs.gpu_main(a, open_driver=lambda: hs.Driver(_FakeCuda()), local_cpus=_local([2, 3]), spawn=spawn,
                       clock=clock) == 0
    # starts at 0, 40, 80, 120 s; at 160 s no new process (start by 150 s)
    assert [c["arm"] for c in calls] == ["a", "b", "c", "d"]
    assert [c["timeout"] for c in calls] == [60.0, 60.0, 60.0, 60.0]
    assert [c["cpus"] for c in calls] == [None, None, None, [2, 3]]
    res = json.loads((tmp_path / "out" / "hostsync.json").read_text())
    assert res["plan"] == hs.plan_arms(7, list(hs.ARMS))
    assert [p["arm"] for p in res["processes"]] == ["a", "b", "c", "d"]
    assert res["errors"] == ["processes 4.. not started: budget (160 s)"]
    log = (tmp_path / "out" / "hostsync.log").read_text()
    assert "[proc 3] 23/cute rep 0" in log and "23/cute" in log.split("# host-sync levels")[1]  # children's lines, table
    assert "process 3 arm d: 1 gradings" in capsys.readouterr().out


def test_run_skips_pinned_arms_without_local_cpus_and_keeps_going_past_a_dead_or_stopped_process(hs, tmp_path):
    clock = _Clock()
    spawn, calls = _spawner(clock, seconds=10.0, die={1}, hang={2})
    a = _args(hs, tmp_path, processes=5, child_timeout_s=30.0)
    assert hs.gpu_main(a, open_driver=lambda: hs.Driver(_FakeCuda()), local_cpus=_local([]), spawn=spawn,
                       clock=clock) == 0
    res = json.loads((tmp_path / "out" / "hostsync.json").read_text())
    assert set(res["skipped_arms"]) == {"d", "e"} and res["skipped_arms"]["d"].startswith("unknown")
    assert [c["arm"] for c in calls] == ["a", "b", "c", "b", "c"]  # the rotation over a, b, c
    assert [p["process"] for p in res["processes"]] == [0, 3, 4]
    assert res["errors"] == ["process 1 (arm b) exited 1 before its first grading: RuntimeError: CUDA error: boom",
                             "process 2 (arm c) stopped after 30 s before its first grading: [proc] compiling"]
    assert "compiling" in (tmp_path / "out" / "hostsync.log").read_text()


def test_run_gives_the_last_process_only_what_is_left(hs, tmp_path):
    clock = _Clock()
    spawn, calls = _spawner(clock, seconds=47.0)
    a = _args(hs, tmp_path, processes=5)
    hs.gpu_main(a, open_driver=lambda: hs.Driver(_FakeCuda()), local_cpus=_local([0]), spawn=spawn, clock=clock)
    assert [c["timeout"] for c in calls] == [60.0, 60.0, 60.0, pytest.approx(195.0 - 141.0)]
    assert calls[-1]["timeout"] + 141.0 <= 195.0


def test_a_process_on_the_cpu_keeps_every_grading_and_its_host_facts(hs, tmp_path, capsys):
    """The child's bookkeeping end to end (`--device cpu`: perf_counter windows, no hold): what the GPU run records."""
    out = tmp_path / "child.json"
    a = argparse.Namespace(
        child=4, arm="a", child_out=str(out), kernels=["23/eager", "probe/sync", "23/nope"], reps=2, n=3, warm=1,
        arch="sm_90a", cpus=[], device="cpu")
    hs._child(a)
    st = json.loads(out.read_text())
    assert st["process"] == 4 and st["arm"] == "a" and st["affinity"] == sorted(os.sched_getaffinity(0))
    if ctypes.util.find_library("cuda") is None:
        assert st["driver_error"].startswith("no libcuda") and "ctx_after_torch" not in st
        assert "skipped: no libcuda" in capsys.readouterr().out
    assert [(g["kernel"], g["rep"]) for g in st["gradings"]] == [("23/eager", 0), ("probe/sync", 0), ("23/eager", 1),
                                                                 ("probe/sync", 1)]
    assert st["errors"] == ["23/nope: LookupError: problem 23 has no nope baseline"]  # a kernel that cannot load is named, the rest run
    for g in st["gradings"]:
        assert len(g["times_us"]) == 3 and len(g["host_us"]) == 3 and g["median_us"] > 0
        assert g["q10_us"] <= g["median_us"] <= g["q90_us"] and g["hold_us"] is None
        assert isinstance(g["cpu_before"], int) and g["vol_switches_per_call"] >= 0 and g["loop_cpu_s"] >= 0
    probe = [g for g in st["gradings"] if g["kernel"] == "probe/sync"]
    assert all(len(g["host_sync_us"]) == 3 and g["sync_us"] == [] and g["sync_us_median"] is None for g in probe)


def test_a_spin_or_blocking_arm_without_a_driver_stops_with_a_line(hs, tmp_path, capsys):
    if ctypes.util.find_library("cuda") is not None:
        pytest.skip("this host has a CUDA driver")
    a = argparse.Namespace(child=1, arm="b", child_out=str(tmp_path / "c.json"), kernels=["23/eager"], reps=1, n=3,
                           warm=1, arch="sm_90a", cpus=[], device="cpu")
    with pytest.raises(SystemExit) as e:
        hs._child(a)
    assert e.value.code == 3 and "[proc 1 arm b] skipped: no libcuda" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- the table

def _grading(kernel, rep, median, *, host=150.0, vcsw=0.0, sync=None):
    g = {"kernel": kernel, "rep": rep, "median_us": median, "times_us": [median] * 100, "host_us_median": host,
         "vol_switches_per_call": vcsw, "cpu_before": 3, "cpu_after": 3}
    if sync is not None:
        g["sync_us_median"] = sync
    return g


def _proc(i, arm, gradings):
    return {"process": i, "arm": arm, "arm_label": f"label {arm}", "affinity": [0, 1, 2, 3], "gradings": gradings,
            "ctx_after_torch": {"flags": 1, "sched": "spin", "active": True}, "ctx_set": {"sched": "spin"},
            "errors": [], "wall_s": 20.0}


def _res():
    return {"args": {"kernels": ["23/cute", "probe/sync", "28/cute"]}, "elapsed_s": 40.0, "errors": [],
            "skipped_arms": {"d": "unknown"}, "processes": [
                _proc(0, "a", [_grading("23/cute", 0, 100.0), _grading("23/cute", 1, 102.0),
                               _grading("28/cute", 0, 82.0), _grading("probe/sync", 0, 60.0, sync=20.0)]),
                _proc(1, "a", [_grading("23/cute", 0, 110.0, vcsw=1.0), _grading("23/cute", 1, 112.0, vcsw=1.0),
                               _grading("28/cute", 0, 82.0), _grading("probe/sync", 0, 70.0, sync=30.0)]),
                _proc(2, "b", [_grading("23/cute", 0, 95.0)])]}


def test_table_separates_processes_from_gradings(hs):
    rows = {(r.kernel, r.arm): r for r in hs.table(_res())}
    r = rows[("23/cute", "a")]
    meds = [100.0, 102.0, 110.0, 112.0]
    m = statistics.fmean(meds)
    assert (r.n, r.processes, r.mean_us) == (4, 2, m)
    assert r.sd_pct == pytest.approx(100 * statistics.stdev(meds) / m)
    assert r.tau_pct == pytest.approx(r.sd_pct)  # every call equal: no within-grading noise, all of it between
    assert r.se_within_pct == 0.0
    assert r.sd_process_pct == pytest.approx(100 * statistics.stdev([101.0, 111.0]) / m)
    assert r.sd_reps_pct == pytest.approx(100 * math.sqrt(2.0) / m)  # variance of (100, 102) and of (110, 112): 2
    assert r.vcsw_per_call == 0.5 and r.host_us == 150.0 and (r.min_us, r.max_us) == (100.0, 112.0)
    assert rows[("28/cute", "a")].sd_pct == 0.0
    assert rows[("probe/sync", "a")].sync_us == 25.0 and r.sync_us is None
    one = rows[("23/cute", "b")]  # one grading: spreads are undefined, not zero
    assert one.n == 1 and math.isnan(one.sd_pct) and math.isnan(one.tau_pct) and math.isnan(one.sd_reps_pct)
    assert [k for k, _ in rows][:2] == ["23/cute", "23/cute"] and list(rows)[-1][0] == "28/cute"  # the run's order


def test_summary_prints_processes_and_rows(hs, tmp_path, capsys):
    lines = []
    rows = hs.summarise(_res(), say=lines.append)
    text = "\n".join(lines)
    assert len(rows) == 4
    assert "process 1 arm a (label a): context spin (0x1, set spin), affinity 0-3, ran on CPUs 3" in text
    assert "skipped arms: {'d': 'unknown'}" in text
    p = tmp_path / "hostsync.json"
    p.write_text(json.dumps(_res()))
    assert hs.main(["--summary", str(p)]) == 0
    assert "23/cute     a    4   2" in capsys.readouterr().out
    (tmp_path / "torn.json").write_text('{"processes": [')
    assert hs.main(["--summary", str(tmp_path / "torn.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read") and "hint:" in err


# ---------------------------------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
def test_tiny_run_sets_the_flags_and_times_the_probe(hs, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/host_sync_levels.py"), "--gpu", "--out", str(tmp_path),
                        "--arms", "a", "b", "c", "--processes", "3", "--kernels", "probe/sync", "23/eager",
                        "--reps", "1", "--n", "5", "--warm", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "hostsync.json").read_text())
    assert (tmp_path / "hostsync.log").stat().st_size > 0
    by_arm = {p["arm"]: p for p in res["processes"]}
    assert set(by_arm) == {"a", "b", "c"} and not res["errors"]
    assert by_arm["b"]["ctx_after_torch"]["sched"] == "spin" and by_arm["b"]["ctx_after_torch"]["active"]
    assert by_arm["c"]["ctx_after_torch"]["sched"] == "blocking_sync"
    assert not by_arm["b"]["ctx_before"]["active"]  # set before torch made the context
    for p in res["processes"]:
        assert {g["kernel"] for g in p["gradings"]} == {"probe/sync", "23/eager"}
        for g in p["gradings"]:
            assert len(g["times_us"]) == 5 and len(g["host_us"]) == 5 and g["hold_us"] is not None
            if g["kernel"] == "probe/sync":
                assert len(g["sync_us"]) == 5 and 0 < g["sync_us_median"] < g["median_us"]
