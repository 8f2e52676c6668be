"""The `DslBackend` protocol: everything mkb needs to know about one kernel DSL, in one interface.

Outside `mkb/dsl/` nothing depends on a particular DSL: problems, prompts, grader and agent talk to
a backend through this protocol, and adding a DSL (Triton, CUDA C++, TileLang) is one module that
implements it and registers itself in `mkb.dsl.BACKENDS`, turning the pair into a transfer matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Protocol, runtime_checkable


@dataclass(frozen=True)
class StaticFinding:
    """One violation of the solution contract found without running the kernel."""

    rule: str  # short id, becomes the reason code static_<rule>
    message: str
    line: int | None = None


@dataclass(frozen=True)
class CompileResult:
    """Outcome of the free CPU `check` compile: ok, or short file:line messages."""

    ok: bool
    messages: tuple[str, ...] = ()
    seconds: float = 0.0


@runtime_checkable
class DslBackend(Protocol):
    """One kernel DSL.

    Contract:
    - `name` is the short id used in events and on the CLI (`cute`, `tirx`); `display_name` is for prompts.
    - `version()` names the installed DSL package version; it is part of every coordinate key.
    - `environment(gpu_arch)` returns the environment variables the DSL needs for that GPU
      (e.g. CUTE_DSL_ARCH, CUDA_PATH), including the math-flag policy that is pinned to be the same
      for every backend (no fast-math approximations unless every backend uses them).
    - `private_environment(scratch)` points every file the DSL writes while it compiles (its on-disk
      compile cache) into a grading worker's own folder: a worker may write nowhere else once the
      candidate can run (`mkb.grader._fs_guard`), and a cache shared between workers would let one
      candidate replace another's compiled kernel. Added after v1, like `empty_kernel`: the grader
      looks it up with `getattr(backend, "private_environment", None)`.
    - `import_modules` lists modules a grader worker imports ahead of the candidate (warm start).
    - `load(path)` imports a candidate `kernel.py` from a file and returns the module.
    - `static_rules(source)` checks the solution contract on the AST; an empty tuple means clean.
    - `check_compile(path, problem)` compiles on the CPU without running anything (the free `check`),
      turning compiler errors into short `file:line: message` lines with no ANSI codes.
    - `kernel_name_patterns(module)` gives the regexes the profiler's kernel names must match for a
      launch to count as this DSL's, derived from the candidate's own compiled kernels.
    - `prompt_section()` is the DSL-specific part of a task statement; `doc_pack()` the folder of
      reference docs an agent may read, and `doc_pack_version()` a hash of it.
    - `empty_kernel()` returns a zero-argument callable that launches one empty kernel of this DSL
      on torch's current CUDA stream, through the same launch path candidates use (TVM-FFI), so the
      grader can time the DSL's launch floor in the same window as candidates. The first call per
      process and device compiles (imports the DSL then, never at module import); later calls
      return the cached callable. Added in the protocol after v1: callers that must accept older
      backends look it up with `getattr(backend, "empty_kernel", None)`.
    - `precompiles` (optional, False by default; grader 2.17): the DSL's compile is mostly a step that needs no GPU,
      made ahead for a queued job (mkb.grader._precompile). Then `record_device_code()` patches the calling process
      (after `compile_only_patches()`, in a process that cannot open the GPU) to record the device sources instead
      of building them and returns the list it fills; `build_device_code(sources, folder, gpu_arch=...)` builds each
      as a worker would into `folder` (a trusted process); `use_device_code(folder)` makes a worker's own builds read
      a build there whose key is that of its call, and returns counts the worker records.
    - `baseline_file` is the file name of this DSL's baseline solution in a problem folder (`<name>.py`);
      baselines are discovered through it and left out of the problem hash.
    - `is_compile_error(exc)` says whether an exception raised while a kernel was imported or first
      called is this DSL's compiler refusing it (`compile_error`) rather than the candidate's own
      Python failing (`import_error` / `runtime_error`).
    - `compile_only_patches()` patches the DSL in the calling process (the check's own) so that
      `solve` really compiles for the GPU arch and launches nothing; returns a stats dict with
      `compiled` (builds so far), `entry` (the compile entry point's name) and `arch`.
    """

    name: str
    display_name: str

    def version(self) -> str: ...

    def environment(self, gpu_arch: str) -> dict[str, str]: ...

    def private_environment(self, scratch: Path) -> dict[str, str]: ...

    @property
    def import_modules(self) -> tuple[str, ...]: ...

    def load(self, path: Path) -> ModuleType: ...

    def static_rules(self, source: str) -> tuple[StaticFinding, ...]: ...

    def check_compile(self, path: Path, problem: int) -> CompileResult: ...

    def kernel_name_patterns(self, module: ModuleType) -> tuple[str, ...]: ...

    def prompt_section(self) -> str: ...

    def doc_pack(self) -> Path | None: ...

    def doc_pack_version(self) -> str: ...

    def empty_kernel(self) -> Callable[[], None]: ...

    @property
    def baseline_file(self) -> str: ...

    def is_compile_error(self, exc: BaseException) -> bool: ...

    def compile_only_patches(self) -> dict: ...
