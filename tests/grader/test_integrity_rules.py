"""Issue 9's rules as pure logic on the CPU: host-compute and allowlist bounds on a profiled call's trace, the
write check, the early stop, whose fault a dead worker is, the GPU table, and upstream's baseline timing."""

from __future__ import annotations

import pytest
import torch

from mkb.grader._provenance import MAX_COPIED_FRACTION, CopyWatch, copy_share
from mkb.grader._trace import SOLVE_RANGE, CallLimits, CallTrace, Launch, call_figures, call_trace, classify
from mkb.grader._verdict import StageResult, TimingFigures, Verdict, exit_failure, missing_stages_reason, timing_decided
from mkb.measure import (
    CHECKED_ARCHS, UPSTREAM_POLICY, UnsupportedGpu, arch_of, gpu_peaks, identify_gpu, reference_numerics, time_upstream,
)
from mkb.measure._device import parse_query
from mkb.reasons import Reason, stage_of
from mkb.scoring import s_score, s_upstream

PAT = (r"^kernel_cutlass_rms_",)


def _ev(cat, name, ts, dur=1.0, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def _trace(*events):
    return {"traceEvents": list(events)}


# ---------------- the trace: host syncs inside the solve range, device-to-host bytes ----------------

def test_syncs_count_inside_the_solve_range_and_the_harness_sync_does_not():
    t = call_trace(_trace(
        _ev("user_annotation", SOLVE_RANGE, 100, 50),
        _ev("cuda_runtime", "cudaStreamSynchronize", 110),
        _ev("cuda_runtime", "cudaMemcpyAsync", 105),
        _ev("cuda_driver", "cuLaunchKernel", 120),
        _ev("cuda_runtime", "cudaDeviceSynchronize", 200),  # the harness's sync after the call
        _ev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 106, 3.0, stream=7, bytes=4096),
        _ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 107, 3.0, stream=7, bytes=1 << 20),
        _ev("kernel", "kernel_cutlass_rms_0", 121, 10.0, stream=7),
    ))
    assert t.host_syncs == 1
    assert t.d2h_bytes == 4096  # host-to-device bytes are not counted
    assert [l.name for l in t] == ["Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pageable -> Device)", "kernel_cutlass_rms_0"]


def test_without_the_solve_range_every_sync_but_the_final_device_sync_counts():
    t = call_trace(_trace(_ev("cuda_runtime", "cudaStreamSynchronize", 10), _ev("cuda_runtime", "cuStreamSynchronize", 20),
                          _ev("cuda_runtime", "cudaDeviceSynchronize", 30)))
    assert t.host_syncs == 2


def test_limits_come_from_the_structure_inputs():
    lim = CallLimits.for_call(structure_bytes=6144, n_structure=1, n_inputs=3, n_outputs=2)
    assert lim.max_d2h_bytes == 6144 + 4096 and lim.max_host_syncs == 2 and lim.max_allowlisted_launches == 12
    none = CallLimits.for_call(structure_bytes=0, n_structure=0, n_inputs=3, n_outputs=1)
    assert none.max_d2h_bytes == 4096 and none.max_host_syncs == 1


DSL = Launch("kernel_cutlass_rms_kernel_0", 7, "kernel", 100.0)
FILL = Launch("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 7, "kernel", 2.0)
COPY = Launch("void at::native::direct_copy_kernel_cuda", 7, "kernel", 5.0)
LIM = CallLimits.for_call(structure_bytes=0, n_structure=0, n_inputs=3, n_outputs=1)  # 10 allowlisted launches


@pytest.mark.parametrize("trace, reason", [
    (CallTrace((DSL, FILL), 0, 0), None),
    (CallTrace((DSL, Launch("Memcpy DtoH (Device -> Pageable)", 7, "gpu_memcpy", 1.0, 64)), 1, 64), None),  # a scalar read
    (CallTrace((DSL,), 0, 236 * 1024 * 1024), "integrity_host_compute"),  # problem 28's inputs copied off the device
    (CallTrace((DSL,), 2, 64), "integrity_host_compute"),  # two syncs where one is allowed
    (CallTrace((DSL,) + (COPY,) * 10, 0, 0), None),  # ten: the bound
    (CallTrace((DSL,) + (COPY,) * 11, 0, 0), "integrity_allowlist_work"),  # a host loop of copy_
    (CallTrace((Launch(DSL.name, 7, "kernel", 2.0), Launch(COPY.name, 7, "kernel", 300.0)), 0, 0), "integrity_allowlist_work"),
    (CallTrace((Launch(DSL.name, 7, "kernel", 2.0), Launch(FILL.name, 7, "kernel", 15.0)), 0, 0), None),  # under the floor
    (CallTrace((DSL, Launch(COPY.name, 7, "kernel", 99.0)), 0, 0), None),  # less copy time than DSL time
])
def test_classify_with_limits(trace, reason):
    got, msg = classify(trace, PAT, streams={7}, limits=LIM)
    assert got == reason, msg


def test_a_structure_read_within_its_bound_passes_and_one_byte_more_does_not():
    lim = CallLimits.for_call(structure_bytes=6144, n_structure=1, n_inputs=3, n_outputs=2)
    assert classify(CallTrace((DSL,), 1, 6144 + 4096), PAT, streams=None, limits=lim)[0] is None
    assert classify(CallTrace((DSL,), 1, 6144 + 4097), PAT, streams=None, limits=lim)[0] == "integrity_host_compute"


def test_without_limits_classify_keeps_its_old_rules():
    assert classify([DSL] + [COPY] * 40, PAT, streams={7})[0] is None
    assert classify(CallTrace((FILL,), 0, 0), PAT, streams={7}, limits=LIM)[0] == "integrity_no_dsl_kernel"


def test_call_figures_report_the_margins():
    f = call_figures(CallTrace((DSL, COPY, FILL), 1, 64), PAT)
    assert f == {"dsl_device_us": 100.0, "allowlisted_device_us": 7.0, "allowlisted_launches": 2, "host_syncs": 1, "d2h_bytes": 64}


# ---------------- the write check ----------------

def _share(fn, inputs, before=None):
    w = CopyWatch(inputs)
    with w:
        outs = fn()
    return copy_share(outs, w.writes, before=before)


def test_an_output_assembled_from_input_copies_is_copied_work():
    x = torch.randn(64, 32)

    def hack():
        y = torch.empty_like(x)
        for i in range(64):
            y[i].copy_(x[i])
        torch.zeros(1).add_(1)  # the "DSL kernel" on scratch
        return [y]

    s = _share(hack, [x])
    assert s.fraction == 1.0 and s.too_much and s.reason == "integrity_allowlist_work"


def test_a_copy_through_scratch_is_still_input_data():
    x = torch.randn(16, 8)

    def chain():
        t = x.clone()
        y = torch.empty_like(x)
        y.copy_(t)
        return [y]

    assert _share(chain, [x]).too_much


@pytest.mark.parametrize("name, fn", [
    ("computed", lambda x: [x * 2]),
    ("cast of a computed result", lambda x: [(x * 2).double().to(torch.float32)]),
    ("copy then rewritten in place", lambda x: [torch.empty_like(x).copy_(x).mul_(3)]),
    ("scratch rewritten before the copy", lambda x: [torch.empty_like(x).copy_(x.clone().mul_(3))]),
])
def test_legitimate_layouts_pass(name, fn):
    x = torch.randn(16, 8)
    s = _share(lambda: fn(x), [x])
    assert s.copied == 0 and not s.too_much, name


def test_the_threshold_is_more_than_half():
    x = torch.randn(10, 8)

    def part(n):
        def f():
            y = x * 2
            y[:n].copy_(x[:n])
            return [y]
        return f

    assert not _share(part(5), [x]).too_much  # exactly half: allowed
    assert _share(part(6), [x]).too_much
    assert MAX_COPIED_FRACTION == 0.5


def test_a_mutated_output_counts_only_what_the_call_changed():
    cache = torch.randint(0, 255, (10, 16), dtype=torch.uint8)
    before = {0: cache.clone()}

    def hack():
        for s, d in [(0, 5), (1, 6)]:
            cache[d].copy_(cache[s])
        return [cache]

    s = _share(hack, [cache], before)
    assert s.produced == int((before[0][5:7] != before[0][0:2]).sum()) and s.too_much

    cache2 = torch.randint(0, 255, (10, 16), dtype=torch.uint8)
    before2 = {0: cache2.clone()}

    def indexed():  # index_put_ (what a torch baseline does) is not a copy op
        cache2[torch.tensor([5, 6])] = cache2[torch.tensor([0, 1])]
        return [cache2]

    assert _share(indexed, [cache2], before2).copied == 0


def test_copies_of_the_same_bits_by_the_dsl_after_a_freed_temporary_do_not_count():
    x = torch.randn(32, 8)

    def f():
        t = x.clone()  # recorded, kept alive by the watch: its address cannot be handed to the output
        del t
        return [x * 1.0]

    assert _share(f, [x]).copied == 0


# ---------------- early stop ----------------

def test_timing_stops_once_no_positive_threshold_can_be_reached():
    slow = [1000.0] * 51  # eager 100 us: 0.1x
    assert timing_decided(slow, n_planned=100, eager_median_us=100.0)
    assert not timing_decided(slow[:50], n_planned=100, eager_median_us=100.0)  # half or fewer: undecided
    assert not timing_decided([1000.0] * 40, n_planned=60, eager_median_us=100.0)  # below the 50-call minimum
    assert timing_decided([1000.0] * 50, n_planned=60, eager_median_us=100.0)


def test_a_kernel_that_may_still_reach_a_threshold_keeps_every_call():
    assert not timing_decided([150.0] * 99, n_planned=100, eager_median_us=100.0)  # 0.67x: R@0.5 reached
    assert not timing_decided([10.0] * 99, n_planned=100, eager_median_us=100.0)  # 10x: never stops early
    # 0.5x exactly with the optimistic median: R@0.5 could still be reached
    assert not timing_decided([200.0] * 51, n_planned=100, eager_median_us=100.0)
    # a few fast calls make the optimistic median reach the threshold
    assert not timing_decided([150.0] * 3 + [1000.0] * 48, n_planned=100, eager_median_us=100.0)


# ---------------- whose fault a dead worker is ----------------

def test_a_worker_that_dies_after_the_import_is_the_candidates():
    assert exit_failure(phase="setup", exit_status=-9)[0] == "infra_error"
    assert exit_failure(phase="compile", exit_status=-9)[0] == "crash"
    assert exit_failure(phase="run", exit_status=-11)[0] == "crash"
    assert exit_failure(phase="run", exit_status=0)[0] == "integrity_exit"
    assert missing_stages_reason("setup") == "infra_error" and missing_stages_reason("run") == "crash"
    from mkb.grader._verdict import timeout_failure

    assert [timeout_failure(p) for p in ("setup", "compile", "run")] == ["infra_error", "compile_timeout", "timeout"]


def test_new_reason_codes_have_their_stage():
    assert stage_of(Reason.INTEGRITY_HOST_COMPUTE) == "integrity"
    assert stage_of(Reason.INTEGRITY_ALLOWLIST_WORK) == "integrity"
    assert stage_of(Reason.UNSUPPORTED_GPU) == "compile"


# ---------------- GPU table ----------------

@pytest.mark.parametrize("name, cap, model, arch", [
    ("NVIDIA H200", (9, 0), "H200", "sm_90a"),
    ("NVIDIA H100 80GB HBM3", (9, 0), "H100", "sm_90a"),
    ("NVIDIA B200", (10, 0), "B200", "sm_100a"),
    ("NVIDIA GB200", (10, 0), "GB200", "sm_100a"),
    ("NVIDIA B300 SXM6 AC", (10, 3), "B300", "sm_103a"),
])
def test_every_listed_gpu_is_identified_with_its_peaks(name, cap, model, arch):
    m = identify_gpu(name, cap, allow_unchecked=True)
    assert (m.model, m.arch) == (model, arch) and arch_of(cap) == arch
    assert gpu_peaks(name).model == model


def test_unchecked_unknown_or_inconsistent_gpus_are_refused_in_one_line_with_a_hint():
    assert "sm_90a" in CHECKED_ARCHS
    for name, cap, words in [("NVIDIA B200", (10, 0), "not been checked"), ("NVIDIA A100-SXM4-80GB", (8, 0), "not one mkb grades on"),
                             ("NVIDIA H200", (10, 0), "compute capability")]:
        with pytest.raises(UnsupportedGpu) as e:
            identify_gpu(name, cap)
        first, hint = str(e.value).split("\n")
        assert words in first and hint.startswith("hint:")


def test_nvidia_smi_answer_is_parsed():
    assert parse_query("NVIDIA H200, 9.0\n") == ("NVIDIA H200", (9, 0))
    assert parse_query("NVIDIA GB200, 10.0") == ("NVIDIA GB200", (10, 0))
    assert parse_query("") is None and parse_query("NVIDIA H200, [N/A]") is None


# ---------------- both baselines on every verdict ----------------

def test_timing_figures_give_both_speedups_and_the_verdict_both_scores():
    f = {"median_us": 50.0, "eager_median_us": 100.0, "reference_median_us": 400.0, "n_timed": 51, "n_timed_planned": 100,
         "stopped_early": True, "gpu": "NVIDIA H200", "gpu_model": "H200", "gpu_arch": "sm_90a"}
    tf = StageResult("timing", True, None, f).timing
    assert tf == TimingFigures.from_figures(f)
    assert tf.speedup == 2.0 and tf.speedup_upstream == 8.0 and tf.stopped_early
    assert StageResult("timing", False, "timeout", f).timing is None
    v = Verdict("e", 28, "cute", "sha", True, None, tf.speedup, 100.0, 50.0, "NVIDIA H200", speedup_upstream=tf.speedup_upstream)
    assert v.s == s_score(True, 2.0) == 80.0 and v.s_upstream == s_upstream(True, 8.0) == 100.0
    assert v.as_dict()["s_upstream"] == 100.0
    assert s_upstream(False, 8.0) == 0.0 and s_upstream(True, None) == 0.0


def test_upstream_timing_counts_calls_restores_numerics_and_respects_its_budget():
    before = (torch.get_float32_matmul_precision(), torch.get_default_dtype(), torch.backends.cudnn.allow_tf32)
    seen = []

    def fn(a):
        seen.append(torch.get_float32_matmul_precision())
        return a * 2

    t = time_upstream(fn, lambda i: (torch.full((4,), float(i)),), warmup=2, timed=5, device="cpu")
    assert (t.n_warmup, t.n_timed, t.policy, t.l2_flushed) == (2, 5, UPSTREAM_POLICY, False)
    assert set(seen) == {"highest"}
    assert (torch.get_float32_matmul_precision(), torch.get_default_dtype(), torch.backends.cudnn.allow_tf32) == before
    cut = time_upstream(fn, lambda i: (torch.ones(4),), warmup=3, timed=50, device="cpu", budget_s=0.0, min_timed=4)
    assert cut.n_warmup == 0 and cut.n_timed == 4
    with reference_numerics():
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == before[0]


def test_every_stage_reads_back_typed():
    from mkb.grader._verdict import CompileFigures, IntegrityFigures, VerificationFigures

    assert StageResult("compile", True, None, {"compile_s": 1.5, "unknown_key": 1}).typed == CompileFigures(compile_s=1.5)
    assert StageResult("verification", True, None, {"draws": 5}).typed.draws == 5
    assert isinstance(StageResult("verification", True).typed, VerificationFigures)
    assert StageResult("integrity", True, None, {"kernels_seen": ["k"]}).typed == IntegrityFigures(kernels_seen=["k"])
    sent = TimingFigures(median_us=2.0, eager_median_us=4.0, n_timed=100).as_dict()
    assert TimingFigures.from_figures(sent).speedup == 2.0


def test_the_gpu_script_finds_every_baseline_and_reads_the_margins(repo_script):
    g = repo_script("scripts/gpu_grader_run.py")
    from mkb.problems import baselines

    found = baselines()  # the script grades what discovery finds (no list by hand)
    assert found and all(b.path.name == f"{b.dsl}.py" and b.path.parent.name.startswith(f"{b.problem:02d}_") for b in found)
    committed = g.committed_medians(g.DEFAULT_COMPARE)
    assert all(v > 0 for v in committed.values())
    prof = [{"allowlisted_launches": 1, "allowlisted_device_us": 2.0, "dsl_device_us": 80.0, "host_syncs": 0, "d2h_bytes": 0,
             "limits": {"max_host_syncs": 1}},
            {"allowlisted_launches": 3, "allowlisted_device_us": 1.0, "dsl_device_us": 70.0, "host_syncs": 1, "d2h_bytes": 8}]
    v = Verdict("e", 28, "cute", "sha", True, None, 2.0, 100.0, 50.0, "NVIDIA H200", stages=(
        StageResult("verification", True, None, {"copied_fraction_max": 0.25}), StageResult("integrity", True, None, {"profiled": prof})))
    m = g.margins(v)
    assert m == {"allowlisted_launches": 3, "allowlisted_device_us": 2.0, "dsl_device_us": 70.0, "host_syncs": 1, "d2h_bytes": 8,
                 "limits": {"max_host_syncs": 1}, "copied_fraction_max": 0.25}


def test_the_wait_that_finishes_a_host_to_device_copy_is_not_a_host_read():
    t = call_trace(_trace(
        _ev("user_annotation", SOLVE_RANGE, 100, 50),
        _ev("cuda_runtime", "cudaMemcpyAsync", 101, correlation=1),
        _ev("cuda_runtime", "cudaStreamSynchronize", 102),  # torch.tensor([...], device="cuda")
        _ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 101, 1.0, correlation=1, bytes=16),
        _ev("cuda_runtime", "cudaMemcpyAsync", 110, correlation=2),
        _ev("cuda_runtime", "cudaStreamSynchronize", 111),  # .item(): a read
        _ev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 110, 1.0, correlation=2, bytes=8),
    ))
    assert t.host_syncs == 1 and t.d2h_bytes == 8


def test_without_a_device_the_arch_is_not_guessed(monkeypatch):
    from mkb.measure import _device

    monkeypatch.setattr(_device, "query_gpu", lambda index=0: None)
    monkeypatch.setattr(_device.torch.cuda, "is_available", lambda: False)
    _device.detect_arch.cache_clear()
    try:
        with pytest.raises(UnsupportedGpu, match="no CUDA device"):
            _device.detect_arch()
        monkeypatch.setattr(_device, "query_gpu", lambda index=0: ("NVIDIA B200", (10, 0)))
        _device.detect_arch.cache_clear()
        assert _device.detect_arch() == "sm_100a"
    finally:
        _device.detect_arch.cache_clear()


def test_the_write_check_and_the_verdict_rules_are_watched_by_the_guard():
    import mkb.grader._harness  # noqa: F401 - the harness imports what the guard watches
    from mkb.grader import _provenance, _verdict
    from mkb.grader._guards import Guard

    g = Guard.take("cpu")
    orig = _provenance.copy_share
    _provenance.copy_share = lambda *a, **k: None
    try:
        assert g.check()[0] == "integrity_identity"
    finally:
        _provenance.copy_share = orig
    orig_m = _provenance.CopyWatch.__torch_dispatch__
    _provenance.CopyWatch.__torch_dispatch__ = lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))
    try:
        assert "CopyWatch.__torch_dispatch__" in g.check()[1]
    finally:
        _provenance.CopyWatch.__torch_dispatch__ = orig_m
    orig_t = _verdict.timing_decided
    _verdict.timing_decided = lambda *a, **k: True
    try:
        assert g.check()[0] == "integrity_identity"
    finally:
        _verdict.timing_decided = orig_t
    assert g.check() is None


def test_a_gpu_run_stops_before_any_grading_when_a_dsl_toolchain_is_missing(repo_script, monkeypatch):
    """One line naming the DSL and the import error, before the call's minutes go to recording infra_errors. The real
    registry and lookup: the CPU-only test backends, one of whose toolchain modules is not installed."""
    import os
    import sys
    from pathlib import Path

    import pytest

    from mkb.dsl import _registry
    from mkb.grader._backends import backend_from_target

    here = str(Path(__file__).resolve().parent)
    g = repo_script("scripts/gpu_grader_run.py")
    monkeypatch.setitem(_registry.BACKENDS, "fake", "fake_dsl:FakeBackend")
    monkeypatch.setitem(_registry.BACKENDS, "broken", "fake_dsl:FakeBackendBrokenToolchain")
    monkeypatch.syspath_prepend(here)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    backend_from_target.cache_clear()
    try:
        g.preflight(("fake",))  # its toolchain (torch) imports in a child: no word
        with pytest.raises(SystemExit) as e:
            g.preflight(("fake", "broken"))
    finally:
        backend_from_target.cache_clear()
    msg = str(e.value)
    assert "\n" not in msg and "hint: install the DSL wheels" in msg
    assert "(broken: ModuleNotFoundError: No module named 'mkb_no_such_toolchain_module')" in msg
    assert "fake:" not in msg
