#!/usr/bin/env bash
# Grades the doc packs' worked examples (mkb/dsl/docs/<dsl>/examples/<family>/9N_name/) on the GPU exactly as
# baselines are graded: `mkb-run grade --baselines --problems-root <pack>/examples`, one run per DSL (each pack
# holds its own copy of the problems and only its own DSL's kernels). Optional arguments name catalog problems
# whose baselines to grade in the same session first (e.g. 23).
#
#   export PYTHONPATH=/tmp/mkb-site/nvidia_cutlass_dsl/dsl_packages:/tmp/mkb-site:$PWD CUDA_PATH=/usr/local/cuda \
#          CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
#   OUT=$OUT bash scripts/gpu_examples_run.sh 23 2>&1 | tee $OUT/log
#
# $OUT gets: baselines.json / examples-<dsl>.json (every verdict, `mkb-run grade --json`), their stderr logs,
# events.tar.gz (the store: store/kind=<kind>/*.parquet) and the summary table printed at the end.
set -u
OUT=${OUT:?set OUT to the folder whose files come back}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
WORK=$(mktemp -d)
STORE="$WORK/store"
rc=0
if [ "$#" -gt 0 ]; then
  python3 -m mkb.cli.run grade --baselines "$@" --store "$STORE" --json >"$OUT/baselines.json" 2>"$OUT/baselines.log" || rc=1
fi
for dsl in cute tirx; do
  python3 -m mkb.cli.run grade --baselines --problems-root "mkb/dsl/docs/$dsl/examples" --store "$STORE" --json \
    >"$OUT/examples-$dsl.json" 2>"$OUT/examples-$dsl.log" || rc=1
done
[ -d "$STORE" ] && tar czf "$OUT/events.tar.gz" -C "$WORK" store
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"{'set':<14} {'problem':>7} {'dsl':<5} {'verdict':<22} {'median us':>10} {'eager us':>10} {'speedup':>8}")
for f in sorted(out.glob("*.json")):
    text = f.read_text()
    # the JSON array starts a line (anything printed before it is the console's)
    start = 0 if text.startswith("[") else text.find("\n[") + 1
    try:
        rows = json.loads(text[start:]) if start > 0 or text.startswith("[") else []
    except ValueError as exc:
        print(f"{f.name}: unreadable ({exc})")
        continue
    for v in rows:
        if "error" in v:
            print(f"{f.stem:<14} {'':>7} {'':<5} error: {v['error'][:60]}")
            continue
        verdict = "passed" if v.get("passed") else (v.get("reason") or "failed")
        fmt = lambda x, p: f"{x:.{p}f}" if isinstance(x, (int, float)) else "-"  # noqa: E731
        print(f"{f.stem:<14} {v['problem']:>7} {v['dsl']:<5} {verdict:<22} {fmt(v.get('candidate_median_us'), 1):>10} "
              f"{fmt(v.get('eager_median_us'), 1):>10} {fmt(v.get('speedup'), 2):>8}")
PY
exit $rc
