#!/usr/bin/env bash
# contention.sh OUTDIR [ROUNDS] [THREADS...] - where the shim's cost goes when many threads
# allocate from one device's pool at once (on a CUDA machine, from the repository root).
#
# Two sets of runs, ROUNDS rounds (default 7) in this one invocation, medians; every round runs
# each config once, in an order rotated by one each round (no config always first or always
# right after another):
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
#  HAMI_LIB=PATH (a HAMi-core libvgpu.so built from its source there, as its build script does):
#     the shim set also runs the same probe under it (config `hami`: LD_PRELOAD=PATH, a memory
#     limit as HAMi's device plugin sets one, CUDA_DEVICE_MEMORY_LIMIT=HAMI_LIMIT (default
#     65536m, far above what the probe holds), its shared cache in OUTDIR), beside the shim.
# THREADS defaults to "1 4 16". Prints one row per (set, config, threads): median ns of one
# thread's pair and the added ns and % against the set's baseline; then the shim set as issue 42
# shows it (a row per config, a column per thread count: ns a pair bare, added ns and % else)
# and the issue's targets checked (PASS/FAIL lines: default stacks <= 150 ns a pair on one thread
# and <= 15% on the most threads, --stack-depth 0 <= 100 ns on one thread). The verdicts' baseline
# is the median of the bare and pass rounds together (2 x ROUNDS runs of the untraced program:
# pass only loads the library; a process lands in a fast or a slow mode on the H100, so 3-5
# bare runs alone gave medians 470 ns apart), and each verdict line says it and the figure
# against bare alone; writes
# OUTDIR/contention.tsv (every run) and OUTDIR/contention.md (the tables); then, from the last
# run's traces of depth0 and stacks, the ns between one thread's allocation and its free
# (tools/trace_gaps.py: the shim's time on the caller's thread between two driver calls). SETS="probe shim work"
# picks sets. SHIM=DIR uses DIR/libcudatrace.so instead of building this checkout's (an A/B of
# two shims). One command, e.g. (issue 42): SETS=shim HAMI_LIB=/opt/hami/libvgpu.so
#     bash tools/gpu/contention.sh /tmp/cont 5 1 16
set -u
OUT=${1:?usage: contention.sh OUTDIR [ROUNDS] [THREADS...]}
ROUNDS=${2:-7}
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
    if [ "$c" = hami ]; then  # HAMi-core as its users run it: its own region file per run
        mkdir -p /tmp/vgpulock "$OUT/hami"
        rm -f "$OUT/hami/cudevshr.cache"
        one "$set" hami "$t" env LD_PRELOAD="$HAMI_LIB" CUDA_DEVICE_MEMORY_LIMIT="${HAMI_LIMIT:-65536m}" \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$OUT/hami/cudevshr.cache" "$@"
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
            # rotated by one each round
            set -- bare pass notrace depth0 stacks ${HAMI_LIB:+hami}
            for _ in $(seq $(((r - 1) % $#))); do set -- "${@:2}" "$1"; done
            for c in "$@"; do
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
out = ["| set | config | threads | runs | median ns a pair | min-max | added ns | added % |",
       "|---|---|---|---|---|---|---|---|"]
ORDER = ["none", "ctx", "sctx", "sctx_dev", "spin", "bare", "pass", "notrace", "depth0", "stacks",
         "hami"]
for (s, c, t) in sorted(runs, key=lambda k: (k[0], k[2], ORDER.index(k[1]))):
    med = statistics.median(runs[(s, c, t)])
    b = runs.get((s, base(s), t))
    if b and c != base(s):
        bm = statistics.median(b)
        add, pct = f"{med - bm:+,.0f}", f"{100 * (med - bm) / bm:+.1f}%"
    else:
        add = pct = "-"
    v = runs[(s, c, t)]
    out.append(f"| {s} | {c} | {t} | {len(v)} | {med:,.0f} | {min(v):,.0f}-{max(v):,.0f} | {add} | {pct} |")
# the shim set as issue 42 shows it: a row per config, a column per thread count
NAMES = {"bare": "bare", "pass": "shim loaded, not tracing", "notrace": "`--no-trace` (device lookup, live counters)",
         "depth0": "`--stack-depth 0`", "stacks": "default stacks", "hami": "HAMi-core (libvgpu.so)"}
threads = sorted({t for (s, _c, t) in runs if s == "shim"})
verdicts = []
if threads:
    med = {(c, t): statistics.median(v) for (s, c, t), v in runs.items() if s == "shim"}
    out += ["", "| config | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads) + " |",
            "|---|" + "---|" * len(threads)]
    for c in [c for c in ORDER if any((c, t) in med for t in threads)]:
        cells = []
        for t in threads:
            m, b = med.get((c, t)), med.get(("bare", t))
            if m is None:
                cells.append("-")
            elif c == "bare" or b is None:
                cells.append(f"{m:,.0f} ns")
            else:
                cells.append(f"{m - b:+,.0f} ns ({100 * (m - b) / b:+.1f}%)")
        out.append(f"| {NAMES.get(c, c)} | " + " | ".join(cells) + " |")
    # the verdicts' baseline: the bare and pass rounds together
    untraced = {t: [x for c in ("bare", "pass") for x in runs.get(("shim", c, t), [])] for t in threads}
    baseline = {t: statistics.median(v) for t, v in untraced.items() if v}
    def added(c, t, base=None):
        m = med.get((c, t))
        b = (base or baseline).get(t)
        return None if m is None or b is None else (m - b, 100 * (m - b) / b)
    for t in threads:
        if t in baseline:
            verdicts.append(f"baseline on {t} thread(s): median of {len(untraced[t])} bare and pass runs, {baseline[t]:,.0f} ns a pair"
                            f" (bare alone {med.get(('bare', t), float('nan')):,.0f}, pass alone {med.get(('pass', t), float('nan')):,.0f})")
    bare_only = {t: med[("bare", t)] for t in threads if ("bare", t) in med}
    lo, hi = threads[0], threads[-1]
    checks = [("default stacks", "stacks", lo, 0, 150, "ns a pair on %d thread" % lo),
              ("--stack-depth 0", "depth0", lo, 0, 100, "ns a pair on %d thread" % lo)]
    if hi != lo:
        checks.append(("default stacks", "stacks", hi, 1, 15, "%% a pair on %d threads" % hi))
    for label, c, t, which, limit, unit in checks:
        a = added(c, t)
        if a is None:
            verdicts.append(f"FAIL {label}: no runs on {t} thread(s)")
        else:
            v = a[which]
            vb = added(c, t, bare_only)
            also = "" if vb is None else f"; against bare alone {vb[which]:+,.1f}"
            verdicts.append(f"{'PASS' if v <= limit else 'FAIL'} {label} added {v:+,.1f} {unit} against bare+pass{also} (target <= {limit})")
    h = added("hami", lo)
    s_ = added("stacks", lo)
    if h is not None and s_ is not None:
        verdicts.append(f"HAMi-core added {h[0]:+,.0f} ns a pair on {lo} thread ({h[1]:+.1f}%), cudatrace default stacks {s_[0]:+,.0f} ns")
open(sys.argv[2], "w").write("\n".join(out + [""] + verdicts) + "\n")
print("\n".join(out))
print("\n".join(verdicts))
PY
# the last round's traces (the most threads): how long the shim keeps a thread from the driver
# between an allocation and its free, read from the events' own times (tools/trace_gaps.py)
if has shim; then
    for c in depth0 stacks; do
        [ -d "$OUT/traces/$c" ] && python3 tools/trace_gaps.py "$OUT/traces/$c" | tee -a "$OUT/contention.md"
    done
fi
exit 0
