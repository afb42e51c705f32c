#!/usr/bin/env bash
# group_budget.sh OUTDIR - issue 13's GPU proof: 4 processes under one group budget of 4 GiB
# (cudatrace run --group --budget 4GiB --ledger-dir) each allocate 256 MiB at a time until
# denied and hold it; NVML's per-process figures for the 4 are summed and set against the budget
# plus the stated margin (docs/budgets.md: 64 MiB a member). Done twice: with contexts counted
# (the default) and with CUDATRACE_COUNT_CONTEXTS=0 (budgets before issue 13), to show what
# counting contexts changes. Also prints `cudatrace status` while the 4 hold their memory.
# Needs nvcc and nvidia-smi. Exit 0 when the counted run stays within budget + margin.
set -u
. "$(dirname "$0")/common.sh"
NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
"$NVCC" -O2 -g -arch="${GPU_ARCH:-sm_90}" -I"$HERE" -Xcompiler -fno-omit-frame-pointer \
    -Xlinker --export-dynamic -o "$OUT/group_loop" "$HERE/group_loop.cu" || exit 2
BUDGET_MIB=4096
MARGIN_MIB=$((64 * 4))
status=0
for mode in counted uncounted; do
    LD="$OUT/ledgers-$mode"
    rm -rf "$LD"
    mkdir -m 700 "$LD"
    extra=()
    [ "$mode" = uncounted ] && export CUDATRACE_COUNT_CONTEXTS=0 || unset CUDATRACE_COUNT_CONTEXTS
    pids=()
    for i in 1 2 3 4; do
        python3 -m cudatrace run -q -o "$OUT/trace-$mode-$i" --force --ledger-dir "$LD" \
            --group gpu4 --budget ${BUDGET_MIB}MiB -- "$OUT/group_loop" 256 30 \
            >"$OUT/$mode-$i.out" 2>"$OUT/$mode-$i.err" &
        pids+=($!)
    done
    for i in 1 2 3 4; do      # wait until every member holds its memory (or has ended: denied
        for _ in $(seq 120); do   # at its first allocation, when the others' contexts fill it)
            grep -q '^held' "$OUT/$mode-$i.out" 2>/dev/null && break
            kill -0 "${pids[$((i - 1))]}" 2>/dev/null || break
            sleep 0.25
        done
    done
    sleep 1
    members=$(awk '/^held/ {print $5}' "$OUT"/$mode-*.out | sort -n | paste -sd' ')
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits >"$OUT/$mode-nvml.csv"
    python3 -m cudatrace status gpu4 --ledger-dir "$LD" >"$OUT/$mode-status.txt" 2>&1
    total=$(awk -F', *' -v want=" $members " 'index(want, " " $1 " ") {s += $2} END {print s + 0}' "$OUT/$mode-nvml.csv")
    held=$(awk '/^held/ {n += $2} END {print n * 256}' "$OUT"/$mode-*.out)
    echo "== contexts $mode: members (pids) $members"
    echo "   allocated by the 4: ${held} MiB in 256 MiB chunks"
    echo "   NVML per-process total for the 4: ${total} MiB; budget ${BUDGET_MIB} MiB + margin ${MARGIN_MIB} MiB = $((BUDGET_MIB + MARGIN_MIB)) MiB"
    sed 's/^/   /' "$OUT/$mode-status.txt"
    if [ "$mode" = counted ]; then
        if [ "$total" -le $((BUDGET_MIB + MARGIN_MIB)) ] && [ "$total" -gt 0 ]; then
            echo "   WITHIN budget + margin"
        else
            echo "   OVER budget + margin (or no NVML figures)"; status=1
        fi
    else
        echo "   over the budget by $((total - BUDGET_MIB)) MiB without counting contexts"
    fi
    wait "${pids[@]}"
done
unset CUDATRACE_COUNT_CONTEXTS
echo "== start-up (medians): see below"
python3 tools/bench_shim_start.py --runs 100
python3 tools/bench_startup.py --runs 15
python3 - "$OUT" <<'PY'
import statistics, subprocess, sys, time
out = sys.argv[1]
prog = [out + "/group_loop", "256", "0", "4"]          # CUDA init, one kernel, 4 x 256 MiB
cmds = {"plain": prog,
        "shim only (LD_PRELOAD, pass-through)": prog,
        "cudatrace run": ["python3", "-m", "cudatrace", "run", "-q", "--force", "-o",
                          out + "/st", "--"] + prog}
import os
from cudatrace import native
envs = {"plain": dict(os.environ),
        "shim only (LD_PRELOAD, pass-through)": dict(os.environ, LD_PRELOAD=str(native.shim_path())),
        "cudatrace run": dict(os.environ)}
ts = {k: [] for k in cmds}
for _ in range(11):
    for k, c in cmds.items():
        t = time.perf_counter()
        subprocess.run(c, env=envs[k], stdout=subprocess.DEVNULL)
        ts[k].append(time.perf_counter() - t)
print("a small CUDA program (init, one kernel, 4 x 256 MiB), median of 11:")
base = statistics.median(ts["plain"])
for k, v in ts.items():
    m = statistics.median(v)
    print("  %-40s %7.1f ms  (+%.1f ms)" % (k, m * 1000, (m - base) * 1000))
PY
exit $status
