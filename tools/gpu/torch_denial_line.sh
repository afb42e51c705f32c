#!/usr/bin/env bash
# torch_denial_line.sh OUTDIR - a PyTorch program's denial: the line the preload library prints
# at the moment names the Python line `cudatrace report` names for that allocation
# (docs/python-frames.md, "At a denial"). Writes OUTDIR/torch_kv.py (a KV cache of 64 MiB
# tensors from torch.empty in build_kv_cache; weights moved with .to("cuda") through a helper
# two functions call) and runs it on the GPU:
#   1. `cudatrace run --budget 1500MiB`: the shim's line names build_kv_cache (torch_kv.py:N),
#      the same label as the report's denied site and the launcher's line; c10's caching
#      allocator in its via, never its site
#   2. the same with -q
#   3. a denial through the helper (`weights`): the shim's line names load_weights, the helper
#      folded into its via as the report folds it
#   4. without the launcher (LD_PRELOAD, CUDATRACE_GROUP, CUDATRACE_BUDGET, CUDATRACE_DIR): the
#      shim's line names the report's site
#   5. expandable segments (cuMemCreate): the shim's line names the Python line
#   6. CUDATRACE_PYTHON=0: the line says the Python code could not be read, never ctypes' or
#      torch's native code as the site
# Prints each line and PASS/FAIL; exit 0 when all pass. Needs a PyTorch install with CUDA and a
# GPU (run from the repository root, or anywhere: it finds the checkout from its own path).
set -u
. "$(dirname "$0")/common.sh"
export PYTHONUNBUFFERED=1 COLUMNS=250
PY=${PYTHON:-python3}
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    { echo "FAIL no PyTorch with CUDA importable by $PY"; exit 2; }
echo "== torch $("$PY" -c 'import torch; print(torch.__version__)'), $("$PY" --version)"

PROG=$OUT/torch_kv.py
cat >"$PROG" <<'EOF'
import sys
import torch

MiB = 1 << 20

def to_device(t):
    return t.to("cuda")  # LINE:helper

def load_embeddings():
    return to_device(torch.ones(16 * MiB // 4))

def load_weights(n):
    out = []
    for _ in range(n):
        out.append(to_device(torch.ones(64 * MiB // 4)))  # LINE:weights
    return out

def build_kv_cache(layers, mib):
    kv = []
    for _ in range(layers):
        kv.append(torch.empty(mib * MiB, dtype=torch.uint8, device="cuda"))  # LINE:kv
    return kv

def main(what):
    emb = load_embeddings()
    if what == "weights":
        w = load_weights(40)
    else:
        w = load_weights(2)
        kv = build_kv_cache(28, 64)
    torch.cuda.synchronize()

try:
    main(sys.argv[1] if len(sys.argv) > 1 else "kv")
except torch.cuda.OutOfMemoryError as e:
    print("torch_kv.py: out of memory:", str(e).splitlines()[0], file=sys.stderr)
    sys.exit(3)
EOF
line_of() { grep -n "# LINE:$1\$" "$PROG" | cut -d: -f1; }
KV="build_kv_cache (torch_kv.py:$(line_of kv))"
W="load_weights (torch_kv.py:$(line_of weights))"
fails=0
check() { # check NAME EXIT-STATUS-OF-THE-CONDITION
    if [ "$2" = 0 ]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
ct() { timeout 300 "$PY" -m cudatrace "$@"; }
shim_site() { # the site of the first shim line of FILE
    grep -m1 'cudatrace: budget exceeded' "$1" | "$PY" -c 'import re,sys
m = re.search(r"; at (.+?)(?: via |, called from |; )", sys.stdin.read())
print(m.group(1) if m else "")'
}
denied() { # the report's denied sites of a trace directory
    ct report "$1" --json 2>/dev/null | "$PY" -c 'import json,sys
print("; ".join(d["label"] for d in json.load(sys.stdin)["denied"]))'
}
show() { grep -E 'budget exceeded|cudatrace: denied|torch_kv.py:' "$1" | head -3 | cut -c1-700 |
    sed 's/^/   /'; }
same_site() { # same_site NAME ERRFILE TRACE WANT
    local s r
    s=$(shim_site "$2")
    r=$(denied "$3")
    echo "   shim: $s | report: $r"
    [ "$s" = "$4" ] && [ "${r%%;*}" = "$4" ]
    check "$1: the shim's line and the report name $4" $?
}

echo "== 1. cudatrace run --budget 1500MiB"
ct run -o "$OUT/budget" --force --budget 1500MiB -- "$PY" "$PROG" >"$OUT/budget.out" \
    2>"$OUT/budget.err"
echo "   exit $?"
show "$OUT/budget.err"
same_site "run" "$OUT/budget.err" "$OUT/budget" "$KV"
grep -qE "^cudatrace: denied .* at $(printf '%s' "$KV" | sed 's/[().]/\\&/g') via " \
    "$OUT/budget.err"
check "run: the launcher's line names $KV" $?
via=$(grep -m1 'budget exceeded' "$OUT/budget.err" | sed -n 's/.* via \(.*\), called from .*/\1/p')
case "$via" in *CUDACachingAllocator*) r=0 ;; *) r=1 ;; esac
check "run: c10's caching allocator is in the shim's via" $r

echo "== 2. the same with -q"
ct run -q -o "$OUT/budget-q" --force --budget 1500MiB -- "$PY" "$PROG" >"$OUT/budget-q.out" \
    2>"$OUT/budget-q.err"
show "$OUT/budget-q.err"
same_site "-q" "$OUT/budget-q.err" "$OUT/budget-q" "$KV"
! grep -qE 'cudatrace: tracing|top call sites|full report' "$OUT/budget-q.err"
check "-q: no progress or summary" $?

echo "== 3. denied through the helper both loaders call (to_device)"
ct run -o "$OUT/weights" --force --budget 1500MiB -- "$PY" "$PROG" weights \
    >"$OUT/weights.out" 2>"$OUT/weights.err"
show "$OUT/weights.err"
same_site "helper" "$OUT/weights.err" "$OUT/weights" "$W"
grep -m1 'budget exceeded' "$OUT/weights.err" | grep -q " via to_device > "
check "helper: to_device folded into the via" $?

echo "== 4. without the launcher (LD_PRELOAD, CUDATRACE_GROUP, CUDATRACE_BUDGET, CUDATRACE_DIR)"
LEDGERS=$OUT/ledgers
rm -rf "$LEDGERS" "$OUT/bare" && mkdir -m 700 "$LEDGERS" && mkdir "$OUT/bare"
env LD_PRELOAD="$REPO/cudatrace/_native/libcudatrace.so" CUDATRACE_LEDGER_DIR="$LEDGERS" \
    CUDATRACE_GROUP="tdl$$" CUDATRACE_BUDGET=1500MiB CUDATRACE_DIR="$OUT/bare" \
    "$PY" "$PROG" >"$OUT/bare.out" 2>"$OUT/bare.err"
echo "   exit $?"
show "$OUT/bare.err"
same_site "bare" "$OUT/bare.err" "$OUT/bare" "$KV"

echo "== 5. expandable segments (cuMemCreate)"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ct run -q -o "$OUT/expandable" --force \
    --budget 1500MiB -- "$PY" "$PROG" >"$OUT/expandable.out" 2>"$OUT/expandable.err"
show "$OUT/expandable.err"
s=$(shim_site "$OUT/expandable.err")
echo "   shim: $s | report: $(denied "$OUT/expandable")"
case "$s" in *"(torch_kv.py:"*) r=0 ;; *) r=1 ;; esac
check "expandable: the shim's line names a line of torch_kv.py" $r

echo "== 6. CUDATRACE_PYTHON=0"
CUDATRACE_PYTHON=0 ct run -q -o "$OUT/nopy" --force --budget 1500MiB -- "$PY" "$PROG" \
    >"$OUT/nopy.out" 2>"$OUT/nopy.err"
show "$OUT/nopy.err"
grep -m1 'budget exceeded' "$OUT/nopy.err" |
    grep -q "; at Python code whose frames the shim could not read (Python frames are off"
check "Python off: the line says so, no native site" $?

echo "== torch_denial_line: $fails failed"
[ "$fails" = 0 ]
