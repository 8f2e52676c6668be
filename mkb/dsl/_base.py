"""What every DSL backend does the same way: version, loading, static rules, the CPU check, doc pack, launch floor.

A backend subclasses `BackendBase` and supplies only what is its own (environment, import list,
how its kernels are named, its rule set, docs folder and empty kernel), so a third DSL is one small module.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Callable

from mkb.dsl import _common
from mkb.dsl._backend import CompileResult, StaticFinding
from mkb.dsl._static import RuleSet, check_source


class BackendBase:
    """The shared half of a `DslBackend`; subclasses set the class attributes and the DSL-specific methods."""

    name: str
    display_name: str
    dist: str  # the distribution whose version names the DSL version
    docs: Path  # the doc pack folder: PROMPT.md (the prompt section) and reference notes
    rules: RuleSet
    # top-level packages whose exceptions mean "the DSL's compiler refused the kernel"
    compiler_modules: tuple[str, ...] = ()

    def environment(self, gpu_arch: str) -> dict[str, str]:  # pragma: no cover - each backend has its own
        raise NotImplementedError

    def private_environment(self, scratch: Path) -> dict[str, str]:
        """No files of its own beyond the temporary ones (TMPDIR, which the worker points at `scratch` itself)."""
        return {}

    def _empty_kernel(self) -> Callable[[], None]:  # pragma: no cover - each backend has its own
        raise NotImplementedError

    def compile_only_patches(self) -> dict:  # pragma: no cover - each backend has its own
        raise NotImplementedError

    # device code made ahead, outside the GPU (mkb.grader._precompile): a backend whose compile is mostly a step that
    # needs no GPU sets this and the three hooks; the others keep compiling in the worker
    precompiles = False

    def record_device_code(self) -> list[str]:
        raise NotImplementedError(f"{self.name} makes no device code ahead")

    def build_device_code(self, sources: list[str], folder: Path, *, gpu_arch: str) -> list[str]:
        raise NotImplementedError(f"{self.name} makes no device code ahead")

    def use_device_code(self, folder: Path) -> dict:
        raise NotImplementedError(f"{self.name} makes no device code ahead")

    @property
    def baseline_file(self) -> str:
        return f"{self.name}.py"

    def is_compile_error(self, exc: BaseException) -> bool:
        mod = (type(exc).__module__ or "").split(".")[0]
        return mod in self.compiler_modules or "ompil" in type(exc).__name__

    def version(self) -> str:
        return f"{self.dist}=={_common.package_version(self.dist)}"

    def load(self, path: Path) -> ModuleType:
        return _common.load_kernel(Path(path), dsl=self.name)

    def static_rules(self, source: str) -> tuple[StaticFinding, ...]:
        return check_source(source, rules=self.rules)

    def check_compile(self, path: Path, problem: int, *, gpu_arch: str = "sm_90a") -> CompileResult:
        return _common.run_check(self.name, Path(path), problem, self.environment(gpu_arch))

    def prompt_section(self) -> str:
        return (self.docs / "PROMPT.md").read_text()

    def doc_pack(self) -> Path | None:
        return self.docs

    def doc_pack_version(self) -> str:
        return _common.folder_sha256(self.docs)

    def empty_kernel(self) -> Callable[[], None]:
        return self._empty_kernel()

    def check_empty_kernel(self, *, gpu_arch: str = "sm_90a") -> CompileResult:
        """Compile `empty_kernel()` on the CPU in the compile-only check process (nothing launched)."""
        return _common.run_empty_kernel_check(self.name, self.environment(gpu_arch))
