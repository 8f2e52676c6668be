"""The CuTe DSL backend (nvidia-cutlass-dsl 4.8.1, cu13 build): environment, loading, checks and prompt for CuTe kernels.

Math-flag policy (the same for every backend, see `mkb.dsl._common.MATH_POLICY`): precise. CuTe DSL
has no global fast-math switch; its defaults already are IEEE division and square root, no
flush-to-zero, and the precise libdevice transcendental functions (checked in the PTX:
`div.rn.f32`, `sqrt.rn.f32`). Approximations happen only where a kernel asks for them op by op
(`cute.math.exp(x, fastmath=True)`), exactly as `Tx.exp2`-style intrinsics do in TIRx.

Importing this module or constructing `CuteBackend` does not import `cutlass`: the environment
(CUTE_DSL_ARCH above all) must be set before the DSL is first imported, because the DSL snapshots
it then. Only `load` and the compile-only check import the DSL.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Callable

from mkb.dsl import _common
from mkb.dsl._base import BackendBase
from mkb.dsl._static import RuleSet

_DOCS = Path(__file__).resolve().parent / "docs" / "cute"

_RULES = RuleSet(
    extra_prefixes=(
        ("tvm", "other_dsl"),
        ("tvm_tirx", "other_dsl"),
        ("cutlass.cute.testing", "dsl_library"),
    )
)


def normalise_arch(gpu_arch: str) -> str:
    """`sm_90`, `90`, `9.0`, `h200` -> `sm_90a`: Hopper and later need the arch-specific `a` suffix."""
    a = gpu_arch.strip().lower()
    named = {"h100": "sm_90a", "h200": "sm_90a", "h20": "sm_90a", "b200": "sm_100a", "gb200": "sm_100a", "b300": "sm_103a"}
    if a in named:
        return named[a]
    a = a.removeprefix("sm_").removeprefix("compute_").replace(".", "")
    digits = a.rstrip("af")
    if not digits.isdigit():
        raise ValueError(f"unknown GPU arch {gpu_arch!r}\nhint: pass e.g. 'sm_90a' (H100/H200) or 'sm_100a' (B200)")
    return f"sm_{digits}a" if int(digits) >= 90 else f"sm_{digits}"


class CuteBackend(BackendBase):
    """CuTe DSL: `@cute.kernel` device functions launched from `@cute.jit` host functions, compiled with `cute.compile`."""

    name = "cute"
    display_name = "CuTe DSL"
    dist = "nvidia-cutlass-dsl"
    entry = "cute.compile"
    docs = _DOCS
    rules = _RULES
    compiler_modules = ("cutlass", "mlir", "cuda", "tvm_ffi")

    def environment(self, gpu_arch: str) -> dict[str, str]:
        return {
            "CUTE_DSL_ARCH": normalise_arch(gpu_arch),
            "CUDA_PATH": _common.cuda_path(),
            "MKB_MATH_POLICY": _common.MATH_POLICY_ID,
        }

    def private_environment(self, scratch: Path) -> dict[str, str]:
        # the JIT's file cache (default /tmp/<user>/cutlass_python_cache, shared by every process of the user and loaded
        # by module hash: a candidate could plant another kernel's compiled IR there)
        return {"CUTE_DSL_CACHE_DIR": str(Path(scratch) / "cute_dsl_cache")}

    @property
    def import_modules(self) -> tuple[str, ...]:
        return ("torch", "cuda.bindings.driver", "cutlass", "cutlass.cute", "cutlass.cute.runtime", "tvm_ffi")

    def kernel_functions(self, module: ModuleType) -> tuple[str, ...]:
        """Names of the `@cute.kernel` functions the candidate defines."""
        return _common.decorated_functions(_common.module_source(module), frozenset({"kernel"}))

    def kernel_name_patterns(self, module: ModuleType) -> tuple[str, ...]:
        # the profiler shows kernel_cutlass_<function>_<mangled argument types>_<n>
        return tuple(rf"^kernel_cutlass_{re.escape(n)}_" for n in self.kernel_functions(module))

    def _empty_kernel(self) -> Callable[[], None]:
        return _empty_kernel_impl()

    def compile_only_patches(self) -> dict:
        return _compile_only_patches()


# --- the launch floor: one empty kernel, launched the way candidates launch theirs ----------------------

_EMPTY: dict[int, Callable[[], None]] = {}


def _empty_kernel_impl() -> Callable[[], None]:
    """An empty `@cute.kernel` launched 1x1 through TVM-FFI on torch's current stream, compiled once per device.

    The kernel takes one tensor it never touches: that is how a TVM-FFI env-stream launch learns
    torch's current stream (from the torch tensors passed), exactly as the baselines' launches do, so
    the floor includes the same argument marshalling a candidate pays for its smallest call.
    """
    import torch

    dev = torch.cuda.current_device()
    launch = _EMPTY.get(dev)
    if launch is not None:
        return launch
    import cutlass
    import cutlass.cute as cute

    # no annotations: under `from __future__ import annotations` the DSL would resolve `cute.Tensor`
    # in this module's globals, where `cute` is deliberately not imported; the fake tensor types mT
    @cute.kernel
    def mkb_empty_kernel(mT):
        pass

    @cute.jit
    def mkb_empty(mT, stream):
        mkb_empty_kernel(mT).launch(grid=[1, 1, 1], block=[1, 1, 1], stream=stream)

    fake = cute.runtime.make_fake_compact_tensor(cutlass.Uint8, (1,), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    compiled = cute.compile(mkb_empty, fake, stream, options="--enable-tvm-ffi")
    # without CUDA (the compile-only check) launching is stubbed and the tensor is never read
    arg = torch.zeros(1, dtype=torch.uint8, device=torch.device("cuda", dev) if torch.cuda.is_available() else "cpu")

    def launch() -> None:
        compiled(arg)

    _EMPTY[dev] = launch
    return launch


# --- compile-only mode (used by mkb.dsl._check in its own process) -----------------------------------


def _compile_only_patches() -> dict:
    """Patch the DSL in this process so that `solve` compiles its kernels and launches nothing.

    - `cute.compile` compiles for real (CUTE_DSL_ARCH) and returns a stand-in whose call does nothing.
    - `from_dlpack` of a CPU tensor presents it as a CUDA tensor (the DLPack device field only), so
      that env-stream (TVM-FFI) compiles work without a GPU; the pointer is never dereferenced.
    - torch.cuda stream/sync queries answer as if a device existed.
    """
    import ctypes

    import cutlass.cute as cute
    import cutlass.cute.runtime as rt
    import torch

    stats = {"compiled": 0, "entry": "cute.compile", "arch": None}
    import os

    stats["arch"] = os.environ.get("CUTE_DSL_ARCH")

    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype = ctypes.c_void_p
    get_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]

    class _AsCuda:
        """A CPU tensor whose DLPack capsule says kDLCUDA (device_type is the int32 after the data pointer)."""

        def __init__(self, t):
            self._t = t

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, *args, **kwargs):
            cap = self._t.__dlpack__()
            ctypes.c_int32.from_address(get_ptr(cap, b"dltensor") + 8).value = 2
            return cap

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return getattr(self._t, name)

    real_from_dlpack = rt.from_dlpack

    def from_dlpack(t, *args, **kwargs):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = _AsCuda(t)
        return real_from_dlpack(t, *args, **kwargs)

    rt.from_dlpack = from_dlpack

    class _NoRun:
        def __init__(self, fn):
            self._fn = fn

        def __call__(self, *args, **kwargs):
            return None

        def __getattr__(self, name):
            return getattr(self._fn, name)

    class _CompileOnly:
        def __init__(self, inner):
            self._inner = inner

        def __getitem__(self, opts):
            return _CompileOnly(self._inner[opts])

        def __call__(self, *args, **kwargs):
            fn = self._inner(*args, **kwargs)
            stats["compiled"] += 1
            return _NoRun(fn)

    cute.compile = _CompileOnly(cute.compile)
    _common.patch_torch_cuda_for_cpu(torch)
    return stats
