#!/usr/bin/env bash
# startup_attrib.sh OUTDIR - issue 20's GPU proof: the code that sized the memory at start-up is
# named by every headline. tools/gpu/startup_server.cu (an engine-like server: a vt:: helper
# through a function-pointer table, a KV cache of 28 x 64 MiB at start-up, the C++ runtime
# linked statically) is built with nvcc at -O2 without frame pointers, then:
#   1. run unbudgeted; `report`'s top site and the run summary must name
#      vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer (not the helper AllocOnDevice)
#   2. run under --budget 1200MiB (denies the KV cache past its ~10th layer once the CUDA
#      context is counted): the shim's line (demangled, no _Z) and the launcher's line name
#      the KV code
#   3. the same with -q: both denial lines still print, the chatter does not
#   4. --budget 300MiB (below one CUDA context): the denial says every allocation will be denied
#   5. sweep --values 4,8,16 over --layers: the law is the KV code's, 64 MiB per layer
#   6. serving (--serve): weights and workspace are their own sites, the helper none
# Prints each headline and PASS/FAIL lines; exit 0 when all pass. Needs nvcc and a GPU.
set -u
. "$(dirname "$0")/common.sh"
export PYTHONUNBUFFERED=1 COLUMNS=250
NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
SRV=$OUT/vllm-server-b1234
"$NVCC" -O2 -g -arch="${GPU_ARCH:-sm_90}" -Xcompiler -fomit-frame-pointer \
    -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc \
    -o "$SRV" "$HERE/startup_server.cu" || { echo "FAIL nvcc build"; exit 2; }
KV='vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer'
KVRE='vllm::v1::GPUModelRunner::(CacheBuffer::CacheBuffer|initialize_kv_cache)'
fails=0
check() { # check NAME COND-EXIT-STATUS
    if [ "$2" = 0 ]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
ct() { timeout 120 python3 -m cudatrace "$@"; }

echo "== 1. start-up, no budget"
ct run -o "$OUT/free" --force -- "$SRV" >"$OUT/free.out" 2>"$OUT/free.err"
echo "   exit $?"
grep ' x  ' "$OUT/free.err" | head -3 | sed 's/^/   summary: /'
ct report "$OUT/free" >"$OUT/free-report.txt" 2>&1
grep -m1 -A1 ' #1 [^ ]' "$OUT/free-report.txt" | sed 's/^/   report: /'
ct report "$OUT/free" --json >"$OUT/free-report.json" 2>/dev/null
top=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['sites'][0]; print(s['label'], s['count'], '|', ' > '.join(f['function'] or '?' for f in reversed(s['via'])))" "$OUT/free-report.json" 2>&1)
echo "   top site: $top"
grep -m1 -E ' #1 [^ ]' "$OUT/free-report.txt" | grep -qE " #1 $KV \([^ ]+:[0-9]+\)$"; check "report #1 names the KV code" $?
grep -qE "28 x  $KV" "$OUT/free.err"; check "run summary names the KV code (28 x)" $?
case "$top" in "$KV ("*" 28 |"*AllocOnDevice*) r=0 ;; *) r=1 ;; esac
check "report --json: KV site with the helper in its via" $r

echo "== 2. start-up under --budget 1200MiB"
ct run -o "$OUT/budget" --force --budget 1200MiB -- "$SRV" >"$OUT/budget.out" 2>"$OUT/budget.err"
echo "   exit $?"
grep -E 'budget exceeded|cudatrace: denied|fatal' "$OUT/budget.err" | head -4 | sed 's/^/   /'
grep 'budget exceeded' "$OUT/budget.err" | head -1 | grep -qE "; at $KVRE \((startup_server\.cu:[0-9]+|vllm-server-b1234\+0x)"; check "shim's line names the KV code" $?
! grep 'budget exceeded' "$OUT/budget.err" | grep -q '_Z'; check "shim's line demangled (static libstdc++)" $?
grep -qE "^cudatrace: denied .* at $KV \([^ ]+:[0-9]+\) via " "$OUT/budget.err"; check "launcher's line names the KV code" $?

echo "== 3. the same with -q"
ct run -q -o "$OUT/budget-q" --force --budget 1200MiB -- "$SRV" >"$OUT/budget-q.out" 2>"$OUT/budget-q.err"
echo "   exit $?"
grep -E 'budget exceeded|cudatrace: denied|fatal' "$OUT/budget-q.err" | head -4 | sed 's/^/   /'
grep 'budget exceeded' "$OUT/budget-q.err" | head -1 | grep -qE "; at $KVRE "; check "-q: shim's line names the KV code" $?
grep -qE "^cudatrace: denied .* at $KV " "$OUT/budget-q.err"; check "-q: launcher's line names the KV code" $?
! grep -qE 'cudatrace: tracing|top call sites|full report' "$OUT/budget-q.err"; check "-q: no progress or summary" $?

echo "== 4. --budget 300MiB: below one CUDA context"
ct run -q -o "$OUT/ctx" --force --budget 300MiB -- "$SRV" >"$OUT/ctx.out" 2>"$OUT/ctx.err"
echo "   exit $?"
grep -E 'budget exceeded|cudatrace: denied' "$OUT/ctx.err" | head -2 | sed 's/^/   /'
grep 'budget exceeded' "$OUT/ctx.err" | head -1 | grep -q 'CUDA contexts .*every allocation will be denied'; check "context below the budget explained" $?

echo "== 5. sweep --values 4,8,16 over --layers"
ct sweep --values 4,8,16 -o "$OUT/sweep" --json -- "$SRV" --layers {} >"$OUT/sweep.json" 2>"$OUT/sweep.err"
echo "   exit $?"
law=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['sites'][0]; print(s['label'], '|', s['law']['text'])" "$OUT/sweep.json" 2>&1)
echo "   law: $law"
case "$law" in "$KV ("*"64.0 MiB per"*) r=0 ;; *) r=1 ;; esac
check "sweep's law is the KV code's, 64 MiB per layer" $r

echo "== 6. serving (--serve)"
ct run -q -o "$OUT/serve" --force -- "$SRV" --serve >"$OUT/serve.out" 2>"$OUT/serve.err"
ct report "$OUT/serve" --json >"$OUT/serve.json" 2>/dev/null
labels=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('; '.join(s['label'].rsplit(' (',1)[0] + ' x%d' % s['count'] for s in d['sites']))" "$OUT/serve.json" 2>&1)
echo "   sites: $labels"
case "$labels" in *"$KV x28"*load_weights*profile_run*|*"$KV x28"*profile_run*load_weights*) r=0 ;; *) r=1 ;; esac
case "$labels" in *AllocOnDevice*|*CudaBackend*) r=1 ;; esac
check "serving: KV, weights and workspace each their own site" $r

echo "== startup_attrib: $fails failed"
[ "$fails" = 0 ]
