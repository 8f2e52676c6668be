"""A CPU-only stand-in DSL for grader tests: kernels are plain torch, so the grader's process, protocol and
runtime guards can be exercised without a GPU or a DSL package. Never registered outside tests."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from mkb.dsl._backend import CompileResult, StaticFinding
from mkb.dsl._common import load_kernel
from mkb.dsl._static import check_source

TORCH_BASELINE_28 = '''import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
'''

TORCH_BASELINE_25 = '''import torch


def solve(key_caches, value_caches, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    key_caches[:, dst] = key_caches[:, src]
    value_caches[:, dst] = value_caches[:, src]
    return key_caches, value_caches
'''

TORCH_BASELINE_25_SWAP = '''import torch


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    dst_k[dst] = src_k[src]
    dst_v[dst] = src_v[src]
    return dst_k, dst_v
'''


def torch_baseline_25() -> str:
    """The fake baseline of problem 25 as the committed problem defines it (in-place copy_blocks, or swap_blocks
    into separate destinations once it follows upstream)."""
    from mkb.grader._problems import load_problem

    inputs = tuple(load_problem(25).META.inputs)
    return TORCH_BASELINE_25 if inputs == ("key_caches", "value_caches", "block_mapping") else TORCH_BASELINE_25_SWAP


class FakeBackend:
    name = "fake"
    display_name = "Fake (torch on CPU, tests only)"

    def version(self) -> str:
        return "fake==0"

    def environment(self, gpu_arch: str) -> dict[str, str]:
        return {}

    def private_environment(self, scratch: Path) -> dict[str, str]:
        return {"MKB_FAKE_DSL_CACHE": str(Path(scratch) / "fake_cache")}

    @property
    def import_modules(self) -> tuple[str, ...]:
        return ("torch",)

    def load(self, path: Path) -> ModuleType:
        return load_kernel(Path(path), dsl=self.name)

    def static_rules(self, source: str) -> tuple[StaticFinding, ...]:
        return check_source(source)

    def check_compile(self, path: Path, problem: int) -> CompileResult:
        return CompileResult(True)

    def kernel_name_patterns(self, module: ModuleType) -> tuple[str, ...]:
        return (r"^fake_kernel$",)

    def prompt_section(self) -> str:
        return ""

    def doc_pack(self) -> Path | None:
        return None

    def doc_pack_version(self) -> str:
        return "0"


class FakeBackendNoStatic(FakeBackend):
    """The fake DSL without static rules: tests of the runtime guards must not depend on which forms the
    (separately tested, still growing) static rules happen to catch."""

    name = "fake_rt"

    def static_rules(self, source: str) -> tuple[StaticFinding, ...]:
        return ()


class FakeBackendBrokenToolchain(FakeBackend):
    """A DSL whose toolchain module is missing on this host: the worker cannot start."""

    @property
    def import_modules(self) -> tuple[str, ...]:
        return ("mkb_no_such_toolchain_module",)
