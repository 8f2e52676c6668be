"""CPU compile checks with the real DSLs (sm_90a, nothing launched): baselines compile, errors come back short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mkb.dsl import get_backend
from mkb.problems import Baseline, baselines

pytestmark = [pytest.mark.dsl]

BASELINES = baselines()  # discovered in the problem folders: a new baseline is checked without editing this file
ANSI = re.compile("\x1b\\[")


@pytest.mark.slow
@pytest.mark.parametrize("baseline", BASELINES, ids=lambda b: f"{b.problem}-{b.dsl}")
def test_baseline_passes_static_rules_and_compiles_for_sm90a(baseline: Baseline) -> None:
    b = get_backend(baseline.dsl)
    assert b.static_rules(baseline.path.read_text()) == ()
    res = b.check_compile(baseline.path, baseline.problem)
    assert res.ok, res.messages
    assert "sm_90a" in res.messages[0]


def _check(tmp_path: Path, dsl: str, src: str, problem: int = 28):
    path = tmp_path / "kernel.py"
    path.write_text(src)
    return get_backend(dsl).check_compile(path, problem)


def _assert_short(res, line: int | None = None) -> None:
    assert not res.ok
    text = "\n".join(res.messages)
    assert not ANSI.search(text), text
    assert len(res.messages) <= 8 and all(len(m) <= 310 for m in res.messages), text
    assert res.messages[0].startswith("kernel.py")
    if line is not None:
        assert res.messages[0].startswith(f"kernel.py:{line}:"), text


CUTE_HEAD = """import cutlass
import cutlass.cute as cute
import torch

@cute.kernel
def bad_kernel(mX: cute.Tensor, mY: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    mY[tidx] = mX[tidx] + undefined_name

@cute.jit
def host(mX: cute.Tensor, mY: cute.Tensor, stream):
    bad_kernel(mX, mY).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

def solve(x, r, w):
    y = torch.empty_like(w)
    f = cute.compile(host, cute.runtime.from_dlpack(w, enable_tvm_ffi=True), cute.runtime.from_dlpack(y, enable_tvm_ffi=True),
                     cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
    f(w, y)
    return y
"""


@pytest.mark.slow
def test_cute_trace_error_names_the_kernel_line_without_ansi(tmp_path: Path) -> None:
    _assert_short(_check(tmp_path, "cute", CUTE_HEAD), line=8)


def test_cute_kernel_from_cpu_dlpack_tensors_compiles(tmp_path: Path) -> None:
    res = _check(tmp_path, "cute", CUTE_HEAD.replace(" + undefined_name", ""))
    assert res.ok, res.messages


def test_solve_that_compiles_nothing_fails_the_check(tmp_path: Path) -> None:
    res = _check(tmp_path, "cute", "import torch\nimport cutlass.cute as cute\ndef solve(x, r, w):\n    return x + r\n")
    assert not res.ok and "compiled no cute kernel" in res.messages[0]


def test_import_error_is_reported_with_its_line(tmp_path: Path) -> None:
    res = _check(tmp_path, "tirx", "import torch\n\nraise RuntimeError('boom at import')\ndef solve(*a):\n    pass\n")
    _assert_short(res, line=3)
    assert "boom at import" in res.messages[0]


TIRX_OK = """import torch
import tvm
from tvm.script import tirx as Tx

@Tx.prim_func
def scale(x_ptr: Tx.handle, y_ptr: Tx.handle):
    N = Tx.int32()
    X = Tx.match_buffer(x_ptr, (N,), "bfloat16")
    Y = Tx.match_buffer(y_ptr, (N,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(N, 128)])
    tx = Tx.thread_id([128])
    if bx * 128 + tx < N:
        Y[bx * 128 + tx] = Tx.Cast("bfloat16", Tx.Cast("float32", X[bx * 128 + tx]) * Tx.float32(2))

def solve(x, r, w):
    y = torch.empty_like(w)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with target:
        f = tvm.compile(tvm.IRModule({"main": scale}), target=target, tir_pipeline="tirx")
    f(w, y)
    return y
"""


@pytest.mark.slow
def test_tirx_kernel_compiles_to_ptx(tmp_path: Path) -> None:
    res = _check(tmp_path, "tirx", TIRX_OK)
    assert res.ok, res.messages


def test_tirx_parse_error_names_the_kernel_line_without_ansi(tmp_path: Path) -> None:
    src = TIRX_OK.replace("Y[bx * 128 + tx] = ", "Z[bx * 128 + tx] = ")
    _assert_short(_check(tmp_path, "tirx", src), line=14)


HOST_ONLY = """import torch
import tvm
from tvm.script import tirx as Tx

@Tx.prim_func
def scale(x_ptr: Tx.handle, y_ptr: Tx.handle):
    N = Tx.int32()
    X = Tx.match_buffer(x_ptr, (N,), "float32")
    Y = Tx.match_buffer(y_ptr, (N,), "float32")
    for i in range(N):
        Y[i] = X[i] * Tx.float32(2)

def solve(x, r, w):
    y = torch.empty_like(w, dtype=torch.float32)
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}) as target:
        f = tvm.compile(tvm.IRModule({"main": scale}), target=target, tir_pipeline="tirx")
    f(w.float(), y)
    return y
"""


def test_tirx_kernel_without_device_entry_is_rejected(tmp_path: Path) -> None:
    res = _check(tmp_path, "tirx", HOST_ONLY)
    assert not res.ok and any("device" in m for m in res.messages), res.messages


@pytest.mark.slow
def test_tirx_device_compiler_error_is_short(tmp_path: Path) -> None:
    # a call of an undefined device function lowers fine and is refused by the device compiler
    src = TIRX_OK.replace("* Tx.float32(2))", "* Tx.call_extern(\"float32\", \"no_such_device_fn\", Tx.float32(2)))")
    res = _check(tmp_path, "tirx", src)
    assert not res.ok
    text = "\n".join(res.messages)
    assert not ANSI.search(text) and len(res.messages) <= 8, text
