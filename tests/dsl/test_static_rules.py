"""Static rules: every rule fires on a forbidden use (also through aliases) and stays quiet on ordinary code."""

from __future__ import annotations

import pytest

from mkb.dsl import get_backend
from mkb.dsl._static import RULES, check_source

SOLVE = "\ndef solve(*inputs):\n    return inputs[0]\n"


def rules_of(src: str, dsl: str = "cute") -> set[str]:
    return {f.rule for f in get_backend(dsl).static_rules(src + SOLVE)}


POSITIVE = [
    ("torch_compile", "import torch\nf = torch.compile(lambda x: x)"),
    ("torch_compile", "import torch as t\n@t.jit.script\ndef g(x): return x"),
    ("torch_compile", "from torch import compile as c\nc(None)"),
    ("torch_compile", "import torch._dynamo"),
    ("triton", "import triton.language as tl"),
    ("triton", "from triton import jit"),
    ("raw_cuda", "from torch.utils.cpp_extension import load_inline"),
    ("raw_cuda", "import torch\ntorch.cuda.jiterator._create_jit_fn('x')"),
    ("raw_cuda", "import torch\nk = torch.cuda._compile_kernel('extern \"C\" __global__ void k(){}', 'k')"),
    ("raw_cuda", "from torch.cuda import _compile_kernel\n_compile_kernel('', 'k')"),
    ("raw_cuda", "import cupy\nk = cupy.RawKernel('', 'k')"),
    ("raw_cuda", "import numba.cuda"),
    ("raw_cuda", "from cuda.bindings import nvrtc"),
    ("raw_cuda", "from cuda.bindings import driver\ndriver.cuModuleLoadData(b'')"),
    ("raw_cuda", "import cutlass.cute as cute\ncute.runtime.load_module('k.o')"),
    ("ctypes", "import ctypes"),
    ("ctypes", "from cffi import FFI"),
    ("subprocess", "import subprocess"),
    ("subprocess", "import os\nos.system('ls')"),
    ("subprocess", "import os\nos.execv('/bin/sh', [])"),
    ("subprocess", "from multiprocessing import Pool"),
    ("subprocess", "import signal"),
    ("threads", "import threading"),
    ("threads", "from concurrent.futures import ThreadPoolExecutor"),
    ("threads", "import asyncio"),
    ("cuda_graph", "import torch\ng = torch.cuda.CUDAGraph()"),
    ("cuda_graph", "import torch\nwith torch.cuda.graph(None): pass"),
    ("cuda_graph", "import torch\nf = torch.cuda.make_graphed_callables"),
    ("cuda_graph", "from cuda.bindings import driver\ndriver.cuStreamBeginCapture(0, 0)"),
    ("dsl_library", "import quack"),
    ("dsl_library", "from flashinfer import rmsnorm"),
    ("dsl_library", "from cutlass.examples import x"),
    ("harness_import", "from problem import reference"),
    ("harness_import", "import mkb.grader"),
    ("harness_import", "from mkb.measure import timer"),
    ("harness_import", "from somewhere import make_inputs"),
    ("harness_import", "from . import problem"),
    ("introspection", "import sys\nf = sys._getframe(1)"),
    ("introspection", "import inspect\ninspect.stack()"),
    ("introspection", "import gc\ngc.get_objects()"),
    ("introspection", "import torch\nwatched = torch.autograd.profiler._is_profiler_enabled"),
    ("introspection", "import torch\nwatched = torch._C._autograd._profiler_enabled()"),
    ("introspection", "from torch.utils._python_dispatch import _get_current_dispatch_mode"),
    ("introspection", "import torch.profiler as tp\nx = tp.profile"),
    ("introspection", "import sys\nm = sys.modules['x']"),
    ("environ_write", "import os\nos.environ['X'] = '1'"),
    ("environ_write", "import os\nos.environ.update(X='1')"),
    ("environ_write", "import os\nos.putenv('X', '1')"),
    ("environ_write", "import os\ne = os.environ\ne.setdefault('X', '1')"),
    ("numerics_flag", "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True"),
    ("numerics_flag", "from torch.backends import cudnn\ncudnn.allow_tf32 = False"),
    ("numerics_flag", "import torch\ntorch.set_float32_matmul_precision('high')"),
    ("numerics_flag", "import torch\ntorch.use_deterministic_algorithms(True)"),
    ("numerics_flag", "import torch\nsetattr(torch.backends.cudnn, 'benchmark', True)"),
    ("monkeypatch", "import torch\ntorch.allclose = lambda *a, **k: True"),
    ("monkeypatch", "import time\ntime.perf_counter = lambda: 0.0"),
    # an aten operator's implementation replaced for every caller, the grader's comparisons included (found in review:
    # `aten::max` faked this way passed a wrong output through the full comparison rules on the CPU)
    ("monkeypatch", "import torch\n_l = torch.library.Library('aten', 'IMPL')\n_l.impl('max', lambda x: x, 'CPU')"),
    ("monkeypatch", "from torch.library import Library\nLibrary('aten', 'IMPL')"),
    ("monkeypatch", "from torch import library\nlibrary.impl('aten::aminmax', 'CUDA')"),
    ("monkeypatch", "import torch.library as tl"),
    ("monkeypatch", "import torch\ntorch.ops.aten.max.default.py_impl(torch._C.DispatchKey.CUDA)(print)"),
    ("monkeypatch", "import torch\nop = {'o': torch.ops.aten.equal.default}['o']\nop.py_impl(1)(print)"),
    ("monkeypatch", "import torch\nlib = torch._C._dispatch_library('IMPL', 'aten', '')"),
    ("monkeypatch", "from torch._ops import OpOverload"),
    ("obfuscation", "m = __import__('os')"),
    ("obfuscation", "import importlib\nimportlib.import_module('os')"),
    ("obfuscation", "eval('1')"),
    ("obfuscation", "exec('x = 1')"),
    ("obfuscation", "import torch\nname = 'comp' + 'ile'\ngetattr(torch, name)"),
    ("obfuscation", "x = (1).__class__.__subclasses__()"),
    ("obfuscation", "def f(): pass\ng = f.__globals__"),
    ("process_exit", "import sys\nsys.exit(0)"),
    ("process_exit", "import os\nos._exit(0)"),
    ("process_exit", "exit()"),
]


@pytest.mark.parametrize(("rule", "src"), POSITIVE)
def test_forbidden_use_is_reported_with_its_rule(rule: str, src: str) -> None:
    assert rule in rules_of(src), rules_of(src)


def test_every_rule_has_a_positive_case() -> None:
    covered = {r for r, _ in POSITIVE} | {"no_solve", "syntax_error", "other_dsl"}
    assert covered == set(RULES)


NEGATIVE = [
    "import torch\nx = torch.empty(3)\ny = torch.cuda.current_stream()",
    "import torch\nflag = torch.backends.cuda.matmul.allow_tf32",  # reading a flag is fine
    "import os\nv = os.environ.get('CUDA_PATH')",  # reading the environment is fine
    "import math, operator\nfrom functools import reduce",
    "import cutlass\nimport cutlass.cute as cute\nf = cute.compile",  # cute.compile is not torch.compile
    "def compile_kernel():\n    return 1",
    "problem = 3\nx = problem + 1",  # a local name that merely looks like a forbidden module
    "import torch\ns = 'torch.compile and subprocess in a string'",
    "# import triton in a comment\nx = 1",
    "class K:\n    def __call__(self, x):\n        return x",
    "import torch\nshape = getattr(torch.Tensor, 'shape')",
    "import torch\ny = torch.ops.aten.add(torch.empty(2), 1)",  # calling an operator is fine; registering one is not
]


@pytest.mark.parametrize("src", NEGATIVE)
def test_ordinary_code_is_clean(src: str) -> None:
    assert rules_of(src) == set()


def test_missing_solve_is_reported() -> None:
    assert [f.rule for f in check_source("x = 1\n")] == ["no_solve"]
    assert check_source("solve = lambda *a: a\n") == ()


def test_syntax_error_is_reported_with_its_line() -> None:
    (f,) = check_source("def solve(:\n")
    assert f.rule == "syntax_error" and f.line == 1


def test_findings_carry_line_numbers() -> None:
    src = "import torch\n\nf = torch.compile\n" + SOLVE
    (f,) = get_backend("cute").static_rules(src)
    assert f.line == 3 and "torch.compile" in f.message


def test_other_dsl_is_forbidden_in_each_variant() -> None:
    assert "other_dsl" in rules_of("import tvm", "cute")
    assert "other_dsl" in rules_of("from tvm.script import tirx as Tx", "cute")
    assert "other_dsl" in rules_of("import cutlass.cute as cute", "tirx")
    assert "other_dsl" in rules_of("from tvm import s_tir", "tirx")
    assert "other_dsl" in rules_of("import tvm_tirx", "tirx")
    assert rules_of("import tvm\nfrom tvm.script import tirx as Tx", "tirx") == set()
    assert rules_of("import cutlass\nimport cutlass.cute as cute", "cute") == set()


def test_tirx_raw_cuda_injection_is_forbidden() -> None:
    src = "from tvm.script import tirx as Tx\nx = Tx.cuda.func_call('f', 1, source_code='__device__ float f(){}')"
    assert "raw_cuda" in rules_of(src, "tirx")
    assert rules_of("from tvm.script import tirx as Tx\nx = Tx.cuda.func_call('f', 1)", "tirx") == set()


def test_dsl_library_kernels_are_forbidden_in_tirx() -> None:
    assert "dsl_library" in rules_of("from tvm import topi", "tirx")
    assert "dsl_library" in rules_of("import tvm.contrib.cublas", "tirx")
    assert "dsl_library" in rules_of("from tvm import relax", "tirx")


REEXPORT_AND_CONTAINER = [
    ("threads", "import logging\nlogging.threading.Thread(target=print).start()"),
    ("process_exit", "import logging\nlogging.os._exit(0)"),
    ("environ_write", "import logging\nlogging.os.environ['X'] = '1'"),
    ("obfuscation", "import logging\nlogging.os.write(1, b'x')"),
    ("obfuscation", "from logging import os as o\no.write(1, b'x')"),
    ("subprocess", "import shutil\nshutil.subprocess.run(['ls'])"),
    ("ctypes", "import uuid\nuuid.ctypes.CDLL(None)"),
    ("introspection", "import logging\nm = logging.sys.modules"),
    ("obfuscation", "import torch\n_t = [torch][0]"),
    ("monkeypatch", "import torch\n_t = {'a': torch}['a']\n_t.allclose = None"),
    ("numerics_flag", "import torch\nm = (torch.backends,)\nm[0].cuda.matmul.allow_tf32 = True"),
    ("numerics_flag", "import torch\nm = [1, torch]\nm[-1].set_float32_matmul_precision('medium')"),
    ("obfuscation", "import os\nmods = [os]"),
    ("obfuscation", "import torch\nsetattr([torch][0], 'allclose', None)"),
    ("obfuscation", "import torch\nd = vars(torch)"),
    ("obfuscation", "import torch\nd = torch.__dict__"),
    ("monkeypatch", "import torch\nsetattr(torch, 'allclose', None)"),
]


@pytest.mark.parametrize(("rule", "src"), REEXPORT_AND_CONTAINER)
def test_modules_reached_through_other_objects_or_containers_are_caught(rule: str, src: str) -> None:
    assert rule in rules_of(src), rules_of(src)


@pytest.mark.parametrize(
    "src",
    [
        "import torch\ndtypes = (torch.float16, torch.bfloat16)\nd = dtypes[0]",
        "import torch\nfs = [torch.add, torch.mul]\ny = fs[0](torch.ones(1), 1)",
        "sizes = {'a': 64, 'b': 128}\nn = sizes['a']\nt = (64, 128)[1]",
        "import os\np = os.path.join('a', 'b')",
        "import logging\nlog = logging.getLogger('k')",
    ],
)
def test_containers_of_ordinary_values_stay_clean(src: str) -> None:
    assert rules_of(src) == set()


def test_the_eight_baselines_stay_clean() -> None:
    from mkb._resources import data_dir

    paths = sorted(data_dir("problems").glob("*/*/cute.py")) + sorted(data_dir("problems").glob("*/*/tirx.py"))
    assert len(paths) >= 8
    for p in paths:
        assert get_backend(p.stem).static_rules(p.read_text()) == (), p
