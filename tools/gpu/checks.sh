#!/usr/bin/env bash
# Round 3's GPU proofs, for any CUDA machine with nvcc (PyTorch, CuPy and JAX where a step needs
# them; each script says what it skips). Run from the repository root:
#   tools/gpu/round3.sh OUTDIR STEP...
# Steps (each writes OUTDIR/<step>.log and prints its last lines):
#   suite      tests/gpu: nvcc programs, PyTorch, JAX, CuPy, budgets
#   attrib     tools/gpu/startup_attrib.sh: an engine-like server at start-up: report, summary,
#              sweep law and the denial (with and without -q) name its KV code (issue 20)
#   peaks      tools/gpu/harden_peaks.sh: sequential, threaded (also --aggregate) and killed
#              peaks never above the device's or the ledger's (issue 21)
#   envbudget  tools/gpu/env_budget.sh: budgets from the environment alone, shares (issue 24)
#   pytest     tools/gpu/pytest_check.sh: the pytest plugin with PyTorch, CuPy, JAX (issue 23)
#   ranks      tools/gpu/ranks.sh: two torchrun "hosts" x 4 ranks as one report (issue 24)
#   bench      tools/gpu/bench_async_pairs.sh: the async pool pair's added cost (issue 25)
set -u
OUT=${1:?usage: round3.sh OUTDIR STEP...}
shift
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
make -s -C native OUT=../cudatrace/_native || { echo "shim build failed"; exit 1; }
nvidia-smi -L 2>&1 | head -2
step() {  # step NAME SECONDS CMD...: run under a time limit, log, show the tail
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local st=$?
    echo "=== $name: exit $st in $((SECONDS - t0)) s"
    tail -n "${TAIL:-30}" "$OUT/$name.log"
}
for what in "$@"; do
    case $what in
        suite) step suite 300 env CUDATRACE_GPU_SUMMARY="$OUT/gpu-suite.jsonl" \
                python3 -m pytest tests/gpu -v -s -rs -p no:cacheprovider ;;
        attrib) step attrib 240 bash tools/gpu/startup_attrib.sh "$OUT/attrib" ;;
        peaks) step peaks 120 bash tools/gpu/harden_peaks.sh "$OUT/peaks" ;;
        envbudget) step envbudget 120 bash tools/gpu/env_budget.sh "$OUT/envbudget" ;;
        pytest) step pytest 240 bash tools/gpu/pytest_check.sh "$OUT/pytest" ;;
        ranks) step ranks 200 bash tools/gpu/ranks.sh "$OUT/ranks" ;;
        bench) step bench 200 bash tools/gpu/bench_async_pairs.sh "$OUT/bench" ;;
        *) echo "round3.sh: unknown step $what" ;;
    esac
done
