"""Reason codes: the closed vocabulary every grader outcome is reported in.

Pure Python and below `mkb.measure` on purpose: the comparison code (mkb.measure), the grader, the agent
and the read side (mkb.analysis, no torch) all write or read these codes from one definition.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why an evaluation did not pass. `static_<rule>` codes come from `DslBackend.static_rules`."""

    # before running
    STATIC = "static"  # prefix: reported as static_<rule>, e.g. static_forbidden_import
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    IMPORT_ERROR = "import_error"
    NO_SOLVE = "no_solve"
    # running
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASH = "crash"  # the worker died (signal, illegal address, os._exit)
    # correctness
    WRONG_OUTPUT = "wrong_output"
    WRONG_SHAPE = "wrong_shape"  # shape, dtype, device or output count differs
    WRONG_TYPE = "wrong_type"  # not a plain torch.Tensor (lazy subclasses and the like)
    NAN = "nan"  # NaN or Inf where the reference has none
    ALL_ZERO = "all_zero"
    CONSTANT = "constant"
    INPUT_MUTATED = "input_mutated"  # an input not in `mutates` changed
    # integrity
    INTEGRITY_NO_DSL_KERNEL = "integrity_no_dsl_kernel"
    INTEGRITY_NON_DSL_COMPUTE = "integrity_non_dsl_compute"
    INTEGRITY_THREAD = "integrity_thread"  # a thread, or a process (grader 2.15), left running after a call
    INTEGRITY_STREAM = "integrity_stream"
    INTEGRITY_IDENTITY = "integrity_identity"  # a torch callable, timer or harness function was replaced
    INTEGRITY_NUMERICS_FLAG = "integrity_numerics_flag"
    INTEGRITY_ENVIRON = "integrity_environ"
    INTEGRITY_RECHECK = "integrity_recheck"  # a timed call's output did not match on re-check
    INTEGRITY_EXIT = "integrity_exit"  # solve tried to end the process or raised SystemExit
    INTEGRITY_RESULT_CHANNEL = "integrity_result_channel"  # a message on the result channel the harness did not send
    INTEGRITY_PROFILER = "integrity_profiler"  # the profiler could not observe the timed calls (fails closed)
    INTEGRITY_HOST_COMPUTE = "integrity_host_compute"  # a call moved more off the device / synced more than its structure inputs allow
    INTEGRITY_ALLOWLIST_WORK = "integrity_allowlist_work"  # allowlisted copies/fills did the work, not the DSL kernels
    # not the candidate's fault (shown: the worker died before importing the candidate, or the GPU is
    # refused): retried, then excluded and reported. Anything after the import is the candidate's.
    INFRA_ERROR = "infra_error"
    UNSUPPORTED_GPU = "unsupported_gpu"  # a device whose architecture mkb has not been checked on: refused


def static_reason(rule: str) -> str:
    return f"static_{rule}"


# The grader's stages in the order they run; a verdict's reason is the first failing stage's reason.
STAGES: tuple[str, ...] = ("compile", "verification", "timing", "integrity")


def stage_of(reason: str) -> str:
    """The stage that reports `reason` (static_* and import/compile problems belong to compile)."""
    if reason.startswith("static_") or reason in {
        Reason.COMPILE_ERROR, Reason.COMPILE_TIMEOUT, Reason.IMPORT_ERROR, Reason.NO_SOLVE, Reason.UNSUPPORTED_GPU,
    }:
        return "compile"
    if reason.startswith("integrity_") and reason != Reason.INTEGRITY_RECHECK:
        return "integrity"
    if reason == Reason.INTEGRITY_RECHECK:
        return "timing"
    return "verification"


def is_known(reason: str) -> bool:
    """True for every code of the vocabulary, static_<rule> included."""
    return reason.startswith("static_") or reason in {r.value for r in Reason}
