"""The README's "no baseline had failed in the 1,582 baseline gradings of the datasets committed before": every verdict
of a committed dataset (other than grader 2.18's) whose kernel is byte for byte one of today's baselines.

    python events/h200-grader-bench-2-18-ab0-off/logs/baseline_gradings_before.py
"""

import hashlib
from collections import Counter
from pathlib import Path

import polars as pl

from mkb.events import read
from mkb.problems import baselines

ROOT = Path(__file__).resolve().parents[3]
shas = {hashlib.sha256(b.path.read_bytes()).hexdigest() for b in baselines(None)}
total, failed = 0, Counter()
for store in sorted((ROOT / "events").iterdir()):
    if not store.is_dir() or "2-18" in store.name:
        continue
    try:
        v = read("verdict", str(store))
    except Exception:  # noqa: BLE001 - a dataset without verdicts (characterisations, probes)
        continue
    v = v.filter(pl.col("kernel_sha256").is_in(list(shas)))
    total += v.height
    failed.update((r["problem"], r["dsl"], r["reason"]) for r in v.filter(~pl.col("passed")).iter_rows(named=True))
print(f"{total} gradings of today's baselines in the datasets before grader 2.18; failed: {dict(failed) or 'none'}")
