#!/usr/bin/env python
"""Characterise every problem on this machine's GPU and audit each at full size (`mkb-run characterise` + `problems audit`).

On the GPU host, which has only torch, pyarrow, fsspec, typer and rich:

    PYTHONPATH=$PWD python scripts/characterise.py --store /tmp/ds --pack $OUT/h200-characterisation-2.tar \\
        --audit-out $OUT/audit-full.jsonl --budget-s 200 --audit-budget-s 170 2>&1 | tee $OUT/run.log

The event store is written under --store (any folder: a `kind=...` folder cannot travel back from the
device, so --pack tars the whole store into one file that does); the full-size audit writes one JSON
line per problem to --audit-out (ok, failed checks, seconds, peak GPU memory; `skipped` once --audit-budget-s is spent).

Options: --size full|smoke, --device cuda|cpu, --family F, --problem N (repeatable), --budget-s S,
--no-write, --no-characterise, --audit-out FILE, --audit-budget-s S, --pack FILE.tar.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import time
from pathlib import Path

from mkb.problems._characterise import run_characterisation


def _audit(args) -> int:
    import torch

    from mkb.problems import get_problem, problems
    from mkb.problems._audit import audit_many

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference numerics the grader uses
        torch.backends.cudnn.allow_tf32 = False
    ps = [get_problem(k) for k in args.problem] if args.problem else list(problems(family=args.family))
    out = Path(args.audit_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    bad = 0
    t0 = time.perf_counter()
    cuda = device.startswith("cuda")
    if cuda:  # each row records the peak GPU memory of its problem's audit (input sets, fp64 anchors, swaps)
        torch.cuda.reset_peak_memory_stats()
    with out.open("w") as fh:
        def report(p, rep, secs):
            nonlocal bad
            peak = round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None
            if rep is None:
                row = {"problem": p.number, "slug": p.slug, "problem_hash": p.hash, "size": args.size, "skipped": True}
                status = "SKIPPED (audit budget spent)"
            else:
                fails = [{"check": c.name, "detail": c.detail[:500]} for c in rep.checks if not c.ok]
                row = {"problem": p.number, "slug": p.slug, "problem_hash": p.hash, "size": args.size, "skipped": False,
                       "ok": rep.ok, "n_checks": len(rep.checks), "failures": fails, "fp64_gap": rep.fp64_gap,
                       "seconds": round(secs, 2), "peak_memory_gib": peak}
                bad += not rep.ok
                status = "ok" if rep.ok else "FAIL: " + "; ".join(f["check"] for f in fails)[:200]
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(f"[audit {args.size}] {p.slug}: {status} ({secs:.1f} s" + (f", peak {peak} GiB)" if cuda else ")"),
                  flush=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats()

        results = audit_many(ps, size=args.size, device=device, budget_s=args.audit_budget_s, on_report=report)
    skipped = sum(rep is None for _, rep, _ in results)
    print(f"audit: {len(results) - skipped - bad} ok, {bad} failed, {skipped} skipped, "
          f"{time.perf_counter() - t0:.0f} s -> {out}", flush=True)
    return 1 if bad or skipped else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=None)
    ap.add_argument("--size", default="full", choices=("full", "smoke"))
    ap.add_argument("--device", default=None)
    ap.add_argument("--family", default=None)
    ap.add_argument("--problem", action="append", default=None)
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--no-characterise", action="store_true", help="Only the audit.")
    ap.add_argument("--audit-out", default=None, help="Run the audit at --size too, one JSON line per problem here.")
    ap.add_argument("--audit-budget-s", type=float, default=None, help="Wall-clock cap of the audit; the rest is skipped.")
    ap.add_argument("--pack", default=None, help="Tar the --store folder into this one file when done.")
    a = ap.parse_args()
    rc = 0
    if not a.no_characterise:
        rows = run_characterisation(store=a.store, size=a.size, device=a.device, family=a.family, only=a.problem,
                                    budget_s=a.budget_s, write=not a.no_write)
        rc |= 1 if any(not r["ok"] for r in rows) else 0
        if a.pack and a.store and not a.no_write:
            with tarfile.open(a.pack, "w") as tar:
                tar.add(a.store, arcname=Path(a.store).name)
            print(f"packed {a.store} into {a.pack}", flush=True)
    if a.audit_out:
        rc |= _audit(a)
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
