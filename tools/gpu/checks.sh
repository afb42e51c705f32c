#!/usr/bin/env bash
# The GPU checks in one command, for any CUDA machine with nvcc (PyTorch, CuPy and JAX where a
# step needs them; each script says what it skips). Run from the repository root:
#   tools/gpu/checks.sh OUTDIR STEP...
# Steps (each writes OUTDIR/<step>.log and prints its last lines):
#   suite      tests/gpu: nvcc programs (incl. the allocator-layer C++ engine), PyTorch, JAX,
#              CuPy, budgets; the attribution headlines are in the GPU-SUITE lines
#   attrib     tools/gpu/startup_attrib.sh: an engine-like server at start-up: report, summary,
#              sweep law and the denial (with and without -q) name its KV code
#   eng        tools/gpu/eng_attrib.sh: an engine in one namespace (cudaMalloc; nvcc -O0/-O2,
#              g++ -O2): every output and denial line names its three callers, never main
#   peaks      tools/gpu/peaks_check.sh: sequential, threaded (also --aggregate) and killed
#              peaks never above the device's or the ledger's
#   envbudget  tools/gpu/env_budget.sh: budgets from the environment alone, shares
#   pytest     tools/gpu/pytest_check.sh: the pytest plugin with PyTorch, CuPy, JAX
#   ranks      tools/gpu/ranks.sh: two torchrun "hosts" x 4 ranks as one report
#   bench      tools/gpu/bench_async_pairs.sh: the async pool pair's added cost
#   overhead   tools/bench_overhead.py --cases async_1MiB,startup (BENCH_ARGS for more)
#   pyframes   tools/gpu/workloads/pyframes_check.py: the top site names the script's line
#   memviz     a PyTorch trace exported as memory-viz, rendered by torch.cuda._memory_viz
#   group      tools/gpu/group_budget.sh: 4 processes under one group budget, NVML's view
#   sweep      tools/gpu/sweep_torch.sh (SWEEPS="1 2 5" by default)
#   aggregate  an --aggregate run of a loop of stream-ordered allocations (AGG_SECONDS, 120)
#   demo       cudatrace demo on the GPU (trace, report, diff, budget, sweep)
#   dra        tools/gpu/dra_claim.py: the DRA plugin's slice on the real NVML, a claim's
#              memory as a process's budget through the claim's CDI edits (root)
#   watch      tools/gpu/watch_check.py: the node's watch beside nvidia-smi (a fenced process,
#              one around the library, an unfenced one, one in a pid namespace of its own),
#              gpu/UUID labels, --enforce's breach-to-stop time (root for the agent's part)
#   top        tools/gpu/top_check.py: cudatrace top --once beside a PyTorch process holding
#              memory and a traced one denied by its group: its per-process figures beside
#              nvidia-smi --query-compute-apps=pid,used_memory's
set -u
OUT=${1:?usage: checks.sh OUTDIR STEP...}
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
        suite) step suite "${SUITE_TIMEOUT:-420}" env CUDATRACE_GPU_SUMMARY="$OUT/gpu-suite.jsonl" \
                python3 -m pytest tests/gpu -v -s -rs -p no:cacheprovider ${SUITE_ARGS:-} ;;
        attrib) step attrib 240 bash tools/gpu/startup_attrib.sh "$OUT/attrib" ;;
        eng) step eng 400 bash tools/gpu/eng_attrib.sh "$OUT/eng" ;;
        peaks) step peaks 120 bash tools/gpu/peaks_check.sh "$OUT/peaks" ;;
        envbudget) step envbudget 120 bash tools/gpu/env_budget.sh "$OUT/envbudget" ;;
        pytest) step pytest 240 bash tools/gpu/pytest_check.sh "$OUT/pytest" ;;
        ranks) step ranks 200 bash tools/gpu/ranks.sh "$OUT/ranks" ;;
        bench) step bench 200 bash tools/gpu/bench_async_pairs.sh "$OUT/bench" ;;
        overhead) step overhead 400 python3 tools/bench_overhead.py --out "$OUT/overhead" \
                --cases async_1MiB,startup ${BENCH_ARGS:-} ;;
        pyframes) step pyframes 300 python3 tools/gpu/workloads/pyframes_check.py \
                --out "$OUT/pyframes" ;;
        memviz) rm -rf "$OUT/mv.trace"
            step memviz 300 bash -c "python3 -m cudatrace run -q -o '$OUT/mv.trace' -- python3 \
                tools/gpu/workloads/torch_alloc.py && python3 tools/gpu/check_memory_viz.py \
                '$OUT/mv.trace' -o '$OUT/memviz'" ;;
        group) step group 300 bash tools/gpu/group_budget.sh "$OUT/group" ;;
        sweep) step sweep 420 bash tools/gpu/sweep_torch.sh "$OUT/sweep" ${SWEEPS:-1 2 5} ;;
        aggregate) step aggregate $(( ${AGG_SECONDS:-120} + 120 )) bash tools/gpu/aggregate_check.sh \
                "$OUT/aggregate" "${AGG_SECONDS:-120}" "${AGG_PERIOD:-20}" ;;
        demo) rm -rf /tmp/ct-demo
            step demo 240 python3 -m cudatrace demo -o /tmp/ct-demo ;;
        dra) step dra 180 python3 tools/gpu/dra_claim.py "$OUT/dra" ;;
        watch) TAIL=${TAIL:-80} step watch 240 python3 tools/gpu/watch_check.py "$OUT/watch" ;;
        top) TAIL=${TAIL:-40} step top 240 python3 tools/gpu/top_check.py "$OUT/top" ;;
        *) echo "checks.sh: unknown step $what" ;;
    esac
done
