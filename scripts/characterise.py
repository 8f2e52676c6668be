#!/usr/bin/env python
"""Characterise every problem on this machine's GPU (same as `mkb-run characterise`, without the CLI's other imports).

On the GPU host, which has only torch, pyarrow, fsspec, typer and rich:

    PYTHONPATH=$PWD python scripts/characterise.py --store events/h200-characterisation

Options: --size full|smoke, --device cuda|cpu, --family F, --problem N (repeatable), --budget-s S, --no-write.
"""

from __future__ import annotations

import argparse

from mkb.problems._characterise import run_characterisation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=None)
    ap.add_argument("--size", default="full", choices=("full", "smoke"))
    ap.add_argument("--device", default=None)
    ap.add_argument("--family", default=None)
    ap.add_argument("--problem", action="append", default=None)
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    rows = run_characterisation(store=a.store, size=a.size, device=a.device, family=a.family, only=a.problem,
                                budget_s=a.budget_s, write=not a.no_write)
    failed = [r for r in rows if not r["ok"]]
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
