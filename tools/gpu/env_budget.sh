#!/usr/bin/env bash
# env_budget.sh OUTDIR - issue 24 #3 on a GPU: budgets without the launcher. PyTorch processes
# get only the environment an integration sets (LD_PRELOAD, CUDATRACE_GROUP, CUDATRACE_BUDGET,
# CUDATRACE_LEDGER_DIR; no `cudatrace run`):
#   A: sees the budget in torch.cuda.mem_get_info (total = 6 GiB) and holds 3 GiB;
#   a shell in the same environment takes no member slot (status shows A alone);
#   B: asks 4 GiB beside A and gets torch.cuda.OutOfMemoryError, with the shim's denial line;
#   C: a share of 2 GiB (as Slurm's hook sets it) is denied 2.5 GiB, by its share, not the group.
# Prints PASS/FAIL lines; exit 0 when all pass. Needs PyTorch with CUDA. About 1 minute.
set -u
. "$(dirname "$0")/common.sh"
LEDGERS="$OUT/ledgers"
rm -rf "$LEDGERS"
mkdir -m 700 "$LEDGERS"
ENVB=(env LD_PRELOAD="$REPO/cudatrace/_native/libcudatrace.so" CUDATRACE_LEDGER_DIR="$LEDGERS"
      CUDATRACE_GROUP=envg CUDATRACE_BUDGET=6GiB)
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
status_members() {
    python3 -m cudatrace status envg --json --ledger-dir "$LEDGERS" 2>/dev/null |
        python3 -c 'import json,sys; s=json.load(sys.stdin)["ledgers"][0]; print(len([m for m in s["members"] if m["state"]=="alive"]))'
}
cat >"$OUT/take.py" <<'PY'
import sys, time, torch
gib = float(sys.argv[1])
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info total {total} free {free}", flush=True)
try:
    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
except torch.cuda.OutOfMemoryError as e:
    print("OOM", str(e).splitlines()[0], flush=True)
    sys.exit(3)
PY
"${ENVB[@]}" python3 "$OUT/take.py" 3 25 >"$OUT/a.out" 2>"$OUT/a.err" &
A=$!
for _ in $(seq 240); do grep -q '^held' "$OUT/a.out" 2>/dev/null && break; kill -0 $A 2>/dev/null || break; sleep 0.25; done
grep -q '^held' "$OUT/a.out" && pass "A holds 3 GiB under the env-only group" || fail "A: $(cat "$OUT/a.out" "$OUT/a.err" | tail -5)"
grep -q "mem_get_info total 6442450944 " "$OUT/a.out" && pass "A sees total = the budget: $(head -1 "$OUT/a.out")" || fail "A's mem_get_info: $(head -1 "$OUT/a.out")"
"${ENVB[@]}" sh -c 'sleep 4' &
SH=$!
sleep 1
n=$(status_members)
[ "$n" = 1 ] && pass "a shell in the environment takes no member slot (members: $n)" || fail "members with the shell alive: $n (want 1)"
wait $SH
"${ENVB[@]}" python3 "$OUT/take.py" 4 >"$OUT/b.out" 2>"$OUT/b.err"
rc=$?
[ $rc = 3 ] && pass "B denied 4 GiB beside A: $(grep -m1 OOM "$OUT/b.out")" || fail "B exit $rc: $(tail -3 "$OUT/b.out" "$OUT/b.err")"
grep -m1 'cudatrace: budget exceeded' "$OUT/b.err" && pass "B's denial line" || fail "no denial line for B"
"${ENVB[@]}" CUDATRACE_SHARE=job7 CUDATRACE_SHARE_BUDGET=2GiB CUDATRACE_SHARE_LABEL="slurm job 7" \
    python3 "$OUT/take.py" 2.5 >"$OUT/c.out" 2>"$OUT/c.err"
rc=$?
grep -q 'share of slurm job 7' "$OUT/c.err" && [ $rc = 3 ] && pass "C denied by its share: $(grep -m1 'budget exceeded' "$OUT/c.err")" || fail "C exit $rc: $(tail -3 "$OUT/c.out" "$OUT/c.err")"
python3 -m cudatrace status --ledger-dir "$LEDGERS" | tee "$OUT/status.txt"
kill $A 2>/dev/null; wait $A 2>/dev/null
echo "env_budget: $fails failure(s)"
[ $fails = 0 ]
