"""This run's summary.json and log did not come back from the device (at most 8 files return per call), so its queue
verdicts are read here from its events: each verdict's kernel is named by matching its kernel_sha256 against the jobs
scripts/gpu_queue_run.py builds (baselines and red-team forms, written afresh), and judged as that script judges.

    python events/h200-grader-2-17-queue/logs/from_events.py > events/h200-grader-2-17-queue/logs/from_events.log
"""

import collections
import glob
import hashlib
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests" / "redteam"), str(ROOT)]
import gpu_queue_run as qr  # noqa: E402


def read(kind: str) -> list[dict]:
    files = sorted(glob.glob(str(ROOT / "events" / "h200-grader-2-17-queue" / f"kind={kind}" / "*.parquet")))
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist() if files else []


cases: dict = {}  # a control is its problem's baseline, byte for byte: one kernel, two jobs
for c in qr.cases(Path(tempfile.mkdtemp())):
    cases.setdefault(hashlib.sha256(Path(c.path).read_bytes()).hexdigest(), []).append(c)
compiles = {c["evaluation_id"]: c for c in read("compile")}
made = collections.Counter()
hits = collections.Counter()
rows = []
for v in sorted(read("verdict"), key=lambda v: v["ts"]):
    same = cases.get(v["kernel_sha256"]) or []
    c = same[0] if same else None
    key = " = ".join(x.key for x in same) if same else f"unknown {v['kernel_sha256'][:12]}"
    ok = qr.as_expected(c, {"passed": v["passed"], "reason": v["reason"]}) if c else None
    comp = compiles.get(v["evaluation_id"]) or {}
    import json
    det = comp.get("details")
    det = json.loads(det) if isinstance(det, str) else (det or {})
    dc = det.get("device_code") or {}
    made[str(dc.get("state"))] += 1
    hits["hits"] += int(dc.get("hits") or 0)
    hits["misses"] += int(dc.get("misses") or 0)
    rows.append((key, v["reason"] or "passed", ok, dc.get("state"), dc.get("hits"), comp.get("compile_s")))
    print(f"{key:60s} -> {v['reason'] or 'passed':28s} as expected: {ok}  device code: {dc.get('state')} "
          f"hits {dc.get('hits')} compile_s {comp.get('compile_s')}")
forms = [r for r in rows if r[0].startswith("redteam/") and "control" not in r[0]]
must = [r for r in rows if not (r[0].startswith("redteam/") and "control" not in r[0])]
print(f"{len(rows)} gradings; red-team forms {sum(bool(r[2]) for r in forms)} of {len(forms)} rejected as expected; "
      f"baselines and controls {sum(bool(r[2]) for r in must)} of {len(must)} passed; device code states {dict(made)}, "
      f"worker reads {dict(hits)}")
