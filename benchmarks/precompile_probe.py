"""Measure what a GPU-less precompile could take off a grading's critical path: for each baseline, its real compile
cold, again on the same on-disk cache, and after a compile-only process (no GPU, as a sandbox beside another grading's
timing would be) filled a fresh cache.

Why: a queue grades one job at a time per GPU and the candidate's compile (import + first call) is the largest phase
of a grading on every H200 host measured (0.70-1.26 s mean; DESIGN, Throughput of one GPU). It runs candidate code,
so it may not overlap another grading's timing on the GPU; a process that cannot open the GPU could. Whether that
gains anything depends on whether the worker's compile then finds the sandbox's work: CuTe's JIT file cache
(`CUTE_DSL_CACHE_DIR`), and for TIRx the device compiler's output, cached here by its exact arguments
(`tvm.support.nvcc.compile_cuda`, which TVM calls with `fatbin` where the compile-only check asks for a `cubin`).

    python benchmarks/precompile_probe.py --out $OUT/pc --problems 1 28 72      # on a GPU host
    python benchmarks/precompile_probe.py --smoke --problems 28                  # the CPU parts only (never a figure)

Each step is a fresh process (its imports, then `backend.load` and the first `solve` on full-size inputs, timed as
the worker times `compile_s`). Writes `precompile_probe.json` (every step's figures) and prints one line per baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _nvcc_cache(cache: Path, calls: list[dict]) -> None:
    """Wrap `tvm.support.nvcc.compile_cuda` so that each call is timed and its output kept in `cache` under the hash
    of its exact arguments (a call with the same arguments is then read back instead of compiled)."""
    from tvm.support import nvcc

    real = nvcc.compile_cuda

    def compile_cuda(code, target_format=None, arch=None, options=None, path_target=None, compiler="nvrtc"):
        key = hashlib.sha256(json.dumps([code, target_format, arch, options, compiler,
                                         os.environ.get("MKB_GPU_ARCH")], default=str).encode()).hexdigest()
        f = cache / f"{key}.bin"
        t0 = time.perf_counter()
        if f.is_file() and path_target is None:
            out = bytearray(f.read_bytes())
            calls.append({"format": target_format, "key": key[:16], "hit": True, "s": time.perf_counter() - t0})
            return out
        out = real(code, target_format=target_format, arch=arch, options=options, path_target=path_target,
                   compiler=compiler)
        calls.append({"format": target_format, "key": key[:16], "hit": False, "s": time.perf_counter() - t0})
        if isinstance(out, (bytes, bytearray)):
            f.write_bytes(bytes(out))
        return out

    nvcc.compile_cuda = compile_cuda


def child(mode: str, dsl: str, kernel: Path, problem: int, cache: Path, size: str) -> dict:
    """One step, in its own process: `real` (GPU, as a worker compiles) or `compile_only` (no GPU, as the free check
    compiles, on inputs of the same size as the real step's)."""
    t_start = time.perf_counter()
    import torch

    from mkb.dsl import get_backend
    from mkb.problems import find_problem, load_problem

    backend = get_backend(dsl)
    prob = load_problem(find_problem(problem))
    calls: list[dict] = []
    before = sum(1 for p in cache.rglob("*") if p.is_file())
    t_imports = time.perf_counter() - t_start
    if mode == "compile_only":
        inputs = prob.make_inputs(0, device="cpu", size=size)
        stats = backend.compile_only_patches()
    else:
        inputs = prob.make_inputs(0, device="cuda", size=size)
        torch.cuda.synchronize()
        stats = None
    if dsl == "tirx":
        _nvcc_cache(cache / "nvcc", calls)
        if mode == "compile_only":
            _also_fatbin(calls)
    t0 = time.perf_counter()
    mod = backend.load(kernel)
    t_load = time.perf_counter() - t0
    with torch.no_grad():
        mod.solve(*inputs)
    if mode == "real":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    after = sum(1 for p in cache.rglob("*") if p.is_file())
    return {"mode": mode, "compile_s": compile_s, "load_s": t_load, "imports_s": t_imports,
            "nvcc_s": sum(c["s"] for c in calls), "nvcc_calls": calls, "cache_files_before": before,
            "cache_files_after": after, "compiled": (stats or {}).get("compiled")}


def _also_fatbin(calls: list[dict]) -> None:
    """The compile-only check builds a cubin; the worker's TVM asks nvcc for a fatbin of the same source. A precompile
    sandbox would build what the worker asks for, so here each checked source is also built as the worker would."""
    from tvm.support import nvcc

    cached = nvcc.compile_cuda

    def both(code, target_format=None, arch=None, options=None, path_target=None, compiler="nvrtc"):
        out = cached(code, target_format=target_format, arch=arch, options=options, path_target=path_target,
                     compiler=compiler)
        if target_format == "cubin" and compiler == "nvcc":
            cached(code, target_format="fatbin", arch=None, options=None, path_target=None, compiler="nvcc")
        return out

    nvcc.compile_cuda = both


def _run_child(mode: str, dsl: str, kernel: Path, problem: int, cache: Path, size: str, env: dict) -> dict:
    full = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH", "")) if p)
    if mode == "compile_only":
        full["CUDA_VISIBLE_DEVICES"] = ""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", mode, dsl, str(kernel), str(problem), str(cache), size],
                          env=full, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("PROBE "):
            return json.loads(line[6:]) | {"process_s": wall}
    return {"mode": mode, "error": (proc.stderr or proc.stdout)[-1500:], "process_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=6, metavar=("MODE", "DSL", "KERNEL", "PROBLEM", "CACHE", "SIZE"))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mkb-precompile-probe"))
    ap.add_argument("--problems", type=int, nargs="+", default=[1, 28, 72])
    ap.add_argument("--dsl", action="append", default=None)
    ap.add_argument("--gpu-arch", default="sm_90a")
    ap.add_argument("--smoke", action="store_true", help="compile-only steps alone, at smoke size (a CPU check of this "
                    "script; never a figure)")
    a = ap.parse_args(argv)
    if a.child:
        mode, dsl, kernel, problem, cache, size = a.child
        print("PROBE " + json.dumps(child(mode, dsl, Path(kernel), int(problem), Path(cache), size)), flush=True)
        return 0

    from mkb.dsl import get_backend
    from mkb.problems import baselines

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    size = "smoke" if a.smoke else "full"
    steps = ("compile_only",) if a.smoke else ("real", "real", "compile_only", "real")
    record = {"size": size, "gpu_arch": a.gpu_arch, "baselines": []}
    for b in baselines(a.problems, dsls=a.dsl):
        backend = get_backend(b.dsl)
        rows = []
        dirs = [Path(tempfile.mkdtemp(prefix="mkb-pc-")) for _ in range(2)]
        try:
            for i, mode in enumerate(steps):
                cache = dirs[0] if (a.smoke or i < 2) else dirs[1]  # cold, warm on A; compile-only then real on B
                env = {**backend.environment(a.gpu_arch), **backend.private_environment(cache)}
                (cache / "nvcc").mkdir(exist_ok=True)
                rows.append(_run_child(mode, b.dsl, b.path, b.problem, cache, size, env))
        finally:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
        record["baselines"].append({"problem": b.problem, "dsl": b.dsl, "steps": rows})
        fig = " | ".join(f"{r['mode']} " + (f"{r['compile_s']:.3f} s (nvcc {r['nvcc_s']:.3f} s, "
                                             f"{sum(c['hit'] for c in r['nvcc_calls'])}/{len(r['nvcc_calls'])} hits, cache "
                                             f"{r['cache_files_before']}->{r['cache_files_after']})" if "error" not in r
                                             else "ERROR " + r["error"].strip().splitlines()[-1][:200]) for r in rows)
        print(f"PRECOMPILE problem {b.problem} {b.dsl}: {fig}", flush=True)
    (out / "precompile_probe.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {out / 'precompile_probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
