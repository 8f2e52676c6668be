"""Backends without the DSL packages: lazy imports, environment and math policy, kernel-name patterns, prompts, doc packs."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mkb.dsl import DslBackend, dsl_names, get_backend
from mkb.dsl.cute import normalise_arch


def test_registry_lists_both_backends_and_they_satisfy_the_protocol() -> None:
    assert set(dsl_names()) >= {"cute", "tirx"}
    for name in ("cute", "tirx"):
        b = get_backend(name)
        assert isinstance(b, DslBackend) and b.name == name


def test_importing_and_constructing_backends_imports_no_dsl() -> None:
    code = (
        "import sys\nfrom mkb.dsl import get_backend\n"
        "for n in ('cute','tirx'):\n b = get_backend(n); b.environment('sm_90a'); b.version(); b.prompt_section(); b.static_rules('x=1')\n"
        "bad = [m for m in ('cutlass','tvm','tvm_ffi','torch') if m in sys.modules]\nprint(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("given", "expected"), [("sm_90a", "sm_90a"), ("sm_90", "sm_90a"), ("9.0", "sm_90a"), ("H200", "sm_90a"), ("sm_100a", "sm_100a"), ("b200", "sm_100a"), ("sm_80", "sm_80")])
def test_arch_names_normalise(given: str, expected: str) -> None:
    assert normalise_arch(given) == expected


def test_unknown_arch_is_refused_with_a_hint() -> None:
    with pytest.raises(ValueError, match="hint"):
        normalise_arch("gpu")


def test_both_backends_pin_the_same_math_policy() -> None:
    cute, tirx = get_backend("cute").environment("sm_90a"), get_backend("tirx").environment("sm_90a")
    assert cute["MKB_MATH_POLICY"] == tirx["MKB_MATH_POLICY"]
    assert cute["CUTE_DSL_ARCH"] == "sm_90a" and tirx["MKB_GPU_ARCH"] == "sm_90a"
    # TIRx: fast math off in the nvcc path that is used, and undone as far as possible in NVRTC
    assert tirx["TVM_CUDA_COMPILE_MODE"] == "nvcc" and tirx["TVM_CUDA_NVCC_NO_FAST_MATH"] == "1"
    assert "--ftz=false" in tirx["TVM_CUDA_NVRTC_EXTRA_OPTS"]
    assert tirx["PATH"].split(":")[0] == tirx["CUDA_PATH"] + "/bin"
    assert "fast" in get_backend("cute").prompt_section().lower() and "fast" in get_backend("tirx").prompt_section().lower()


def _module_from(tmp_path: Path, src: str) -> types.ModuleType:
    path = tmp_path / "kernel.py"
    path.write_text(src)
    mod = types.ModuleType("k")
    mod.__file__ = str(path)
    return mod


CUTE_SRC = """
import cutlass.cute as cute
@cute.kernel
def add_kernel(a, b): pass
@cute.jit
def host(a, b): add_kernel(a, b).launch(grid=[1,1,1], block=[32,1,1])
class Gemm:
    @cute.kernel
    def kernel(self, a): pass
def solve(*x): pass
"""


def test_cute_patterns_match_the_candidates_own_kernels_only(tmp_path: Path) -> None:
    pats = get_backend("cute").kernel_name_patterns(_module_from(tmp_path, CUTE_SRC))
    assert len(pats) == 2

    def hit(name: str) -> bool:
        return any(re.search(p, name) for p in pats)

    assert hit("kernel_cutlass_add_kernel_tensorptrf16gmemalign16o4096409640961_0")
    assert hit("kernel_cutlass_kernel_tensorptrbf16gmem_0")
    assert not hit("kernel_cutlass_other_kernel_tensorptr_0")
    assert not hit("void at::native::vectorized_elementwise_kernel<4, add_kernel>")
    assert not hit("add_kernel")


TIRX_SRC = """
from tvm.script import tirx as Tx
@Tx.prim_func
def silu_bias(x: Tx.handle): pass
@Tx.prim_func(private=True)
def helper(x: Tx.handle): pass
def solve(*x): pass
"""


def test_tirx_patterns_match_prim_func_kernels_only(tmp_path: Path) -> None:
    pats = get_backend("tirx").kernel_name_patterns(_module_from(tmp_path, TIRX_SRC))

    def hit(name: str) -> bool:
        return any(re.search(p, name) for p in pats)

    assert hit("silu_bias_kernel") and hit("helper_kernel") and hit("silu_bias_kernel_1")
    assert not hit("my_silu_bias_kernel") and not hit("silu_bias_kernel_x") and not hit("void at::native::silu_kernel")


@pytest.mark.parametrize("name", ["cute", "tirx"])
def test_prompt_section_says_how_to_write_a_kernel(name: str) -> None:
    text = get_backend(name).prompt_section()
    assert "solve(" in text and "stream" in text and "Forbidden" in text and "check" in text
    assert ("cute.compile" in text) if name == "cute" else ("tir_pipeline=\"tirx\"" in text and "Tx.device_entry()" in text)
    assert len(text) < 6000


@pytest.mark.parametrize("name", ["cute", "tirx"])
def test_doc_pack_is_small_and_hashed(name: str, tmp_path: Path) -> None:
    b = get_backend(name)
    pack = b.doc_pack()
    assert pack is not None and pack.is_dir()
    files = [p for p in pack.rglob("*") if p.is_file() and "__pycache__" not in p.parts]  # as the version hash sees it
    examples = [p for p in files if p.relative_to(pack).parts[0] == "examples"]  # worked examples: problem + kernel each
    primer = [p for p in files if p.name != "API.md"]  # API.md is generated from the installed DSL (mkb-run docpack)
    assert 1 <= len(files) - len(examples) <= 10 and len(examples) <= 12
    assert sum(p.stat().st_size for p in primer) < 40_000
    assert all(p.stat().st_size < 256_000 for p in files if p.name == "API.md")
    v = b.doc_pack_version()
    assert re.fullmatch(r"[0-9a-f]{64}", v) and v == b.doc_pack_version()


def test_doc_pack_versions_differ_between_dsls() -> None:
    assert get_backend("cute").doc_pack_version() != get_backend("tirx").doc_pack_version()


def test_load_imports_a_file_under_a_unique_name(tmp_path: Path) -> None:
    path = tmp_path / "kernel.py"
    path.write_text("VALUE = 1\ndef solve(*x):\n    return VALUE\n")
    a = get_backend("cute").load(path)
    path.write_text("VALUE = 2\ndef solve(*x):\n    return VALUE\n")
    b = get_backend("tirx").load(path)
    assert a.__name__ != b.__name__ and a.solve() == 1 and b.solve() == 2
