#!/usr/bin/env bash
# One GPU call: the queue pass against this session's serial pass when the GPU is the same one, else the floor-hold A/B.
export PYTHONPATH=/tmp/mkb-site/nvidia_cutlass_dsl/dsl_packages:/tmp/mkb-site:$PWD CUDA_PATH=/usr/local/cuda CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
echo "gpu $uuid"
if [ "${1:-auto}" = queue ] || { [ "${1:-auto}" = auto ] && [ "$uuid" = GPU-329700ca-04ea-3acb-b541-361a6f51d6ee ]; }; then
  timeout 560 python3 scripts/gpu_queue_run.py --out $OUT --name h200-grader-2-9 --sections queue \
    --serial-from events/h200-grader-2-9/logs/serial-summary.json --budget-s 500 > $OUT/log 2>&1; echo rc=$?
  tail -4 $OUT/log
else
  mkdir -p $OUT/ab $OUT/bench
  timeout 330 python3 scripts/gpu_checks_ab.py --out $OUT/ab --name h200-checks-ab-floorhold --b-arm floorhold \
    --problems 1,25,28,72 --rounds 1 --budget-s 280 > $OUT/ab/log 2>&1; echo ab rc=$?
  tail -3 $OUT/ab/log
  timeout 220 python3 benchmarks/grader_bench.py --sections backlog --problem 72 --repeats 4 --depth 6 --low-water 2 \
    --floor-hold-us 150 --out $OUT/bench --name h200-grader-bench-floorhold --budget-s 180 > $OUT/bench/log 2>&1; echo bench rc=$?
  grep FIGURE $OUT/bench/log
fi
ls -R $OUT
