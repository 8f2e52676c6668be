"""The TIRx backend (apache-tvm 0.27.0.post1, `tir_pipeline="tirx"`): environment, loading, checks and prompt for TIRx kernels.

Math-flag policy (the same for every backend, see `mkb.dsl._common.MATH_POLICY`): precise. TVM
compiles CUDA with `--use_fast_math` by default in both of its device-compiler paths. The NVRTC
path hard-codes it, and the flags it lets us append (`--ftz=false --prec-div=true
--prec-sqrt=true`) undo flush-to-zero and the approximate division and square root but not the
fast-math library (`expf` stays `ex2.approx`, checked in the PTX). The nvcc path honours
`TVM_CUDA_NVCC_NO_FAST_MATH=1` and then emits exactly what CuTe DSL emits by default. So TIRx
device code is compiled by nvcc (`TVM_CUDA_COMPILE_MODE=nvcc`) with fast math off; the NVRTC
overrides are set as well, so a process that falls back to NVRTC is as close as it can be.

Importing this module or constructing `TirxBackend` does not import `tvm`. Note that importing
`tvm` makes a later fork() unable to initialise CUDA (measured on the H200): spawn workers.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

from mkb.dsl import _common
from mkb.dsl._base import BackendBase
from mkb.dsl._static import RuleSet
from mkb.dsl.cute import normalise_arch

_DOCS = Path(__file__).resolve().parent / "docs" / "tirx"

_RULES = RuleSet(
    extra_prefixes=(
        ("cutlass", "other_dsl"),
        ("tvm_tirx", "other_dsl"),
        ("tvm.s_tir", "other_dsl"),
        ("tvm.meta_schedule", "other_dsl"),
        ("tvm.te", "other_dsl"),
        ("tvm.dlight", "other_dsl"),
    ),
    extra_call_kwargs=(("cuda.func_call", "source_code", "raw_cuda"),),
)


class TirxBackend(BackendBase):
    """TIRx: `@Tx.prim_func` kernels with `Tx.device_entry()`, built by `tvm.compile(..., tir_pipeline="tirx")`."""

    name = "tirx"
    display_name = "TIRx (Apache TVM)"
    dist = "apache-tvm"
    entry = "tvm.compile"
    docs = _DOCS
    rules = _RULES
    compiler_modules = ("tvm", "tvm_ffi", "cuda")

    def environment(self, gpu_arch: str) -> dict[str, str]:
        cuda = _common.cuda_path()
        path = os.environ.get("PATH", "")
        cuda_bin = os.path.join(cuda, "bin")
        return {
            "MKB_GPU_ARCH": normalise_arch(gpu_arch),
            "CUDA_PATH": cuda,
            # TVM runs `nvcc` from PATH: put the toolkit's first so the pinned flags meet the pinned compiler
            "PATH": path if path.split(os.pathsep)[:1] == [cuda_bin] else os.pathsep.join(p for p in (cuda_bin, path) if p),
            "TVM_CUDA_COMPILE_MODE": "nvcc",
            "TVM_CUDA_NVCC_NO_FAST_MATH": "1",
            "TVM_CUDA_NVRTC_EXTRA_OPTS": "--ftz=false --prec-div=true --prec-sqrt=true",
            "MKB_MATH_POLICY": _common.MATH_POLICY_ID,
        }

    @property
    def import_modules(self) -> tuple[str, ...]:
        return ("torch", "tvm", "tvm.script", "tvm_ffi")

    def kernel_functions(self, module: ModuleType) -> tuple[str, ...]:
        """Names of the prim_funcs the candidate defines (by decorator, and by global_symbol once built)."""
        names = list(_common.decorated_functions(_common.module_source(module), frozenset({"prim_func", "jit"})))
        if "tvm" in sys.modules:
            import tvm

            prim = getattr(getattr(tvm, "tirx", None), "PrimFunc", None)
            for value in list(vars(module).values()):
                if prim is not None and isinstance(value, prim) and value.attrs is not None:
                    sym = value.attrs.get("global_symbol") if "global_symbol" in value.attrs else None
                    if sym and str(sym) not in names:
                        names.append(str(sym))
        return tuple(names)

    def kernel_name_patterns(self, module: ModuleType) -> tuple[str, ...]:
        # the profiler shows <prim_func>_kernel (extern "C", so no signature); split kernels get _1, _2, ...
        return tuple(rf"^{re.escape(n)}_kernel(_\d+)?$" for n in self.kernel_functions(module))

    def _empty_kernel(self) -> Callable[[], None]:
        return _empty_kernel_impl()

    def compile_only_patches(self) -> dict:
        return _compile_only_patches()

    precompiles = True

    def record_device_code(self) -> list[str]:
        return _record_device_code()

    def build_device_code(self, sources: list[str], folder: Path, *, gpu_arch: str) -> list[str]:
        return _build_device_code(sources, folder, gpu_arch=gpu_arch)

    def use_device_code(self, folder: Path) -> dict:
        return _use_device_code(folder)


# --- the launch floor: one empty kernel, launched the way candidates launch theirs ----------------------

_EMPTY: dict[int, Callable[[], None]] = {}


def _empty_kernel_impl() -> Callable[[], None]:
    """A prim_func with one thread doing nothing, launched through TVM-FFI on torch's current stream.

    Why a buffer and a guarded store: TVM simplifies away whatever it can prove dead (a guard on
    `N < 0` for a shape var vanishes, and a kernel left without a body keeps no parameters), so the
    store is guarded by `N > 1`, which holds only for a buffer of more than one element (never: it is
    given one) and which no compiler can decide; the kernel keeps its parameters and a body, and the
    host keeps the argument checks every candidate's call pays. Passing a torch tensor is also how
    TVM-FFI learns torch's current stream, as the baselines' launches do.
    """
    import torch

    dev = torch.cuda.current_device()
    launch = _EMPTY.get(dev)
    if launch is not None:
        return launch
    import tvm
    from tvm.script import tirx as Tx

    @Tx.prim_func
    def mkb_empty(x_ptr: Tx.handle):
        N = Tx.int32()
        X = Tx.match_buffer(x_ptr, (N,), "uint8")
        Tx.device_entry()
        bx = Tx.cta_id([1])  # noqa: F841 - one block
        tx = Tx.thread_id([1])  # noqa: F841 - of one thread
        if N > 1:
            X[0] = X[1]

    major, minor = torch.cuda.get_device_capability(dev)
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major >= 9 else "")})
    with target:
        compiled = tvm.compile(tvm.IRModule({"main": mkb_empty}), target=target, tir_pipeline="tirx")
    # without CUDA (the compile-only check) launching is stubbed and the tensor is never read
    arg = torch.zeros(1, dtype=torch.uint8, device=torch.device("cuda", dev) if torch.cuda.is_available() else "cpu")

    def launch() -> None:
        compiled(arg)

    _EMPTY[dev] = launch
    return launch


# --- compile-only mode (used by mkb.dsl._check in its own process) -----------------------------------


def _compile_only_patches() -> dict:
    """Patch TVM in this process so that `solve` builds its kernels down to a cubin (ptxas included) and launches nothing.

    Without a GPU, TVM's build keeps only CUDA source (the CUDA runtime is absent), so the check
    compiles that source itself with the policy's device compiler; and a `cuda` target without an
    arch would fall back to sm_50, so the arch is pinned to the one the environment names.
    """
    import torch
    import tvm
    from tvm.support import nvcc

    arch = os.environ.get("MKB_GPU_ARCH", "sm_90a")
    stats = {"compiled": 0, "entry": "tvm.compile", "arch": arch, "kernels": []}
    pinned = tvm.target.Target({"kind": "cuda", "arch": arch})
    real_compile = tvm.compile

    def _pin(target):
        if target is None:
            return pinned
        t = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
        return pinned if t.kind.name == "cuda" else t

    class _NoRun:
        def __call__(self, *args, **kwargs):
            return None

        def __getitem__(self, key):
            return _NoRun()

        def __getattr__(self, name):
            return _NoRun()

    def compile_only(mod, target=None, *args, **kwargs):
        target = _pin(kwargs.pop("target", target))
        with target:
            exe = real_compile(mod, target, *args, **kwargs)
            cuda_mods = [m for m in exe.mod.imports if m.kind == "cuda"]
            if not cuda_mods:
                raise RuntimeError(
                    "the build has no CUDA device code: the kernel body would run on the host\n"
                    "hint: start the kernel body with Tx.device_entry() and compile with tir_pipeline=\"tirx\""
                )
            mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvcc")
            for m in cuda_mods:
                src = m.inspect_source()
                nvcc.compile_cuda(src, target_format="cubin", compiler=mode)
                for k in re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src):
                    if k not in stats["kernels"]:
                        stats["kernels"].append(k)
        stats["compiled"] += 1
        return _NoRun()

    tvm.compile = compile_only
    _common.patch_torch_cuda_for_cpu(torch)
    maj, minor = re.match(r"sm_(\d+?)(\d)a?$", arch).groups()
    torch.cuda.get_device_capability = lambda device=None: (int(maj), int(minor))
    return stats


# --- device code made ahead (grader 2.17's precompile: mkb.grader._precompile) ------------------------------
#
# A TIRx compile is mostly nvcc (71-84% of it on the H200, events/h200-precompile-probe), which needs no GPU. A process
# that cannot open the GPU runs the candidate's `solve` with launching stubbed and nvcc replaced by a recorder: it
# hands over the CUDA sources TVM generated, nothing built. A trusted process builds each source exactly as a worker's
# TVM would (`compile_cuda(code, target_format="fatbin", compiler="nvcc")` under the worker's target) into a folder
# the candidate cannot write, and the worker's `compile_cuda` reads a build there whose key is that of its own call.
# The key names everything the nvcc command line depends on, so a hit is the bytes the worker's own nvcc would make.

_KEY_ENV = ("TVM_CUDA_NVCC_NO_FAST_MATH", "TVM_CUDA_PTXAS_REG_LEVEL", "TVM_CUDA_PTXAS_EXTRA_OPTS", "CUDA_PATH",
            "MKB_MATH_POLICY", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
# what a source may not use to be built ahead: each makes the build depend on where and when it runs (a quoted or
# absolute include reads a file beside the build, the clock macros the time), so the builder's bytes could differ
# from the worker's own nvcc's; such a source is compiled in the worker, as before
_PLACE_BOUND = re.compile(r'#\s*include\s*(?:"|<\s*/)|__has_include|__TIME__|__DATE__|__TIMESTAMP__|__FILE__|__BASE_FILE__')


def _device_code_key(code: str, target_format: str | None, arch, options, path_target, compiler: str) -> str | None:
    """The key of one `compile_cuda` call, or None where a build made elsewhere could differ (a dump or debug build,
    an output path, nvshmem, a kernels output folder, another compiler); read where the call is made."""
    import hashlib
    import json
    import shutil

    import tvm
    import tvm_ffi

    if (compiler != "nvcc" or path_target is not None or os.environ.get("TVM_KERNEL_DUMP") is not None
            or os.environ.get("TVM_KERNEL_DEBUG", "0") == "1" or "nvshmem" in code):
        return None
    ctx = tvm_ffi.get_global_func("transform.GetCurrentPassContext")()
    if "cuda.kernels_output_dir" in ctx.config:
        return None
    from tvm.support import nvcc

    # the arch as compile_cuda resolves it: the current target's, else the device's compute capability
    target = tvm.target.Target.current(allow_none=True)
    target_arch = getattr(target, "arch", None) if target is not None else None
    if arch is not None:
        resolved = arch
    elif isinstance(target_arch, str) and target_arch.startswith("sm_"):
        resolved = target_arch[3:]
    else:
        try:
            resolved = "".join(nvcc.get_target_compute_version(target).split("."))
        except Exception:  # noqa: BLE001 - no device to ask: nothing made ahead can be this call's
            return None
    ident = [code, target_format, resolved, options, compiler, nvcc.__file__, tvm.__version__, shutil.which("nvcc"),
             {k: os.environ.get(k) for k in _KEY_ENV}]
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


def _record_device_code() -> list[str]:
    """Patch this process (after `compile_only_patches`) so that nvcc is never run: each CUDA source TVM would build
    is recorded instead (the compile-only check's own cubin build included), and a placeholder returned."""
    from tvm.support import nvcc

    sources: list[str] = []

    def record(code, target_format=None, arch=None, options=None, path_target=None, compiler="nvrtc"):
        if code not in sources:
            sources.append(code)
        return bytearray()

    nvcc.compile_cuda = record
    return sources


def _build_device_code(sources: list[str], folder: Path, *, gpu_arch: str) -> list[str]:
    """Build each source as a worker's TVM would into `folder/<key>.bin`; returns the keys built (a source that does not
    compile, or whose build would depend on where or when it runs, is left out: the worker compiles it).

    Twice where the arch has a feature suffix: under a `cuda` target of `gpu_arch` (sm_90a, what a kernel that names
    its target gets) and of the plain arch (sm_90: the command nvcc gets where the worker's call has no target in
    scope and the arch comes from the device's compute capability)."""
    import tvm
    from tvm.support import nvcc

    full = normalise_arch(gpu_arch)
    keys = []
    for arch in dict.fromkeys((full, full.rstrip("af") if full[-1:] in ("a", "f") else full)):
        with tvm.target.Target({"kind": "cuda", "arch": arch}):
            for code in sources:
                if _PLACE_BOUND.search(code):
                    continue
                key = _device_code_key(code, "fatbin", None, None, None, "nvcc")
                if key is None or key in keys:
                    continue
                try:
                    out = nvcc.compile_cuda(code, target_format="fatbin", compiler="nvcc")
                except Exception:  # noqa: BLE001 - the worker compiles it itself and reports the error there
                    continue
                tmp = folder / f".{key}.part"
                tmp.write_bytes(bytes(out))
                tmp.rename(folder / f"{key}.bin")
                keys.append(key)
    return keys


def _use_device_code(folder: Path) -> dict:
    """Wrap `compile_cuda` in this (worker) process so that a call whose key has a build in `folder` reads it; counts
    in the returned dict (`hits`, `misses`, `uncacheable`), which the worker records with its compile."""
    from tvm.support import nvcc

    real = nvcc.compile_cuda
    stats = {"builds": sum(1 for p in folder.glob("*.bin")), "hits": 0, "misses": 0, "uncacheable": 0}

    def compile_cuda(code, target_format=None, arch=None, options=None, path_target=None, compiler="nvrtc"):
        key = _device_code_key(code, target_format, arch, options, path_target, compiler)
        if key is None:
            stats["uncacheable"] += 1
        else:
            try:
                data = (folder / f"{key}.bin").read_bytes()
            except OSError:
                stats["misses"] += 1
            else:
                stats["hits"] += 1
                return bytearray(data)
        return real(code, target_format=target_format, arch=arch, options=options, path_target=path_target,
                    compiler=compiler)

    compile_cuda.__wrapped__ = real
    nvcc.compile_cuda = compile_cuda
    return stats
