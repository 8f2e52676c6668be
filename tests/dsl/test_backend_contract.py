"""The `DslBackend` contract, run over every registered backend: a third DSL passes this file or is not done.

CPU parts need no DSL package (CI); `dsl`-marked parts compile with the DSL on the CPU; `gpu`-marked
parts launch on a GPU.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mkb.dsl import BACKENDS, DslBackend, baseline_file, baseline_files, dsl_names, get_backend, is_compile_error
from mkb.problems import baselines, discover

ROOT = Path(__file__).resolve().parents[2]
NAMES = dsl_names()


@pytest.fixture(params=NAMES)
def backend(request) -> DslBackend:
    return get_backend(request.param)


def test_every_registered_backend_satisfies_the_protocol_under_its_registry_name(backend) -> None:
    assert isinstance(backend, DslBackend)
    assert BACKENDS[backend.name] and backend.name in NAMES and backend.display_name


def test_constructing_and_describing_a_backend_imports_no_dsl_package(backend) -> None:
    code = (
        "import json, sys\nbefore = set(sys.modules)\nfrom mkb.dsl import get_backend\n"
        f"b = get_backend({backend.name!r})\n"
        "b.environment('sm_90a'); b.version(); b.prompt_section(); b.static_rules('x = 1'); b.baseline_file\n"
        "b.is_compile_error(ValueError('x')); b.empty_kernel; b.compile_only_patches\n"
        "new = sorted(m.split('.')[0] for m in set(sys.modules) - before)\n"
        "print(json.dumps(sorted(set(new) & {m.split('.')[0] for m in b.import_modules + ('torch',)} - {'mkb'})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_environment_pins_the_shared_math_policy(backend) -> None:
    env = backend.environment("sm_90a")
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    policies = {get_backend(n).environment("sm_90a")["MKB_MATH_POLICY"] for n in NAMES}
    assert env["MKB_MATH_POLICY"] in policies and len(policies) == 1
    assert re.fullmatch(r"[\w.-]+==\S+", backend.version())
    assert backend.import_modules and all(isinstance(m, str) for m in backend.import_modules)


def test_static_rules_pass_plain_code_and_refuse_the_contracts_forbidden_forms(backend) -> None:
    assert backend.static_rules("import torch\n\ndef solve(x):\n    return x\n") == ()
    for src in ("import subprocess\n", "import ctypes\n", "import torch\nf = torch.compile(lambda x: x)\n"):
        assert backend.static_rules(src), src


def test_baseline_files_are_the_registrys_and_name_distinct_files(backend) -> None:
    name = baseline_file(backend.name)
    assert name == backend.baseline_file and name.endswith(".py") and name != "problem.py"
    assert baseline_files()[name] == backend.name
    assert len(baseline_files()) == len(NAMES)
    found = {b.path for b in baselines(dsls=[backend.name])}
    assert found == {p.parent / name for p in discover() if (p.parent / name).is_file()}


def test_compile_errors_are_recognised_by_the_backend_not_by_name_lists_elsewhere(backend) -> None:
    assert not backend.is_compile_error(ValueError("a candidate's own bug"))
    assert not is_compile_error(backend.name, ImportError("no module named x"))
    assert backend.is_compile_error(type("CompilationError", (Exception,), {})("refused"))
    for mod in getattr(backend, "compiler_modules", ()):
        exc = type("DSLError", (RuntimeError,), {"__module__": f"{mod}._internal"})("refused")
        assert backend.is_compile_error(exc) and is_compile_error(backend.name, exc)


def test_prompt_doc_pack_and_load(backend, tmp_path: Path) -> None:
    text = backend.prompt_section()
    assert "solve(" in text and len(text) < 6000
    pack = backend.doc_pack()
    assert pack is None or pack.is_dir()
    assert re.fullmatch(r"[0-9a-f]{64}|\S+", backend.doc_pack_version())
    k = tmp_path / "kernel.py"
    k.write_text("def solve(*x):\n    return 7\n")
    mod = backend.load(k)
    assert mod.solve() == 7 and backend.kernel_name_patterns(mod) == ()


def test_doc_packs_differ_between_backends() -> None:
    versions = [get_backend(n).doc_pack_version() for n in NAMES]
    assert len(set(versions)) == len(versions)


@pytest.mark.dsl
@pytest.mark.slow
def test_empty_kernel_compiles_in_the_compile_only_check(backend) -> None:
    res = backend.check_empty_kernel(gpu_arch="sm_90a")
    assert res.ok, res.messages


@pytest.mark.gpu
def test_empty_kernel_launches_and_is_cached_on_a_gpu(backend) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    code = (f"import os\nfrom mkb.dsl import get_backend\nb = get_backend({backend.name!r})\n"
            "os.environ.update(b.environment('sm_90a'))\nimport torch\nf = b.empty_kernel(); f(); torch.cuda.synchronize()\n"
            "print(b.empty_kernel() is f)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.stdout.strip().endswith("True"), out.stderr[-2000:]
