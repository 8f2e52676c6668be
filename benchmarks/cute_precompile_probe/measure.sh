#!/bin/bash
# CPU-clock variant. alternate record (real pipeline) and replay (trusted build read) processes; 6 reps each (rep 0 = first compile)
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
for round in 1 2; do for p in 1 23 25 28 72; do for m in record replay; do
  CLOCK=cpu PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD ${PY:-python3} benchmarks/cute_precompile_probe/probe.py $m $p /tmp/cp/mc/p$p 6 > /tmp/cp/mc/$m-p$p-r$round.log 2>&1 || echo "FAIL $m $p $round"
done; done; done
