"""The per-DSL empty kernel (the launch floor): compiles on the CPU for sm_90a, cached, and launches on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mkb.dsl import get_backend

ROOT = Path(__file__).resolve().parents[2]


def test_asking_for_the_empty_kernel_method_imports_no_dsl() -> None:
    code = (
        "import sys\nfrom mkb.dsl import get_backend\n"
        "fs = [get_backend(n).empty_kernel for n in ('cute', 'tirx')]\n"
        "print([m for m in ('cutlass', 'tvm', 'tvm_ffi') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


@pytest.mark.dsl
@pytest.mark.parametrize("dsl", ["cute", "tirx"])
def test_empty_kernel_compiles_once_for_sm90a_without_a_gpu(dsl: str) -> None:
    res = get_backend(dsl).check_empty_kernel(gpu_arch="sm_90a")
    assert res.ok, res.messages
    assert "1 kernel build compiled for sm_90a" in res.messages[0]


@pytest.mark.dsl
def test_tirx_empty_kernel_keeps_its_device_function() -> None:
    # the compile-only build refuses host-only code; the kernel must reach the cubin under its own name
    res = get_backend("tirx").check_empty_kernel(gpu_arch="sm_90a")
    assert res.ok and "kernels: mkb_empty_kernel" in res.messages[0], res.messages


_GPU_SCRIPT = r"""
import json, os, re, sys
from mkb.dsl import get_backend
import torch
major, minor = torch.cuda.get_device_capability()
b = get_backend(sys.argv[1])
os.environ.update(b.environment(f"sm_{major}{minor}"))
launch = b.empty_kernel()
assert b.empty_kernel() is launch
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    for _ in range(3):
        launch()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    with torch.cuda.stream(side):
        for _ in range(5):
            launch()
    torch.cuda.synchronize()
names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = []
for _ in range(20):
    torch.cuda.synchronize(); s.record(); launch(); e.record(); torch.cuda.synchronize()
    times.append(s.elapsed_time(e) * 1000.0)
print("RESULT " + json.dumps({"names": names, "median_us": sorted(times)[len(times) // 2]}))
"""


@pytest.mark.gpu
@pytest.mark.dsl
@pytest.mark.parametrize("dsl", ["cute", "tirx"])
def test_empty_kernel_launches_one_kernel_per_call_on_the_gpu(dsl: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # a fresh process: the DSLs snapshot their environment when first imported
    proc = subprocess.run([sys.executable, "-c", _GPU_SCRIPT, dsl], capture_output=True, text=True, cwd=ROOT, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stderr[-2000:]
    data = json.loads(line[-1][len("RESULT ") :])
    want = r"^kernel_cutlass_mkb_empty_kernel" if dsl == "cute" else r"^mkb_empty_kernel$"
    import re

    ours = [n for n in data["names"] if re.search(want, n)]
    assert len(ours) == 5, data["names"]
    assert 0.0 < data["median_us"] < 1000.0, data
