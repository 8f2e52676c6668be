"""The trusted builder's step, standalone: parse a recorded pre-pipeline module text, run the DSL's own pipeline on it
(no candidate code, no post-compile hook), write the output bytecode; compare with what the in-process compile made.

    builder.py OUTDIR [--timing]   # for each OUTDIR/<key16>.pre.mlir + .pipeline: build, time, compare to builds/<key>
"""
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import hashlib
import io
import time
from pathlib import Path

t0 = time.perf_counter()
import cutlass  # noqa: E402,F401  (registers the dialects and passes)
import cutlass.cute  # noqa: E402,F401
from cutlass._mlir import ir, passmanager  # noqa: E402

t_imp = time.perf_counter() - t0
out = Path(sys.argv[1])
timing = "--timing" in sys.argv
print(f"import {t_imp:.3f}s")
for pre in sorted(out.glob("*.pre.mlir")):
    k16 = pre.name.split(".")[0]
    pipeline, arch = (out / f"{k16}.pipeline").read_text().split("\n")
    text = pre.read_text()
    ref = next((out / "builds").glob(f"{k16}*.mlirbc"))
    with ir.Context() as ctx:
        ctx.enable_multithreading(False)
        s = time.perf_counter()
        m = ir.Module.parse(text)
        t_parse = time.perf_counter() - s
        same_text = m.operation.get_asm(enable_debug_info=True, print_generic_op_form=True) == text
        pm = passmanager.PassManager.parse(pipeline)
        if timing:
            pm.enable_timing()
        s = time.perf_counter()
        pm.run(m.operation)
        t_run = time.perf_counter() - s
        buf = io.BytesIO()
        m.operation.write_bytecode(buf)
    b = buf.getvalue()
    print(f"{k16} parse {t_parse:.3f}s pipeline {t_run:.3f}s roundtrip_text_equal={same_text} "
          f"out {len(b)} B equal_to_in_process={b == ref.read_bytes()} sha {hashlib.sha256(b).hexdigest()[:16]}")
