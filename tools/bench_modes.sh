#!/usr/bin/env bash
# bench_modes.sh [PAIRS] - instructions per async alloc+free pair in each mode of `cudatrace run`,
# counted by callgrind on the simulated driver (no GPU; deterministic on a busy machine), with
# the ratio to the uninstrumented run:
#   bare                   bench_pairs alone
#   full                   cudatrace run (compact events, stacks at depth 64)
#   aggregate              cudatrace run --aggregate
#   full + budget          cudatrace run --budget 1GiB
#   no-trace + budget      cudatrace run --no-trace --budget 1GiB (the ledger, nothing written)
#   shared + budget        the same in a group of a shared ledger directory (sticky), beside
#                          another user's part of the group when run as root (a part of uid
#                          65534): each reservation looks at the directory and reads that part
#                          (docs/budgets.md, "Shared ledger directories"; system calls cost
#                          time that instructions do not show: tests/ledger/parts_test.c bench)
# "no-trace + budget" minus "bare" is what the ledger costs; "full + budget" minus it is what
# the trace adds on top.
# Each figure is the difference of a run of PAIRS and of 2*PAIRS pairs over PAIRS, so start-up
# and exit cancel. The command runs under `cudatrace run`, which preloads the shim into
# valgrind's guest (valgrind itself makes no CUDA call).
set -euo pipefail
PAIRS=${1:-2000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"
LIBDIR=$($PY -c 'import sys; from cudatrace import simdriver; print(simdriver.build(sys.argv[1])["libdir"])' "$WORK/lib")
$PY -c 'from cudatrace import native; native.ensure_built()'
${CC:-cc} -O2 -g -Inative/include -o "$WORK/bench_pairs" tools/bench_pairs.c -L"$LIBDIR" -lcuda
mkdir -p "$WORK/ledgers" && chmod 700 "$WORK/ledgers"
export CUDATRACE_LEDGER_DIR="$WORK/ledgers"
mkdir -p "$WORK/shared" && chmod 1777 "$WORK/shared"
if [ "$(id -u)" = 0 ]; then  # another user's part of group g, made by uid 65534
    chmod 755 "$WORK"
    setpriv --reuid=65534 --regid=65534 --clear-groups env PYTHONPATH="$ROOT" $PY -c 'import sys
from cudatrace.record.ledger import Ledger
Ledger.create(sys.argv[1] + "/g@65534.ledger", {d: 1 << 30 for d in range(16)}, group="g").close()' \
        "$WORK/shared"
fi
count() {  # count N [cudatrace run options...] -> instructions of the guest's whole run
    local n=$1; shift
    rm -rf "$WORK/trace" "$WORK"/cg.out*
    local vg=(valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out.%p" "$WORK/bench_pairs" "$n")
    if [ "$#" -eq 0 ]; then
        env LD_LIBRARY_PATH="$LIBDIR" "${vg[@]}" >/dev/null 2>"$WORK/vg.err" || { cat "$WORK/vg.err" >&2; exit 1; }
    else
        env LD_LIBRARY_PATH="$LIBDIR" $PY -m cudatrace run -q "$@" -- "${vg[@]}" >/dev/null 2>"$WORK/vg.err" || { cat "$WORK/vg.err" >&2; exit 1; }
    fi
    sed -n 's/^summary: //p' "$WORK"/cg.out.* | sort -n | tail -1
}
per_pair() {  # per_pair [options...] -> instructions per pair
    local a b
    a=$(count "$PAIRS" "$@"); b=$(count $((2 * PAIRS)) "$@")
    echo $(( (b - a) / PAIRS ))
}
bare=$(per_pair)
printf '%-22s %8s %8s %8s\n' mode "ins/pair" added ratio
printf '%-22s %8d %8d %8s\n' bare "$bare" 0 1.00
for mode in full aggregate full+budget no-trace+budget shared+budget; do
    dir=$WORK/ledgers
    case $mode in
        full) opts=(-o "$WORK/trace") ;;
        aggregate) opts=(--aggregate -o "$WORK/trace") ;;
        full+budget) opts=(--budget 1GiB -o "$WORK/trace") ;;
        no-trace+budget) opts=(--no-trace --budget 1GiB) ;;
        shared+budget) opts=(--no-trace --budget 1GiB --group g); dir=$WORK/shared ;;
    esac
    v=$(CUDATRACE_LEDGER_DIR=$dir per_pair "${opts[@]}")
    printf '%-22s %8d %8d %8s\n' "$mode" "$v" $((v - bare)) "$(awk -v a="$v" -v b="$bare" 'BEGIN{printf "%.2f", a/b}')"
done
