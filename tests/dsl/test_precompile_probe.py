"""benchmarks/precompile_probe.py's CPU part: a compile-only step builds what the worker's TVM would ask nvcc for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dsl]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import precompile_probe as pp  # noqa: E402


def test_a_compile_only_step_builds_the_cubin_it_checks_and_the_fatbin_a_worker_asks_for(tmp_path) -> None:
    pytest.importorskip("tvm")
    assert pp.main(["--smoke", "--problems", "28", "--dsl", "tirx", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "precompile_probe.json").read_text())
    (b,) = rec["baselines"]
    (step,) = b["steps"]
    assert (b["problem"], b["dsl"], step["mode"]) == (28, "tirx", "compile_only"), step
    assert [c["format"] for c in step["nvcc_calls"]] == ["cubin", "fatbin"]
    assert not any(c["hit"] for c in step["nvcc_calls"])  # a fresh cache
    assert step["cache_files_after"] - step["cache_files_before"] == 2
    assert 0 < step["nvcc_s"] <= step["compile_s"]


def test_a_second_call_with_the_same_arguments_is_read_back_from_the_cache(tmp_path, monkeypatch) -> None:
    nvcc = pytest.importorskip("tvm.support.nvcc")
    made = []
    monkeypatch.setattr(nvcc, "compile_cuda", lambda code, **kw: made.append(code) or bytearray(code.encode()))
    calls: list[dict] = []
    pp._nvcc_cache(tmp_path, calls)
    assert nvcc.compile_cuda("a", target_format="fatbin", compiler="nvcc") == bytearray(b"a")
    assert nvcc.compile_cuda("a", target_format="fatbin", compiler="nvcc") == bytearray(b"a")
    assert nvcc.compile_cuda("a", target_format="cubin", compiler="nvcc") == bytearray(b"a")  # other arguments: built
    assert made == ["a", "a"] and [c["hit"] for c in calls] == [False, True, False]
