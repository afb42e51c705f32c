#!/usr/bin/env bash
# Round 2's GPU proofs in one command, for any CUDA machine with PyTorch, CuPy and JAX (each is
# skipped with a line saying so when absent). Run from the repository root:
#   tools/gpu/round2.sh OUTDIR STEP...
# Steps (each writes OUTDIR/<step>.log and prints its last lines):
#   suite      tests/gpu (nvcc programs incl. the allocator-layer C++ engine, PyTorch, JAX, CuPy,
#              budgets): the attribution headlines are in the GPU-SUITE lines
#   pyframes   tools/gpu/workloads/pyframes_check.py: the top site names the script's line
#   memviz     a PyTorch trace exported as memory-viz, rendered by torch.cuda._memory_viz
#   group      tools/gpu/group_budget.sh: 4 processes under one group budget, NVML's view
#   sweep      tools/gpu/sweep_torch.sh (SWEEPS="1 2 5" by default)
#   aggregate  an --aggregate run of a loop of stream-ordered allocations (AGG_SECONDS, 120)
#   demo       cudatrace demo on the GPU (trace, report, diff, budget, sweep)
#   bench      tools/bench_overhead.py --cases async_1MiB,startup
set -u
OUT=${1:?usage: round2.sh OUTDIR STEP...}
shift
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
make -s -C native OUT=../cudatrace/_native || { echo "shim build failed"; exit 1; }
nvidia-smi -L 2>&1 | head -2
step() {  # step NAME CMD...: run, log, show the tail
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local st=$?
    echo "=== $name: exit $st in $((SECONDS - t0)) s"
    tail -n "${TAIL:-25}" "$OUT/$name.log"
}
for what in "$@"; do
    case $what in
        suite)
            step suite env CUDATRACE_GPU_SUMMARY="$OUT/gpu-suite.jsonl" timeout "${SUITE_TIMEOUT:-420}" \
                python3 -m pytest tests/gpu -v -s -rs -p no:cacheprovider ${SUITE_ARGS:-} ;;
        pyframes)
            step pyframes timeout 300 python3 tools/gpu/workloads/pyframes_check.py --out "$OUT/pyframes" ;;
        memviz)
            rm -rf "$OUT/mv.trace"
            step memviz bash -c "python3 -m cudatrace run -q -o '$OUT/mv.trace' -- python3 \
                tools/gpu/workloads/torch_alloc.py && python3 tools/gpu/check_memory_viz.py \
                '$OUT/mv.trace' -o '$OUT/memviz'" ;;
        group)
            step group timeout 300 bash tools/gpu/group_budget.sh "$OUT/group" ;;
        sweep)
            step sweep timeout 420 bash tools/gpu/sweep_torch.sh "$OUT/sweep" ${SWEEPS:-1 2 5} ;;
        aggregate)
            step aggregate timeout $(( ${AGG_SECONDS:-120} + 120 )) bash tools/gpu/aggregate_check.sh \
                "$OUT/aggregate" "${AGG_SECONDS:-120}" "${AGG_PERIOD:-20}" ;;
        demo)
            rm -rf /tmp/ct-demo
            step demo timeout 240 python3 -m cudatrace demo -o /tmp/ct-demo ;;
        bench)
            step bench timeout 400 python3 tools/bench_overhead.py --out "$OUT/bench" \
                --cases async_1MiB,startup ${BENCH_ARGS:-} ;;
        *) echo "round2.sh: unknown step $what" ;;
    esac
done
