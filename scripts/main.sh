#!/usr/bin/env bash
# The main job on the default store (events/local): everything mkb can run end to end today.
#   1. the problem catalog;  2. characterise every problem (GPU: full size; else CPU: smoke size);
#   3. with a GPU and the DSLs: grade every baseline kernel found in the problem folders;  4. analyse what was written.
# Until the agent lands, the analysis of experiment arms is shown on a synthetic dataset (its own store).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=problems
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1; extras=problems,dsl
else
  gpu=0
fi
venv=$(scripts/setup-venv.sh "$extras" | tail -n 1)
export PATH="$PWD/$venv/bin:$PATH"
store="${MKB_STORE:-events/local}"
echo "== mkb main job; store: $store; GPU: $([ $gpu = 1 ] && echo yes || echo no)"

mkb-run problems list

if [ $gpu = 1 ]; then
  mkb-run characterise --store "$store" --size full
  # every baseline the problem folders hold, through one grading queue; a failed grade is a verdict, not a job failure
  mkb-run grade --baselines --store "$store" || true
else
  echo "(no GPU: characterising at smoke size on the CPU; grading needs a GPU and is skipped)"
  mkb-run characterise --store "$store" --size smoke --device cpu
fi

mkb-analyze problems --store "$store"

synth="events/local-synthetic"
echo "== analysis demo on a synthetic dataset with planted effects ($synth)"
rm -rf "$synth"  # derived demo data only: rebuilt from its seed on every run
mkb-analyze synth --store "$synth"
mkb-analyze lift --store "$synth"
