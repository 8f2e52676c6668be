#!/usr/bin/env python
"""torch.compile every problem's eager on this machine's GPU and time it beside eager (`mkb-run torch-compile`), then pack the store.

On the GPU host (torch, triton, pyarrow, fsspec, typer, rich; no polars), resuming into the committed dataset:

    PYTHONPATH=$PWD python scripts/torch_compile.py --store events/h200-torch-compile --budget-s 500 \\
        --pack $OUT/h200-torch-compile.tar --worker-log $OUT/workers.log 2>&1 | tee $OUT/run.log

Problems whose (problem hash, torch version, GPU model, mode) the store already holds are skipped, so a second
call continues where the first stopped. --pack tars the whole store (a `kind=...` folder cannot travel back
from the device as is); --summary writes one JSON line per row recorded by this call.

Options: --size full|smoke, --device cuda|cpu, --family F, --problem N (repeatable), --mode M (repeatable),
--cap-default-s S, --cap-autotune-s S, --budget-s S, --concurrency N, --compile-threads N, --pack FILE.tar,
--summary FILE.jsonl, --worker-log FILE.
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

from mkb.problems._torch_compile import DEFAULT_COMPILER, MODES, main_summary, run_torch_compile


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
    a = ap.parse_args()
    rep = None
    try:
        rep = run_torch_compile(store=a.store, size=a.size, device=a.device, family=a.family, only=a.problem,
                                modes=tuple(a.mode) if a.mode else MODES, budget_s=a.budget_s, concurrency=a.concurrency,
                                compile_threads=a.compile_threads, backend=a.backend, compiler=a.compiler, worker_log=a.worker_log,
                                caps={"default": a.cap_default_s, "max-autotune-no-cudagraphs": a.cap_autotune_s})
        print(main_summary(rep), flush=True)
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
