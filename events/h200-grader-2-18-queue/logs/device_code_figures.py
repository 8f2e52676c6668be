"""The README's device-code figures of this run, read from its summary.json: states, reads, and where the time went.

    python events/h200-grader-2-18-queue/logs/device_code_figures.py > events/h200-grader-2-18-queue/logs/device_code_figures.log
"""

import json
import statistics
from collections import Counter
from pathlib import Path

summary = json.loads((Path(__file__).parent / "summary.json").read_text())
made = [r for r in summary["queue"].values() if isinstance(r.get("device_code"), dict)]
print(f"{len(made)} TIRx gradings with a device-code record; states {dict(Counter(r['device_code']['state'] for r in made))}")
print(f"worker reads: {summary['result']['device_code']}")
print(f"fork servers: {summary.get('precompile_servers')}")
for key in ("waited_s", "sandbox_s", "build_s", "seconds"):
    xs = [r["device_code"][key] for r in made if r["device_code"].get(key) is not None]
    print(f"{key}: n {len(xs)}, median {statistics.median(xs):.2f}, min {min(xs):.2f}, max {max(xs):.2f}")
for r in made:
    if r["device_code"]["state"] != "ready":
        print(f"{r['key']}: {r['device_code']['state']}: {r['device_code'].get('note', '')[:120]!r}")
guards = Counter(r["device_code"].get("sandbox", "") for r in made if r["device_code"]["state"] == "ready")
print(f"sandbox guards lines among the ready: {len(guards)} distinct, {sum(guards.values())} sandboxes")
red = [r for k, r in summary["queue"].items() if k.startswith("redteam/") and "control" not in k]
print(f"red-team forms graded {len(red)}, passed {sum(r['passed'] for r in red)}")
