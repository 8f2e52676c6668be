"""Which files and programs the DSL's pipeline touches: run it on a recorded text between two markers (under strace)."""
import os, sys
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
from pathlib import Path
import cutlass.cute  # noqa: F401
from cutlass._mlir import ir, passmanager
out = Path(sys.argv[1])
pre = sorted(out.glob("*.pre.mlir"))[0]
pipeline, arch = (out / f"{pre.name.split('.')[0]}.pipeline").read_text().split("\n")
with ir.Context() as ctx:
    ctx.enable_multithreading(False)
    m = ir.Module.parse(pre.read_text())
    pm = passmanager.PassManager.parse(pipeline)
    os.write(2, b"MARK-START\n")
    pm.run(m.operation)
    os.write(2, b"MARK-END\n")
