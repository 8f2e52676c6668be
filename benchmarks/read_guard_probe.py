"""Compiles the memory-bound baselines of both DSLs (compile-only, no GPU) in a process whose reads and writes are
confined as GraderConfig.read_guard="landlock" confines a grading worker's, and says whether a read of a file in the
user's home, and of /etc/shadow, is refused (`--off`: the same unconfined, the control).

Why: the read guard is off as shipped until every DSL is known to read only what `default_readable` allows. This is
the part a CPU can show: torch, CuTe DSL and TVM imported after the confinement (stricter than a worker, which imports
them before it), each kernel traced and built (TIRx through nvcc) by the backends' compile-only check processes, which
inherit the confinement. What the GPU run adds (the driver, the compiled kernels' launch) needs an H200.

    .venv/bin/python benchmarks/read_guard_probe.py [--problems 1 23 25 28 72] [--off]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, nargs="+", default=[1, 23, 25, 28, 72])
    ap.add_argument("--off", action="store_true", help="no confinement (the control)")
    ap.add_argument("--arch", default="sm_90a")
    a = ap.parse_args(argv)
    from mkb.dsl import get_backend
    from mkb.grader._fs_guard import confine_writes, default_readable
    from mkb.problems import baselines

    scratch = Path(tempfile.mkdtemp(prefix="mkb-read-guard-"))
    os.environ["TMPDIR"] = str(scratch)
    found = baselines(a.problems)
    home_file = next((p for p in (Path.home() / ".bashrc", Path.home() / ".profile") if p.is_file()), None)
    if not a.off:
        g = confine_writes([scratch, Path("/dev")], readable=default_readable([scratch, *(b.path for b in found)]))
        print(f"[probe] {g.describe()}", flush=True)
        if not g.confined or g.readable is None:
            print("[probe] reads could not be confined here", flush=True)
            return 1
    for private in (home_file, Path("/etc/shadow")):  # a user's file; the password hashes (readable to a root grader)
        if private is None or not private.exists():
            continue
        try:
            private.read_bytes()
            print(f"[probe] read of {private}: allowed", flush=True)
        except PermissionError:
            print(f"[probe] read of {private}: refused", flush=True)
    ok = 0
    for b in found:
        backend = get_backend(b.dsl)
        os.environ.update(backend.environment(a.arch))
        t0 = time.monotonic()
        r = backend.check_compile(b.path, b.problem)
        ok += bool(r.ok)
        print(f"[probe] {b.problem:3d} {b.dsl:5s} compile-only {'ok' if r.ok else 'FAILED'} in {time.monotonic() - t0:.1f} s"
              + ("" if r.ok else " " + json.dumps((r.message or "")[-400:])), flush=True)
    print(f"[probe] {ok} of {len(found)} baselines compiled ({'unconfined' if a.off else 'reads and writes confined'})")
    return 0 if ok == len(found) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
