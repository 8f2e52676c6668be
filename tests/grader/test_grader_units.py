"""Pure-function parts of the grader: reason codes, verdict arithmetic, trace classification, guards, wire protocol."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from mkb.grader import STAGES, Reason, StageResult, Verdict, is_known, stage_of, static_reason
from mkb.grader._guards import Guard, Identities
from mkb.grader import _protocol as protocol
from mkb.grader._protocol import LineReader, write_msg
from mkb.grader._trace import Launch, classify, launches_from_trace


def test_reason_codes_are_closed_and_each_belongs_to_a_stage():
    assert is_known("static_threads") and is_known("integrity_result_channel") and not is_known("made_up")
    for r in Reason:
        assert stage_of(r.value) in STAGES
    assert stage_of(static_reason("monkeypatch")) == "compile"
    assert stage_of("integrity_recheck") == "timing" and stage_of("wrong_output") == "verification"


def _verdict(passed, speedup):
    return Verdict("e", 28, "cute", "sha", passed, None if passed else "wrong_output", speedup, 100.0,
                   100.0 / speedup if speedup else None, "H200")


def test_s_is_the_mean_of_the_five_r_at_thresholds():
    assert _verdict(True, 1.5).s == 60.0  # 0, 0.5, 1 pass; 2, 4 fail
    assert _verdict(True, 5.0).s == 100.0
    assert _verdict(False, None).s == 0.0


def test_trace_events_become_launches_with_their_streams():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "kernel_cutlass_rms_kernel_tensor_0", "args": {"stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "args": {"stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty"},
    ]}
    assert launches_from_trace(trace) == [
        Launch("kernel_cutlass_rms_kernel_tensor_0", 7, "kernel"), Launch("Memcpy DtoH (Device -> Pageable)", 7, "gpu_memcpy")]


PAT = (r"^kernel_cutlass_rms_kernel_",)
DSL = Launch("kernel_cutlass_rms_kernel_tensorptr_0", 7, "kernel")
FILL = Launch("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<c10::BFloat16>, at::detail::Array<char*, 1>)", 7, "kernel")
MUL = Launch("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >", 7, "kernel")
RED = Launch("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >", 7, "kernel")


@pytest.mark.parametrize("launches, reason", [
    ([DSL], None),
    ([DSL, FILL, Launch("Memset (Device)", 7, "gpu_memset")], None),
    ([FILL], "integrity_no_dsl_kernel"),
    ([], "integrity_no_dsl_kernel"),
    ([DSL, MUL, RED], "integrity_non_dsl_compute"),
    ([Launch(DSL.name, 23, "kernel")], "integrity_stream"),
    ([Launch("kernel_cutlass_other_fn_0", 7, "kernel")], "integrity_no_dsl_kernel"),
])
def test_profiled_call_classification(launches, reason):
    got, _ = classify(launches, PAT, streams={7})
    assert got == reason


def test_guard_sees_flags_environment_threads_and_rebinding():
    g = Guard.take("cpu")
    assert g.check() is None
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if old != "medium" else "high")
    try:
        assert g.check()[0] == "integrity_numerics_flag"
    finally:
        torch.set_float32_matmul_precision(old)
    os.environ["MKB_TEST_GUARD"] = "1"
    try:
        assert g.check()[0] == "integrity_environ"
    finally:
        del os.environ["MKB_TEST_GUARD"]
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert g.check()[0] == "integrity_thread"
    finally:
        stop.set()
        t.join()
    orig = torch.Tensor.sum
    torch.Tensor.sum = lambda self, *a, **k: orig(self, *a, **k)
    try:
        reason, msg = g.check()
        assert reason == "integrity_identity" and "torch.Tensor.sum" in msg
    finally:
        del torch.Tensor.sum
    assert g.check() is None


def test_identities_ignore_new_names_but_see_rebinding_of_timers():
    ids = Identities.take()
    orig = torch.cuda.Event.elapsed_time
    torch.cuda.Event.elapsed_time = lambda self, end: 0.0
    try:
        assert "torch.cuda.Event.elapsed_time" in ids.changed()
    finally:
        torch.cuda.Event.elapsed_time = orig
    assert ids.changed() == []


def test_line_reader_returns_messages_eof_and_timeouts():
    r, w = os.pipe()
    reader = LineReader(r)
    write_msg(w, {"type": "ready", "x": float("nan")})
    os.write(w, b"not json\n")
    msg = reader.read(time.monotonic() + 5)
    assert msg["type"] == "ready"
    assert reader.read(time.monotonic() + 0.2) == "timeout"
    assert reader.bad_lines == ["not json"]
    os.close(w)
    assert reader.read(time.monotonic() + 5) == "eof"
    os.close(r)


def test_line_reader_a_flood_without_newline_cannot_hold_it_past_the_deadline():
    """A candidate owns the worker's fds: an endless write with no newline must still time out."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    stop = threading.Event()

    def flood():
        junk = b"x" * (1 << 16)
        while not stop.is_set():
            try:
                os.write(w, junk)
            except BlockingIOError:
                time.sleep(0)
            except OSError:
                return

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        reader = LineReader(r)
        t0 = time.monotonic()
        assert reader.read(t0 + 0.5) == "timeout"
        took = time.monotonic() - t0
        assert took < 3.0, f"the reader ran {took:.1f} s past a 0.5 s deadline"
        assert len(reader.buf) <= protocol.LINE_MAX + (1 << 16)
        # a deadline already passed gets one look, then answers
        t0 = time.monotonic()
        assert reader.read(t0 - 1.0) == "timeout"
        assert time.monotonic() - t0 < 1.5
    finally:
        stop.set()
        t.join(5)
        os.close(w)
        os.close(r)


def test_line_reader_drops_an_over_long_line_as_one_bad_line(monkeypatch):
    monkeypatch.setattr(protocol, "LINE_MAX", 1000)
    r, w = os.pipe()
    reader = LineReader(r)
    os.write(w, b"y" * 5000)
    assert reader.read(time.monotonic() + 0.3) == "timeout"
    os.write(w, b"y" * 3000 + b"\n")
    write_msg(w, {"type": "done"})
    assert reader.read(time.monotonic() + 5) == {"type": "done"}
    assert reader.bad_count == 1 and "without a newline" in reader.bad_lines[0]
    for _ in range(protocol.BAD_LINES_KEPT + 5):
        os.write(w, b"junk\n")
    write_msg(w, {"type": "done"})
    assert reader.read(time.monotonic() + 5) == {"type": "done"}
    assert reader.bad_count == protocol.BAD_LINES_KEPT + 6 and len(reader.bad_lines) == protocol.BAD_LINES_KEPT
    os.close(w)
    os.close(r)


def test_stage_results_keep_the_first_failure_as_the_verdict_reason():
    from mkb.grader._grade import _verdict as make

    stages = [StageResult("compile", True), StageResult("verification", True),
              StageResult("timing", False, "integrity_recheck"), ]
    v = make("e", 28, "cute", "sha", stages, None, "", {}, time.monotonic())
    assert v.reason == "integrity_recheck" and not v.passed and v.speedup is None
    v = make("e", 28, "cute", "sha", [StageResult("compile", True)], "crash", "log", {}, time.monotonic())
    assert v.reason == "crash" and v.stages[-1].stage == "verification"


def test_guard_sees_a_new_thread_even_when_it_reuses_an_ended_threads_ident():
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    g = Guard.take("cpu")
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        # the OS may hand the new thread the ended thread's ident; the guard must still see it
        assert g.check(threads=g.threads | {ended})[0] == "integrity_thread"
    finally:
        stop.set()
        t.join()


def test_the_trusted_plan_keeps_secret_seeds_and_expectations_not_input_sets():
    """Full-size input sets reach 12 GB: the plan holds (seed, expectation) pairs and the harness makes a draw's
    inputs again from its seed where it uses them, which gives the values the expectation was computed on."""
    import random

    from mkb.grader import GraderConfig
    from mkb.grader._harness import _Plan
    from mkb.measure import compare
    from mkb.problems import get_problem

    p = get_problem(28)
    make = lambda seed: tuple(p.make_inputs(seed, device="cpu", size="smoke"))  # noqa: E731
    seeds = iter(range(100, 200))
    plan = _Plan(p.module, GraderConfig.quick(device="cpu"), random.Random(0), make, lambda: next(seeds))
    pairs = list(plan.draws) + list(plan.recheck_sets.values()) + [(plan.final_seed, plan.final_expected)]
    assert all(isinstance(seed, int) for seed, _ in pairs)
    assert len({seed for seed, _ in pairs}) == len(pairs)  # every draw its own secret seed
    for seed, exp in pairs:
        args = make(seed)
        assert compare(exp, p.reference(*args), inputs_after=args, input_names=p.meta.inputs).ok
        other = make(seed + 1000)
        assert not compare(exp, p.reference(*other), inputs_after=other, input_names=p.meta.inputs).ok
