"""Time how a CuTe baseline's cute.compile splits, and record / replay the MLIR module around the DSL's pipeline.

    probe.py record PROBLEM OUTDIR [REPS]   # real compiles; saves pre-pipeline text, pipeline, post-pipeline bytecode
    probe.py replay PROBLEM OUTDIR [REPS]   # Compiler.compile served from OUTDIR/builds (key = text+pipeline+arch)

Run from the repository root with PYTHONPATH=. and a Python that has nvidia-cutlass-dsl[cu13]==4.8.1, apache-tvm-ffi and a CPU torch (CPU only). Prints one JSON line per compile and a summary.
"""
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("CUTE_DSL_CACHE_DIR", f"/tmp/cute-probe-cache/{os.getpid()}")

import hashlib
import io
import json
import time

_CLOCK = time.process_time if os.environ.get("CLOCK") == "cpu" else time.perf_counter  # cpu: this process's CPU seconds
from pathlib import Path

mode, problem, outdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
outdir.mkdir(parents=True, exist_ok=True)
builds = outdir / "builds"
builds.mkdir(exist_ok=True)

t0 = time.perf_counter()
import torch  # noqa: E402

t_torch = time.perf_counter() - t0
from mkb.dsl import get_backend  # noqa: E402
from mkb.problems import find_problem, load_problem  # noqa: E402

backend = get_backend("cute")
t1 = time.perf_counter()
import cutlass  # noqa: E402,F401
import cutlass.cute  # noqa: E402,F401  (the DSL loaded, as a worker has it)

t_dsl = time.perf_counter() - t1
from cutlass.base_dsl import compiler as C  # noqa: E402
from cutlass.base_dsl import dsl as D  # noqa: E402
from cutlass._mlir import ir  # noqa: E402

T: dict = {}


def add(k, v):
    T[k] = T.get(k, 0.0) + v


def timed(name, fn):
    def w(*a, **k):
        s = _CLOCK()
        try:
            return fn(*a, **k)
        finally:
            add(name, _CLOCK() - s)

    w.__wrapped__ = fn
    return w


def key_of(text: str, pipeline: str, arch: str) -> str:
    h = hashlib.sha256()
    for part in (text, pipeline, arch, cutlass.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


real_compile = C.Compiler.compile
RECORDS: list = []


def compile_wrapper(self, module, pipeline, arch="", *a, **k):
    text = module.operation.get_asm(enable_debug_info=True, print_generic_op_form=True)
    key = key_of(text, pipeline, arch)
    hook = self._post_compile_hook
    rec = {"key": key[:16], "text_bytes": len(text), "pipeline": pipeline}
    if mode == "replay":
        p = builds / f"{key}.mlirbc"
        if p.exists():
            s = _CLOCK()
            built = ir.Module.parse(p.read_bytes())  # into ir.Context.current: the DSL's own context
            add("replay.parse", _CLOCK() - s)
            if hook:
                s = _CLOCK()
                hook(built)
                add("hook(ffi)", _CLOCK() - s)
            rec["hit"] = True
            RECORDS.append(rec)
            return built
        rec["hit"] = False
    # the real pipeline, with the post-compile hook (TVM-FFI wrapper) timed apart and the pre-hook output saved
    def pre_hook(m):
        buf = io.BytesIO()
        m.operation.write_bytecode(buf)
        rec["post_bytes"] = len(buf.getvalue())
        rec["post_sha"] = hashlib.sha256(buf.getvalue()).hexdigest()[:16]
        (builds / f"{key}.mlirbc").write_bytes(buf.getvalue())
        (outdir / f"{key[:16]}.pre.mlir").write_text(text)
        (outdir / f"{key[:16]}.pipeline").write_text(pipeline + "\n" + arch)
        if hook:
            s = _CLOCK()
            hook(m)
            add("hook(ffi)", _CLOCK() - s)
            T["_hook_inside_pipeline"] = T.get("_hook_inside_pipeline", 0.0) + _CLOCK() - s

    self._post_compile_hook = pre_hook
    try:
        s = _CLOCK()
        out = real_compile(self, module, pipeline, arch, *a, **k)
        add("pipeline+hook", _CLOCK() - s)
    finally:
        self._post_compile_hook = hook
    RECORDS.append(rec)
    return out


C.Compiler.compile = compile_wrapper
C.Compiler.jit = timed("jit(ExecutionEngine)", C.Compiler.jit)
D.BaseDSL._lookup_jit_entry = timed("lookup", D.BaseDSL._lookup_jit_entry)
_real_bjf = D.BaseDSL._build_jit_function


def _bjf(self, func_type, module, *a, **k):
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    RECORDS.append({"final_sha": hashlib.sha256(buf.getvalue()).hexdigest()[:16]})
    return _real_bjf(self, func_type, module, *a, **k)


D.BaseDSL._build_jit_function = timed("build_fn", _bjf)
D.BaseDSL.compile_and_cache = timed("compile_and_cache", D.BaseDSL.compile_and_cache)
import cutlass.cutlass_dsl.tvm_ffi_provider as TP  # noqa: E402
import cutlass._mlir._mlir_libs._cutlass_ir._execution_engine as EE  # noqa: E402


class _AotTimed:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, n):
        return getattr(self._inner, n)

    def export_module_to_bytes(self, *a, **k):
        s = _CLOCK()
        try:
            return self._inner.export_module_to_bytes(*a, **k)
        finally:
            add("export_o3_object", _CLOCK() - s)


TP._aot_support = _AotTimed(TP._aot_support)
_BEE = EE.BinaryExecutionEngine


class _TimedBEE:  # construction + lookup timed; the instance is the real engine
    def __new__(cls, *a, **k):
        s = _CLOCK()
        e = _BEE(*a, **k)
        add("jitlink_load", _CLOCK() - s)
        return e


EE.BinaryExecutionEngine = _TimedBEE
C.CompileCallable._compile = timed("cute.compile", C.CompileCallable._compile)

stats = backend.compile_only_patches()
prob = load_problem(find_problem(int(problem)))
inputs = prob.make_inputs(0, device="cpu", size="full")
kpath = Path(os.environ["KPATH"]) if os.environ.get("KPATH") else next(Path("problems").glob(f"*/{int(problem):02d}_*/cute.py"))
mod = backend.load(kpath)
results = []
for r in range(reps):
    mod._CACHE.clear()  # the baseline's own compile cache: force a fresh cute.compile
    T.clear()
    RECORDS.clear()
    s = _CLOCK()
    with torch.no_grad():
        mod.solve(*inputs)
    wall = _CLOCK() - s
    hook = T.pop("_hook_inside_pipeline", 0.0)
    tot = T.get("cute.compile", 0.0)
    cac = T.get("compile_and_cache", 0.0)
    pipe = T.get("pipeline+hook", 0.0) - hook
    res = {
        "problem": int(problem), "mode": mode, "rep": r, "compiles": sum(1 for x in RECORDS if "key" in x),
        "hits": sum(1 for x in RECORDS if x.get("hit")), "solve_wall": round(wall, 4),
        "cute.compile": round(tot, 4),
        "a_trace": round(tot - cac, 4),
        "b_pipeline": round(pipe, 4),
        "c_ffi_hook": round(T.get("hook(ffi)", 0.0), 4),
        "c_jit_engine": round(T.get("jit(ExecutionEngine)", 0.0), 4),
        "c_lookup": round(T.get("lookup", 0.0), 4),
        "c_build_fn": round(T.get("build_fn", 0.0), 4),
        "replay_parse": round(T.get("replay.parse", 0.0), 4),
        "c_export_o3": round(T.get("export_o3_object", 0.0), 4),
        "c_jitlink_load": round(T.get("jitlink_load", 0.0), 4),
        "records": list(RECORDS),
    }
    results.append(res)
    print(json.dumps(res), flush=True)
print(json.dumps({"import_torch": round(t_torch, 3), "import_dsl": round(t_dsl, 3), "arch": stats["arch"]}))
(outdir / f"{mode}-{os.getpid()}.json").write_text(json.dumps(results, indent=1))
