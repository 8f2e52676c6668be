#!/usr/bin/env python
"""torch.compile every problem's eager on this machine's GPU and time it beside eager (`mkb-run torch-compile`), then pack the store.

On the GPU host (torch, triton, pyarrow, fsspec, typer, rich; no polars), resuming into the committed dataset:

    PYTHONPATH=$PWD python scripts/torch_compile.py --store events/h200-torch-compile --budget-s 500 \\
        --peaks-from events/h200-characterisation --peaks-from events/h200-characterisation-2 \\
        --peaks-from events/h200-characterisation-3 --peaks-from events/h200-characterisation-4 \\
        --pack $OUT/h200-torch-compile.tar --worker-log $OUT/workers.log 2>&1 | tee $OUT/run.log

Problems whose (problem hash, torch version, GPU model, mode) the store already holds are skipped, so a second
call continues where the first stopped. --pack tars the whole store (a `kind=...` folder cannot travel back
from the device as is); --summary writes one JSON line per row recorded by this call.

Up to --concurrency workers run at once, and only as many as the GPU's memory admits: a task starts when the
running tasks' expected peaks plus its own fit within --memory-fraction of the device's memory (nvidia-smi, or
--gpu-memory-gib); a task expected to need more runs alone. The expected peak is the task's own measured peak
where an earlier call recorded one (`peak_memory_bytes`), else the newest --peaks-from characterisation's eager
peak times an anchor factor (the check's fp64 copies), else a quarter of the device, raised by any earlier
out-of-memory row's need (mkb.problems._torch_compile.estimate_peak). An out-of-memory failure beside other
workers is tried again next call; one while the task ran alone is final (status `oom_alone`), so calls converge.

Options: --size full|smoke, --device cuda|cpu, --family F, --problem N (repeatable), --mode M (repeatable),
--cap-default-s S, --cap-autotune-s S, --budget-s S, --concurrency N, --compile-threads N, --pack FILE.tar,
--summary FILE.jsonl, --worker-log FILE, --peaks-from STORE (repeatable), --memory-fraction F, --gpu-memory-gib G.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from mkb.problems._torch_compile import DEFAULT_COMPILER, MEMORY_FRACTION, MODES, main_summary, run_torch_compile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--size", default="full", choices=("full", "smoke"))
    ap.add_argument("--device", default=None)
    ap.add_argument("--family", default=None)
    ap.add_argument("--problem", action="append", default=None)
    ap.add_argument("--mode", action="append", default=None, choices=MODES)
    ap.add_argument("--cap-default-s", type=float, default=240.0)
    ap.add_argument("--cap-autotune-s", type=float, default=150.0)
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--compile-threads", type=int, default=1)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (tests: eager).")
    ap.add_argument("--compiler", default=DEFAULT_COMPILER, help="module:function standing in for torch.compile (tests).")
    ap.add_argument("--pack", default=None, help="Tar the --store folder into this one file when done (also after a failure).")
    ap.add_argument("--summary", default=None, help="One JSON line per row this call recorded.")
    ap.add_argument("--worker-log", default=None, help="The workers' stdout/stderr (inductor's autotune tables), apart from the run's log.")
    ap.add_argument("--peaks-from", action="append", default=[], metavar="STORE",
                    help="A characterisation dataset whose eager peaks estimate each task's GPU memory (repeatable; the newest row of a problem hash counts).")
    ap.add_argument("--memory-fraction", type=float, default=MEMORY_FRACTION,
                    help="Share of the GPU's memory the running tasks' expected peaks may sum to.")
    ap.add_argument("--gpu-memory-gib", type=float, default=None, help="The GPU's memory (default: nvidia-smi's figure).")
    a = ap.parse_args()
    rep = None
    try:
        rep = run_torch_compile(store=a.store, size=a.size, device=a.device, family=a.family, only=a.problem,
                                modes=tuple(a.mode) if a.mode else MODES, budget_s=a.budget_s, concurrency=a.concurrency,
                                compile_threads=a.compile_threads, backend=a.backend, compiler=a.compiler, worker_log=a.worker_log,
                                caps={"default": a.cap_default_s, "max-autotune-no-cudagraphs": a.cap_autotune_s},
                                peak_stores=a.peaks_from, memory_fraction=a.memory_fraction,
                                device_memory_bytes=int(a.gpu_memory_gib * 2**30) if a.gpu_memory_gib else None)
        print(main_summary(rep), flush=True)
    except ValueError as exc:  # bad input (a mode, a size, a store): one line and its hint, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        if a.pack and Path(a.store).is_dir():
            with tarfile.open(a.pack, "w") as tar:
                tar.add(a.store, arcname=Path(a.store).name)
            print(f"packed {a.store} into {a.pack}", flush=True)
        if a.summary and rep is not None:
            with open(a.summary, "w") as fh:
                for r in rep.rows:
                    fh.write(json.dumps(r, default=str) + "\n")
    left = len(rep.unfinished) if rep else -1
    print(f"left for the next call: {left} (problem, mode) tasks" if left else "all selected tasks recorded", flush=True)


if __name__ == "__main__":
    main()
