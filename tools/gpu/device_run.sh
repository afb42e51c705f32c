#!/usr/bin/env bash
# One command for a CUDA machine: build the shim, then run what is named.
#   tools/gpu/device_run.sh OUTDIR [suite] [demo] [bench] [report-bench]
# suite: tests/gpu/test_gpu.py (summary lines in OUTDIR/gpu-suite.jsonl, log in gpu-suite.log)
# demo:  `cudatrace demo` on the real device (log in demo.log)
# bench: tools/bench_overhead.py (OUTDIR/bench/results.{md,json})
set -u
OUT=${1:?usage: device_run.sh OUTDIR [suite] [demo] [bench]}
shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
make -s -C native OUT=../cudatrace/_native || { echo "shim build failed"; exit 1; }
nvidia-smi -L 2>&1 | head -2
for what in "$@"; do
  case $what in
    suite)
      CUDATRACE_GPU_SUMMARY=$OUT/gpu-suite.jsonl timeout "${SUITE_TIMEOUT:-420}" \
        python3 -m pytest tests/gpu -v -s -rs -p no:cacheprovider ${SUITE_ARGS:-} \
        >"$OUT/gpu-suite.log" 2>&1
      echo "suite exit $?"
      grep -E "PASSED|FAILED|SKIPPED|ERROR| passed| failed" "$OUT/gpu-suite.log" | tail -20 ;;
    demo)
      rm -rf /tmp/ct-demo
      timeout 150 python3 -m cudatrace demo -o /tmp/ct-demo >"$OUT/demo.log" 2>&1
      echo "demo exit $?" ;;
    bench)
      timeout "${BENCH_TIMEOUT:-400}" python3 tools/bench_overhead.py --out "$OUT/bench" ${BENCH_ARGS:-} \
        >"$OUT/bench.log" 2>&1
      echo "bench exit $?"
      cat "$OUT/bench/results.md" 2>/dev/null ;;
  esac
done
