#!/usr/bin/env bash
# eng_attrib.sh OUTDIR - issue 44 item 1 on a GPU: an engine that keeps all its code in one
# namespace is never folded into main. tests/progs/attrib/eng.cpp (a templated
# eng::mem::DeviceBuffer<T> used by eng::Attention::reserve (1.5 GiB), eng::Model::load
# (400 MiB) and a lambda of eng::Server::start (32 MiB)) is built against the CUDA runtime
# (cudaMalloc: -DENG_CUDART) by nvcc at -O0 and -O2 -g and by g++ at -O2 -g, then for each build:
#   1. run unbudgeted: the run summary, `report` (text, --json) and `report --html` name the
#      three callers, each with eng.cpp:LINE, and main is no site
#   2. run with every size halved (--scale 2): `diff --json` matches the three, all shrunk
#   3. --budget 16MiB (below each allocation): the shim's three denial lines and the launcher's
#      three lines name the three callers with eng.cpp:LINE
#   4. the same with --no-trace: the shim's lines
#   5. the environment contract without the launcher (LD_PRELOAD, CUDATRACE_GROUP,
#      CUDATRACE_BUDGET): the shim's lines, read from the binary's own DWARF
# Prints each headline and PASS/FAIL lines; exit 0 when all pass. Needs nvcc, g++ and a GPU; no
# network. ENG_SIM=1 runs the same checks on cudatrace's simulated driver (no GPU, no nvcc:
# the driver API build), which is how this script was checked where it was written.
set -u
. "$(dirname "$0")/common.sh"
export PYTHONUNBUFFERED=1 COLUMNS=250
SRC=$REPO/tests/progs/attrib/eng.cpp
SIM=()
fails=0
check() { # check NAME COND-EXIT-STATUS
    if [ "$2" = 0 ]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
ct() { timeout 180 python3 -m cudatrace "$@"; }

declare -A BUILDS
if [ "${ENG_SIM:-0}" = 1 ]; then
    LIBDIR=$(python3 -c 'from cudatrace import simdriver; print(simdriver.build(simdriver.cache_libdir())["libdir"])')
    SIM=(--simulated --sim-memory 16GiB)
    for o in O0 O2; do
        g++ -$o -g -I"$REPO/tests/progs/attrib" -o "$OUT/eng-sim-$o" "$SRC" -L"$LIBDIR" \
            -Wl,-rpath,"$LIBDIR" -lcuda || { echo "FAIL build sim-$o"; exit 2; }
        BUILDS[sim-$o]=$OUT/eng-sim-$o
    done
else
    NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
    CUDA=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
    for o in O0 O2; do
        "$NVCC" -$o -g -DENG_CUDART -o "$OUT/eng-nvcc-$o" "$SRC" || { echo "FAIL nvcc -$o"; exit 2; }
        BUILDS[nvcc-$o]=$OUT/eng-nvcc-$o
    done
    g++ -O2 -g -DENG_CUDART -I"$CUDA/include" -o "$OUT/eng-gxx-O2" "$SRC" -L"$CUDA/lib64" \
        -Wl,-rpath,"$CUDA/lib64" -lcudart || { echo "FAIL g++ -O2"; exit 2; }
    BUILDS[gxx-O2]=$OUT/eng-gxx-O2
fi

# the three callers, each named once with eng.cpp:LINE, in the lines of FILE that match GREP
three() { # three FILE GREP-PATTERN SED-EXPRESSION (extracts NAME (eng.cpp:N) from a line)
    grep -E "$2" "$1" | sed -E "$3" | sort >"$1.named"
    sed -E 's/ \(eng\.cpp:[0-9]+\)$//' "$1.named" | sort -u | tr '\n' ';' >"$1.names"
    [ "$(cat "$1.names")" = "eng::Attention::reserve;eng::Model::load;eng::Server::start::{lambda};" ] &&
        [ "$(grep -cE ' \(eng\.cpp:[0-9]+\)$' "$1.named")" -ge 3 ]
}
SHIM_AT='s/.*; at ([^ ]+ \([^)]*\)).*/\1/'

for b in $(echo "${!BUILDS[@]}" | tr ' ' '\n' | sort); do
    EXE=${BUILDS[$b]}
    D=$OUT/$b
    rm -rf "$D"
    mkdir -p "$D"
    echo "== $b: $EXE"
    ct run "${SIM[@]}" -o "$D/free" -- "$EXE" >"$D/free.out" 2>"$D/free.err"
    echo "   exit $?"
    grep ' x  ' "$D/free.err" | sed 's/^/   summary: /'
    three "$D/free.err" ' x  ' 's/.* x  ([^ ]+ \(eng\.cpp:[0-9]+\)).*/\1/'
    check "$b: run summary names the three callers" $?
    ct report "$D/free" --html "$D/free.html" >"$D/report.txt" 2>&1
    three "$D/report.txt" ' #[0-9] [^ ]' 's/.* #[0-9] ([^ ]+ \([^)]*\)).*/\1/'
    check "$b: report names the three callers" $?
    ! sed -n '1,/Call stacks/p' "$D/report.txt" | grep -q ' #[0-9] main '
    check "$b: main is no site" $?
    ct report "$D/free" --json >"$D/report.json" 2>/dev/null
    python3 - "$D/report.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
got = {s["label"].rsplit(" (", 1)[0]: (s["count"], s["bytes"]) for s in d["sites"]}
print("   report --json:", got)
want = {"eng::Attention::reserve": (1, 1536 << 20), "eng::Model::load": (1, 400 << 20),
        "eng::Server::start::{lambda}": (1, 32 << 20)}
sys.exit(0 if got == want else 1)
PY
    check "$b: report --json: three sites, 1.5 GiB, 400 MiB, 32 MiB" $?
    n=0
    for name in 'eng::Attention::reserve (eng.cpp:' 'eng::Model::load (eng.cpp:' \
        'eng::Server::start::{lambda} (eng.cpp:'; do
        grep -qF "$name" "$D/free.html" && n=$((n + 1))
    done
    [ $n = 3 ]
    check "$b: report --html names the three callers" $?

    ct run "${SIM[@]}" -q -o "$D/half" -- "$EXE" --scale 2 >/dev/null 2>&1
    ct diff "$D/free" "$D/half" --json >"$D/diff.json" 2>/dev/null
    python3 - "$D/diff.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
got = {s["label"].rsplit(" (", 1)[0]: s["status"] for s in d["sites"]}
print("   diff:", got)
names = ("eng::Attention::reserve", "eng::Model::load", "eng::Server::start::{lambda}")
sys.exit(0 if got == {n: "shrunk" for n in names} else 1)
PY
    check "$b: diff matches the three callers" $?

    ct run "${SIM[@]}" -o "$D/deny" --budget 16MiB -- "$EXE" >"$D/deny.out" 2>"$D/deny.err"
    echo "   exit $?"
    grep -E 'budget exceeded|cudatrace: denied' "$D/deny.err" | cut -c1-220 | sed 's/^/   /'
    three "$D/deny.err" 'budget exceeded' "$SHIM_AT"
    check "$b: the shim's denial lines name the three callers with eng.cpp:LINE" $?
    three "$D/deny.err" '^cudatrace: denied ' 's/.* at ([^ ]+ \(eng\.cpp:[0-9]+\)).*/\1/'
    check "$b: the launcher's denial lines name the three callers" $?

    ct run "${SIM[@]}" -q --no-trace --budget 16MiB -- "$EXE" >"$D/notrace.out" 2>"$D/notrace.err"
    three "$D/notrace.err" 'budget exceeded' "$SHIM_AT"
    check "$b: --no-trace: the shim's lines name the three callers" $?

    LEDGERS=$D/ledgers
    mkdir -m 700 "$LEDGERS"
    ENVB=(env LD_PRELOAD="$REPO/cudatrace/_native/libcudatrace.so" CUDATRACE_LEDGER_DIR="$LEDGERS"
          CUDATRACE_GROUP="eng-$b" CUDATRACE_BUDGET=16MiB)
    if [ "${ENG_SIM:-0}" = 1 ]; then # a simulated device of its own for the run
        : >"$D/sim.state"
        ENVB+=(LD_LIBRARY_PATH="$LIBDIR" CUDASIM_STATE="$D/sim.state" CUDASIM_TOTAL_BYTES=$((16 << 30)))
    fi
    "${ENVB[@]}" "$EXE" >"$D/env.out" 2>"$D/env.err"
    grep 'budget exceeded' "$D/env.err" | cut -c1-220 | sed 's/^/   env: /'
    three "$D/env.err" 'budget exceeded' "$SHIM_AT"
    check "$b: environment contract, no launcher: the shim's lines name the three callers" $?
done

echo "== eng_attrib: $fails failed"
[ "$fails" = 0 ]
