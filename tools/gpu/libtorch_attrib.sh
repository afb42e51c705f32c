#!/usr/bin/env bash
# libtorch_attrib.sh OUTDIR - the code that sized the memory, named through libtorch's three
# libraries (libc10_cuda, libtorch_cuda, libtorch_cpu). tools/gpu/libtorch_kv.cpp is built
# against the libtorch inside this machine's PyTorch install (its headers and lib/, its C++ ABI
# flag), at -O2 with debug information, then:
#   1. start-up, no budget: `report`'s #1 site and the run summary name llm::KVCache::KVCache
#      (28 blocks of 64 MiB from torch::empty), c10's caching allocator in its via
#   2. serving (--serve): the weights moved with .to(kCUDA) are llm::load_weights's; no site is
#      c10::, at:: or torch:: code
#   3. under --budget 1500MiB: the shim's line and the launcher's line name the KV code
#   4. the same with -q
#   5. without the launcher (LD_PRELOAD and CUDATRACE_GROUP/CUDATRACE_BUDGET): the shim's line
#      names the KV code, or the function the compiler inlined it into and says so (never with
#      the KV code in its via: a frame of its own below the named site)
#   6. NVML beside: nvidia-smi's figures and the report's traced-versus-observed section (the
#      start-up run holds its memory 800 ms, so that NVML's samples see it)
# The program is named libtorch_kv, like one of libtorch's own libraries: that must not make
# its code libtorch's (docs/attribution.md, "Frameworks").
# Prints each headline and PASS/FAIL lines; exit 0 when all pass. Needs g++, a PyTorch install
# with CUDA and a GPU. Without CUDA (a CPU wheel) it checks the build and the report of a --cpu
# run only, says so, and exits 0 when those work.
set -u
. "$(dirname "$0")/common.sh"
export PYTHONUNBUFFERED=1 COLUMNS=250
PY=${PYTHON:-python3}

# ---- build against the wheel's libtorch ----------------------------------------------------
TORCH=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null) ||
    { echo "FAIL no PyTorch importable by $PY"; exit 2; }
ABI=$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
CUDA=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
LIBS=(-ltorch -ltorch_cpu -lc10)
for l in torch_cuda c10_cuda; do
    [ -e "$TORCH/lib/lib$l.so" ] && LIBS+=("-l$l")
done
echo "== build: torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) at $TORCH"
echo "   _GLIBCXX_USE_CXX11_ABI=$ABI; links ${LIBS[*]}; CUDA available: $CUDA"
EXE=$OUT/libtorch_kv
${CXX:-g++} -O2 -g -std=c++17 -D_GLIBCXX_USE_CXX11_ABI="$ABI" \
    -isystem "$TORCH/include" -isystem "$TORCH/include/torch/csrc/api/include" \
    -o "$EXE" "$HERE/libtorch_kv.cpp" -L"$TORCH/lib" -Wl,-rpath,"$TORCH/lib" \
    -Wl,--no-as-needed "${LIBS[@]}" -Wl,--as-needed >"$OUT/build.log" 2>&1 ||
    { echo "FAIL build (see $OUT/build.log)"; tail -20 "$OUT/build.log"; exit 2; }
echo "   built $EXE"

KV='llm::KVCache::KVCache'
W='llm::load_weights'
fails=0
check() { # check NAME EXIT-STATUS-OF-THE-CONDITION
    if [ "$2" = 0 ]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
ct() { timeout 300 "$PY" -m cudatrace "$@"; }
sites() { # sites DIR: "label xCOUNT; ..." of report --json
    ct report "$1" --json 2>/dev/null | "$PY" -c 'import json,sys
d = json.load(sys.stdin)
print("; ".join(s["label"].rsplit(" (", 1)[0] + " x%d" % s["count"] for s in d["sites"]))'
}

if [ "$CUDA" != 1 ]; then
    echo "== no CUDA here: the build and a --cpu run's report only"
    "$EXE" --cpu --layers 2 --mib 4 --serve; check "the program runs (--cpu)" $?
    ct run -q -o "$OUT/cpu" --force -- "$EXE" --cpu --layers 2 --mib 4 >"$OUT/cpu.out" 2>&1
    check "cudatrace run of the --cpu program" $?
    ct report "$OUT/cpu" --json >"$OUT/cpu.json" 2>"$OUT/cpu.err"; check "report --json reads it" $?
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["sites"] == [], d["sites"]' \
        "$OUT/cpu.json"; check "no device memory on the CPU (the report's structure)" $?
    echo "== libtorch_attrib (build check, no GPU): $fails failed"
    [ "$fails" = 0 ]
    exit
fi

echo "== NVML before: $(nvidia-smi --query-gpu=index,name,memory.used,memory.total \
    --format=csv,noheader 2>&1 | head -1)"

echo "== 1. start-up, no budget (28 x 64 MiB from torch::empty)"
ct run -o "$OUT/free" --force -- "$EXE" --hold-ms 800 >"$OUT/free.out" 2>"$OUT/free.err"
echo "   exit $?"
grep ' x  ' "$OUT/free.err" | head -3 | sed 's/^/   summary: /'
ct report "$OUT/free" >"$OUT/free-report.txt" 2>&1
grep -m1 -A1 ' #1 [^ ]' "$OUT/free-report.txt" | sed 's/^/   report: /'
grep -qE "28 x  $KV \(" "$OUT/free.err"; check "run summary names $KV (28 x)" $?
grep -m1 -E ' #1 [^ ]' "$OUT/free-report.txt" | grep -qE " #1 $KV \("; check "report #1 is $KV" $?
via=$(ct report "$OUT/free" --json 2>/dev/null | "$PY" -c 'import json,sys
s = json.load(sys.stdin)["sites"][0]
print(" > ".join(f["function"] or "?" for f in reversed(s["via"])))')
echo "   via: ${via:0:400}"
case "$via" in *c10::cuda::CUDACachingAllocator*) r=0 ;; *) r=1 ;; esac
check "c10's caching allocator is in the via, not the label" $r
echo "   NVML beside the trace (report):"
sed -n '/^Traced versus observed/,/^$/p' "$OUT/free-report.txt" | sed 's/^/   /'

echo "== 2. serving (--serve: weights with .to(kCUDA))"
ct run -q -o "$OUT/serve" --force -- "$EXE" --serve >"$OUT/serve.out" 2>"$OUT/serve.err"
labels=$(sites "$OUT/serve")
echo "   sites: $labels"
case "$labels" in *"$KV x28"*"$W x8"*|*"$W x8"*"$KV x28"*) r=0 ;; *) r=1 ;; esac
case "$labels" in "c10::"*|*"; c10::"*|"at::"*|*"; at::"*|"torch::"*|*"; torch::"*) r=1 ;; esac
check "serving: $KV and $W, no framework site" $r

echo "== 3. under --budget 1500MiB"
ct run -o "$OUT/budget" --force --budget 1500MiB -- "$EXE" >"$OUT/budget.out" 2>"$OUT/budget.err"
echo "   exit $?"
grep -E 'budget exceeded|cudatrace: denied|libtorch_kv:' "$OUT/budget.err" | head -4 |
    cut -c1-600 | sed 's/^/   /'
grep 'budget exceeded' "$OUT/budget.err" | head -1 | grep -qE "; at $KV \([^)]+\)"
check "shim's line names $KV" $?
grep -qE "^cudatrace: denied .* at $KV \([^ ]+:[0-9]+\)" "$OUT/budget.err"
check "launcher's line names $KV" $?

echo "== 4. the same with -q"
ct run -q -o "$OUT/budget-q" --force --budget 1500MiB -- "$EXE" >"$OUT/budget-q.out" \
    2>"$OUT/budget-q.err"
grep -E 'budget exceeded|cudatrace: denied' "$OUT/budget-q.err" | head -2 | cut -c1-400 |
    sed 's/^/   /'
grep 'budget exceeded' "$OUT/budget-q.err" | head -1 | grep -qE "; at $KV \("
check "-q: shim's line names $KV" $?
grep -qE "^cudatrace: denied .* at $KV " "$OUT/budget-q.err"; check "-q: launcher's line" $?
! grep -qE 'cudatrace: tracing|top call sites|full report' "$OUT/budget-q.err"
check "-q: no progress or summary" $?

echo "== 5. without the launcher (LD_PRELOAD, CUDATRACE_GROUP, CUDATRACE_BUDGET)"
LEDGERS=$OUT/ledgers
rm -rf "$LEDGERS" && mkdir -m 700 "$LEDGERS"
env LD_PRELOAD="$REPO/cudatrace/_native/libcudatrace.so" CUDATRACE_LEDGER_DIR="$LEDGERS" \
    CUDATRACE_GROUP="ltkv$$" CUDATRACE_BUDGET=$((1500 << 20)) "$EXE" >"$OUT/bare.out" \
    2>"$OUT/bare.err"
echo "   exit $?"
line=$(grep -m1 'budget exceeded' "$OUT/bare.err")
echo "   ${line:0:600}"
case "$line" in *"; at $KV ("*) r=0 ;; *", or a function inlined into it)"*) r=0 ;; *) r=1 ;; esac
folded=${line%%, called from *}
case "$folded" in *" via "*"$KV"*) r=1 ;; esac # its own frame folded below another site
check "bare shim: names $KV or says what it cannot know" $r

echo "== 6. NVML after: $(nvidia-smi --query-gpu=index,memory.used,memory.total \
    --format=csv,noheader 2>&1 | head -1)"
ct report "$OUT/free" --json 2>/dev/null | "$PY" -c 'import json,sys
d = json.load(sys.stdin)
o = d.get("observed") or {}
m = o.get("max") or {}
print("   traced peak %s B; NVML: samples %s, tree device max %s B, device used max %s B"
      % (d.get("peak_bytes"), o.get("samples"),
         m.get("tree_device_bytes"), m.get("device_used")))' 2>&1 | head -2

echo "== libtorch_attrib: $fails failed"
[ "$fails" = 0 ]
