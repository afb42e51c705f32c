#!/usr/bin/env bash
# bench_callgrind.sh SHIMDIR [PAIRS] - instructions per async alloc+free pair added by the shim,
# counted by callgrind on the simulated driver (no GPU; deterministic on a busy machine).
#
#   SHIMDIR  folder holding libcudatrace.so (e.g. cudatrace/_native, or a build of another
#            commit: make -C native OUT=/tmp/other)
# Runs tools/bench_pairs.c with PAIRS and with 2*PAIRS pairs, bare and with the shim preloaded
# (stacks on, depth 64, tracing to a temporary folder), and prints the instructions per pair of
# each (the difference of the two runs over PAIRS, so start-up and exit cancel) and their
# difference: what the shim adds to one pair.
set -euo pipefail
SHIMDIR=$(cd "${1:?usage: bench_callgrind.sh SHIMDIR [PAIRS]}" && pwd)
PAIRS=${2:-2000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"
LIBDIR=$(python3 -c 'import sys; from cudatrace import simdriver; print(simdriver.build(sys.argv[1])["libdir"])' "$WORK/lib")
${CC:-cc} -O2 -g -Inative/include -o "$WORK/bench_pairs" tools/bench_pairs.c -L"$LIBDIR" -lcuda
count() {  # count N [env...] -> instructions of the whole run
    local n=$1; shift
    rm -rf "$WORK/trace"; mkdir "$WORK/trace"
    env LD_LIBRARY_PATH="$LIBDIR" "$@" valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
        "$WORK/bench_pairs" "$n" >/dev/null 2>"$WORK/vg.err" || { cat "$WORK/vg.err" >&2; exit 1; }
    sed -n 's/^summary: //p' "$WORK/cg.out"
}
SHIM=(LD_PRELOAD="$SHIMDIR/libcudatrace.so" LD_BIND_NOW=1 CUDATRACE_DIR="$WORK/trace" CUDATRACE_STACK_DEPTH=${DEPTH:-64})
b1=$(count "$PAIRS"); b2=$(count $((2 * PAIRS)))
s1=$(count "$PAIRS" "${SHIM[@]}"); s2=$(count $((2 * PAIRS)) "${SHIM[@]}")
bare=$(( (b2 - b1) / PAIRS )); shim=$(( (s2 - s1) / PAIRS ))
echo "instructions per async pair: bare $bare, shim $shim, added $((shim - bare))  ($SHIMDIR)"
