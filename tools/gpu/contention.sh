#!/usr/bin/env bash
# contention.sh OUTDIR [ROUNDS] [THREADS...] - where the shim's cost goes when many threads
# allocate from one device's pool at once (on a CUDA machine, from the repository root).
#
# Two sets of runs, ROUNDS rounds (default 5) alternated in this one invocation, medians:
#  1. without the shim, tools/gpu/contention_probe.cu: each thread makes one driver query before
#     each cudaMallocAsync (none, cuCtxGetCurrent, cuStreamGetCtx, cuStreamGetCtx +
#     cuCtxGetDevice_v2) or ~200 ns of its own work (spin): does the query the shim makes per
#     allocation contend with the pool's calls?
#  2. tools/gpu/bench_alloc.cu `async_threads 1M T N` bare and under the shim preloaded directly
#     (no launcher): `pass` (loaded, CUDATRACE_DIR unset: pure pass-through), `notrace`
#     (CUDATRACE_MODE=none: the device lookup and the live counters, no events), `depth0`
#     (events without stacks), `stacks` (the default, 64 frames).
#  3. WORK_NS="W ..." (default none): a program that works W ns between its pairs
#     (contention_probe spin with CONTENTION_SPIN_NS=W), bare and under the shim (depth0,
#     stacks): what the shim adds to a program whose threads do something between allocations.
# THREADS defaults to "1 4 16". Prints one row per (set, config, threads): median ns of one
# thread's pair and the added ns and % against the set's baseline; writes OUTDIR/contention.tsv
# (every run) and OUTDIR/contention.md (the table). SETS="probe shim work" picks sets.
# SHIM=DIR uses DIR/libcudatrace.so instead of building this checkout's (an A/B of two shims).
set -u
OUT=${1:?usage: contention.sh OUTDIR [ROUNDS] [THREADS...]}
ROUNDS=${2:-5}
shift $(($# >= 2 ? 2 : 1))
THREADS=${*:-1 4 16}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
mkdir -p "$OUT/bin" "$OUT/traces"
OUT=$(cd "$OUT" && pwd)
bash tools/gpu/build.sh "$OUT/bin" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
if [ -z "${SHIM:-}" ]; then
    make -s -C native OUT=../cudatrace/_native || exit 1
    SHIM=$ROOT/cudatrace/_native
fi
SHIM=$(cd "$SHIM" && pwd)/libcudatrace.so
pairs_for() { case $1 in 1) echo 50000 ;; 4) echo 20000 ;; *) echo 8000 ;; esac; }
TSV=$OUT/contention.tsv
: >"$TSV"
one() {  # set config threads argv... -> appends "set config threads ns" to the tsv
    local set=$1 config=$2 t=$3
    shift 3
    local ns
    ns=$("$@" 2>>"$OUT/errors.log" | awk '/^ns_per_op/ {print $2}')
    if [ -z "$ns" ]; then
        echo "contention.sh: no figure from $set/$config/$t ($*)" >>"$OUT/errors.log"
        return
    fi
    printf '%s\t%s\t%s\t%s\n' "$set" "$config" "$t" "$ns" >>"$TSV"
}
SETS=${SETS:-probe shim${WORK_NS:+ work}}
has() { case " $SETS " in *" $1 "*) return 0 ;; esac; return 1; }
shimmed() {  # set config threads argv...: the command under config (pass, notrace, depth0, stacks)
    local set=$1 c=$2 t=$3
    shift 3
    if [ "$c" = bare ]; then
        one "$set" bare "$t" "$@"
        return
    fi
    if [ "$c" = pass ]; then
        one "$set" pass "$t" env LD_PRELOAD="$SHIM" LD_BIND_NOW=1 "$@"
        return
    fi
    rm -rf "$OUT/traces/$c"
    mkdir -p "$OUT/traces/$c"
    local mode=full depth=64
    [ "$c" = notrace ] && mode=none
    [ "$c" = depth0 ] && depth=0
    one "$set" "$c" "$t" env LD_PRELOAD="$SHIM" LD_BIND_NOW=1 CUDATRACE_DIR="$OUT/traces/$c" \
        CUDATRACE_MODE=$mode CUDATRACE_STACK_DEPTH=$depth "$@"
}
for r in $(seq "$ROUNDS"); do
    for t in $THREADS; do
        n=$(pairs_for "$t")
        if has probe; then
            for q in none ctx sctx sctx_dev spin; do
                one probe "$q" "$t" "$OUT/bin/contention_probe" "$q" 1048576 "$t" "$n"
            done
        fi
        if has shim; then
            for c in bare pass notrace depth0 stacks; do
                shimmed shim "$c" "$t" "$OUT/bin/bench_alloc" async_threads 1M "$t" "$n"
            done
        fi
        if has work; then
            for w in ${WORK_NS:-}; do
                for c in bare depth0 stacks; do
                    shimmed "work$w" "$c" "$t" env CONTENTION_SPIN_NS="$w" \
                        "$OUT/bin/contention_probe" spin 1048576 "$t" "$n"
                done
            done
        fi
    done
    echo "round $r done"
done
python3 - "$TSV" "$OUT/contention.md" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    s, c, t, ns = line.split("\t")
    runs[(s, c, int(t))].append(float(ns))
def base(s):
    return "none" if s == "probe" else "bare"
out = ["| set | config | threads | runs | median ns a pair | added ns | added % |",
       "|---|---|---|---|---|---|---|"]
ORDER = ["none", "ctx", "sctx", "sctx_dev", "spin", "bare", "pass", "notrace", "depth0", "stacks"]
for (s, c, t) in sorted(runs, key=lambda k: (k[0], k[2], ORDER.index(k[1]))):
    med = statistics.median(runs[(s, c, t)])
    b = runs.get((s, base(s), t))
    if b and c != base(s):
        bm = statistics.median(b)
        add, pct = f"{med - bm:+,.0f}", f"{100 * (med - bm) / bm:+.1f}%"
    else:
        add = pct = "-"
    out.append(f"| {s} | {c} | {t} | {len(runs[(s, c, t)])} | {med:,.0f} | {add} | {pct} |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
