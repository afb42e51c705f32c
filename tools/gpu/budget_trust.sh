#!/usr/bin/env bash
# budget_trust.sh OUTDIR - budgets an operator can trust, on a real GPU (the real driver and NVML,
# no simulator): fencing that cannot be set up fails closed, the group rule holds on both paths,
# and a run inside a job's fence reports it. Processes get only the environment an integration
# sets (LD_PRELOAD, CUDATRACE_GROUP, CUDATRACE_BUDGET, CUDATRACE_LEDGER_DIR ...):
#   refuse: a missing ledger directory (never made), a budget without a group, a malformed
#     budget: cuInit answers CUDA_ERROR_NOT_PERMITTED (800), one line says why;
#   warn: the process runs, and `cudatrace status --json` lists it unfenced with NVML's bytes;
#   the group rule: a budget-less process cannot make a group; B asking 4 GiB beside a live A
#     of 6 GiB is refused, B asking none joins A's 6 GiB and PyTorch's OOM comes past it; with A
#     gone, C's 4 GiB replaces the group's budget (a note says so);
#   one grammar: CUDATRACE_BUDGET=1.5GiB is taken (mem_get_info's total is 1.5 GiB);
#   a job's fence: `cudatrace run` in a share of 2 GiB reports "share of ...", the device's real
#     size, and is no member itself;
#   a truncated ledger survived (as root: two users through setpriv, uids 61011 and 61012, on
#     the real driver): in a shared ledger directory Alice holds 2 GiB and Bob 1 GiB of group
#     "trust" (8 GiB); Alice cannot truncate Bob's part, truncates her own: Bob's process runs
#     on and allocates 1 GiB more, `cudatrace status` still reads the group (Bob counted, her
#     part listed as unusable), the node agent passes over her part and says so;
#   the sealed fence (as root; docs/budgets.md, "The sealed fence"), in a private mount
#     namespace where /etc and /run are overlays: a container's record at /etc/cudatrace/fence
#     (mounted read-only) holds a process to 2 GiB whatever CUDATRACE_BUDGET=64GiB it sets
#     (mem_get_info's total is 2 GiB, 3 GiB is an OOM, one line names what was ignored); a
#     Slurm job's record /run/cudatrace/jobs/41 (its uid's) holds `export
#     CUDATRACE_SHARE_BUDGET=64GiB` to the job's 2 GiB share; a damaged record refuses cuInit;
#     an 8,190-byte CUDATRACE_HINTS beside a record changes nothing; another user's job's record
#     (SLURM_JOB_ID=42, uid 61011) refuses cuInit;
#   long and malformed settings: an 8,190-byte CUDATRACE_HINTS before CUDATRACE_GROUP and
#     _BUDGET drops neither (the process sees and is held to its 2 GiB), CUDATRACE_ON_EXCEED=bogus
#     and an 8,190-byte group name refuse cuInit with one line.
# Prints PASS/FAIL lines; exit 0 when all pass. Needs PyTorch with CUDA. About 2 minutes.
set -u
. "$(dirname "$0")/common.sh"
SHIM="$REPO/cudatrace/_native/libcudatrace.so"
LEDGERS="$OUT/ledgers"
rm -rf "$LEDGERS" "$OUT/missing"
mkdir -m 700 "$LEDGERS"
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
cat >"$OUT/init.py" <<'PY'
import ctypes
print("cuInit", ctypes.CDLL("libcuda.so.1").cuInit(0), flush=True)
PY
cat >"$OUT/take.py" <<'PY'
import sys, time, torch
gib = float(sys.argv[1])
try:
    free, total = torch.cuda.mem_get_info()
    print(f"mem_get_info total {total} free {free}", flush=True)
    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
except torch.cuda.OutOfMemoryError as e:
    print("OOM", str(e).splitlines()[0], flush=True)
    sys.exit(3)
except RuntimeError as e:
    print("REFUSED", str(e).splitlines()[0], flush=True)
    sys.exit(4)
PY
E=(env LD_PRELOAD="$SHIM" CUDATRACE_LEDGER_DIR="$LEDGERS")
wait_held() {  # wait_held FILE PID
    for _ in $(seq 240); do grep -q '^held' "$1" 2>/dev/null && return 0; kill -0 "$2" 2>/dev/null || return 1; sleep 0.25; done
    return 1
}

# ---- fencing that cannot be set up: refused, one line, nothing made ----------------------------
refused() {  # refused NAME WORD ENV...
    local name=$1 word=$2; shift 2
    "$@" python3 "$OUT/init.py" >"$OUT/$name.out" 2>"$OUT/$name.err"
    local lines
    lines=$(grep -c 'fencing cannot be set up' "$OUT/$name.err")
    if grep -q '^cuInit 800$' "$OUT/$name.out" && [ "$lines" = 1 ] && grep -q "$word" "$OUT/$name.err"; then
        pass "$name: cuInit refused (800): $(head -c 200 "$OUT/$name.err")"
    else
        fail "$name: $(cat "$OUT/$name.out") $(head -c 400 "$OUT/$name.err")"
    fi
}
refused "missing ledger dir" "does not exist" env LD_PRELOAD="$SHIM" \
    CUDATRACE_LEDGER_DIR="$OUT/missing" CUDATRACE_GROUP=g CUDATRACE_BUDGET=4GiB
[ ! -e "$OUT/missing" ] && pass "the missing ledger directory was not made" || fail "$OUT/missing was made"
refused "budget without group" "no CUDATRACE_GROUP" "${E[@]}" CUDATRACE_BUDGET=4GiB
refused "malformed budget" "has no unit" "${E[@]}" CUDATRACE_GROUP=g CUDATRACE_BUDGET=12
refused "group without budget" "names no budget" "${E[@]}" CUDATRACE_GROUP=g
"${E[@]}" CUDATRACE_GROUP=g python3 "$OUT/take.py" 1 >"$OUT/torch-refused.out" 2>"$OUT/torch-refused.err"
rc=$?
[ $rc != 0 ] && ! grep -q '^held' "$OUT/torch-refused.out" && pass "PyTorch refused (exit $rc): $(tail -1 "$OUT/torch-refused.out")" ||
    fail "PyTorch ran without its fence: $(tail -2 "$OUT/torch-refused.out")"

# ---- warn: unfenced, and visible ---------------------------------------------------------------
env LD_PRELOAD="$SHIM" CUDATRACE_LEDGER_DIR="$OUT/missing" CUDATRACE_GROUP=g CUDATRACE_BUDGET=4GiB \
    CUDATRACE_ON_FENCE_ERROR=warn python3 "$OUT/take.py" 1 20 >"$OUT/warn.out" 2>"$OUT/warn.err" &
W=$!
if wait_held "$OUT/warn.out" $W; then
    pass "warn: runs unfenced: $(grep -m1 fencing "$OUT/warn.err" | head -c 160)"
    sleep 1
    python3 -m cudatrace status --json --ledger-dir "$LEDGERS" >"$OUT/warn-status.json" 2>&1
    python3 - "$OUT/warn-status.json" $W <<'PY' && pass "status lists it unfenced" || fail "status: $(head -c 600 "$OUT/warn-status.json")"
import json, sys
u = json.load(open(sys.argv[1]))["unfenced"]
mine = [p for p in u["processes"] if p["pid"] == int(sys.argv[2])]
print("   unfenced:", mine)
sys.exit(0 if u["known"] and mine and mine[0]["bytes"] >= 1 << 30 else 1)
PY
else
    fail "warn: $(tail -3 "$OUT/warn.out" "$OUT/warn.err")"
fi
kill $W 2>/dev/null; wait $W 2>/dev/null

# ---- the group rule ------------------------------------------------------------------------------
"${E[@]}" CUDATRACE_GROUP=grp CUDATRACE_BUDGET=6GiB python3 "$OUT/take.py" 3 30 >"$OUT/a.out" 2>"$OUT/a.err" &
A=$!
wait_held "$OUT/a.out" $A && pass "A holds 3 GiB of its group's 6 GiB" || fail "A: $(tail -3 "$OUT/a.out" "$OUT/a.err")"
refused "another budget beside a live member" "has a budget of 6.00 GiB" "${E[@]}" CUDATRACE_GROUP=grp CUDATRACE_BUDGET=4GiB
"${E[@]}" CUDATRACE_GROUP=grp python3 "$OUT/take.py" 4 >"$OUT/b.out" 2>"$OUT/b.err"
rc=$?
[ $rc = 3 ] && grep -q 'budget exceeded' "$OUT/b.err" && pass "B (no budget) joins A's 6 GiB and is denied 4 GiB more" ||
    fail "B exit $rc: $(tail -2 "$OUT/b.out" "$OUT/b.err")"
kill $A 2>/dev/null; wait $A 2>/dev/null
sleep 1
"${E[@]}" CUDATRACE_GROUP=grp CUDATRACE_BUDGET=4GiB python3 "$OUT/take.py" 1 >"$OUT/c.out" 2>"$OUT/c.err"
grep -q '^held' "$OUT/c.out" && grep -q 'no live member; it is now 4.00 GiB' "$OUT/c.err" &&
    pass "C replaces the idle group's budget: $(grep -m1 note "$OUT/c.err")" || fail "C: $(tail -3 "$OUT/c.out" "$OUT/c.err")"

# ---- long and malformed settings: fence errors, never dropped ----------------------------------
# One 8,190-byte CUDATRACE_HINTS filled the preload library's settings pool, and the group and
# budget read after it were dropped as if unset: the process ran unfenced, in silence.
LONG=/$(head -c 8189 /dev/zero | tr '\0' h)
"${E[@]}" CUDATRACE_HINTS="$LONG" CUDATRACE_GROUP=long CUDATRACE_BUDGET=2GiB python3 "$OUT/take.py" 3 \
    >"$OUT/long.out" 2>"$OUT/long.err"
rc=$?
[ $rc = 3 ] && grep -q "mem_get_info total 2147483648 " "$OUT/long.out" && grep -q 'budget exceeded' "$OUT/long.err" &&
    pass "an 8,190-byte CUDATRACE_HINTS drops no fence setting: $(head -1 "$OUT/long.out"), 3 GiB denied" ||
    fail "long CUDATRACE_HINTS (exit $rc): $(cat "$OUT/long.out" "$OUT/long.err" | head -c 600)"
refused "on-exceed bogus" "CUDATRACE_ON_EXCEED='bogus' is not fail, warn or abort" "${E[@]}" \
    CUDATRACE_GROUP=bogus CUDATRACE_BUDGET=2GiB CUDATRACE_ON_EXCEED=bogus
refused "long group" "(8190 bytes) is not a group name" "${E[@]}" \
    CUDATRACE_GROUP="${LONG#/}g" CUDATRACE_BUDGET=2GiB

# ---- one grammar ---------------------------------------------------------------------------------
"${E[@]}" CUDATRACE_GROUP=half CUDATRACE_BUDGET=1.5GiB python3 "$OUT/take.py" 0.25 >"$OUT/g.out" 2>"$OUT/g.err"
grep -q "mem_get_info total 1610612736 " "$OUT/g.out" && pass "CUDATRACE_BUDGET=1.5GiB: $(head -1 "$OUT/g.out")" ||
    fail "1.5GiB: $(cat "$OUT/g.out" "$OUT/g.err" | head -3)"

# ---- a job's fence -------------------------------------------------------------------------------
JOB=(env LD_PRELOAD="$SHIM" CUDATRACE_LEDGER_DIR="$LEDGERS" CUDATRACE_GROUP=slurm-gpu0
     CUDATRACE_BUDGET=$((64 << 30)) CUDATRACE_SHARE=41 CUDATRACE_SHARE_BUDGET=2GiB
     CUDATRACE_SHARE_LABEL="slurm job 41" CUDATRACE_ON_FENCE_ERROR=refuse)
"${JOB[@]}" python3 -m cudatrace run -q --force -o "$OUT/job-trace" -- python3 "$OUT/take.py" 1 6 \
    >"$OUT/job.out" 2>"$OUT/job.err" &
J=$!
for _ in $(seq 240); do grep -q '^held' "$OUT/job.out" 2>/dev/null && break; kill -0 $J 2>/dev/null || break; sleep 0.25; done
python3 -m cudatrace status slurm-gpu0 --json --ledger-dir "$LEDGERS" >"$OUT/job-status.json" 2>&1
python3 - "$OUT/job-status.json" $J <<'PY' && pass "the launcher is no member of the job's share" || fail "members: $(head -c 600 "$OUT/job-status.json")"
import json, sys
ms = [m for m in json.load(open(sys.argv[1]))["ledgers"][0]["members"] if m["state"] == "alive"]
print("   members:", [(m["pid"], m["share"]) for m in ms])
sys.exit(0 if ms and int(sys.argv[2]) not in [m["pid"] for m in ms] else 1)
PY
wait $J
python3 -m cudatrace report "$OUT/job-trace" >"$OUT/job-report.txt" 2>&1
grep -q "share of slurm job 41" "$OUT/job-report.txt" && pass "the run's report: $(grep -m1 '  budget ' "$OUT/job-report.txt")" ||
    fail "report: $(grep -m1 budget "$OUT/job-report.txt")"
grep -m1 "device used by everyone" "$OUT/job-report.txt" | grep -vq " of 2.00 GiB" &&
    pass "the device's real size: $(grep -m1 'device used by everyone' "$OUT/job-report.txt")" ||
    fail "device size: $(grep -m1 'device used' "$OUT/job-report.txt")"
grep -q "mem_get_info total 2147483648 " "$OUT/job.out" && pass "the job's program sees its share: $(head -1 "$OUT/job.out")" ||
    fail "the program's mem_get_info: $(head -1 "$OUT/job.out")"

# ---- the sealed fence: a record the process cannot write, the environment only lowers -----------
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
    fail "the sealed fence checks need root and unshare (private mount namespaces)"
else
    export SEALED="$OUT/sealed"
    rm -rf "$SEALED"
    mkdir -p "$SEALED/ns" "$SEALED/jobs" "$SEALED/ledgers"
    chmod 1777 "$SEALED/ledgers"
    rec() {  # rec FILE GROUP [KEY=VALUE...]: a record as cudatrace/fence_record.py renders it
        python3 - "$@" <<'PY'
import sys
from cudatrace import fence_record as f
import os
path, group, *kv = sys.argv[1:]
args = {"group": group, "ledger_dir": os.environ["SEALED"] + "/ledgers",
        "budget": str(64 << 30), "on_fence_error": "refuse"}
for item in kv:
    k, v = item.split("=", 1)
    args[k] = int(v) if k in ("share_budget", "uid") else v
open(path, "w").write(f.render(f.FenceRecord(**args)).text)
PY
        chmod 644 "$1"
    }
    in_ns() {  # in_ns FENCE_FILE_OR_- JOBS_DIR_OR_- CMD...: /etc and /run private, the record bound
        unshare --mount --propagation private sh -c '
            set -e
            w=$1; fence=$2; jobs=$3; shift 3
            mount -t tmpfs -o mode=755 tmpfs "$w"
            for d in etc run; do
                mkdir -p "$w/$d/up" "$w/$d/work"
                mount -t overlay overlay -o "lowerdir=/$d,upperdir=$w/$d/up,workdir=$w/$d/work" "/$d"
            done
            mkdir -p -m 755 /etc/cudatrace /run/cudatrace
            if [ "$fence" != - ]; then
                : >/etc/cudatrace/fence
                mount --bind "$fence" /etc/cudatrace/fence
                mount -o remount,bind,ro /etc/cudatrace/fence
            fi
            if [ "$jobs" != - ]; then mkdir -p /run/cudatrace/jobs; mount --bind "$jobs" /run/cudatrace/jobs; fi
            exec "$@"' in_ns "$SEALED/ns" "$@"
    }
    rec "$SEALED/container" team budget=2147483648
    in_ns "$SEALED/container" - env LD_PRELOAD="$SHIM" CUDATRACE_BUDGET=64GiB CUDATRACE_GROUP=mine \
        CUDATRACE_LEDGER_DIR=/tmp python3 "$OUT/take.py" 3 >"$OUT/sealed-c.out" 2>"$OUT/sealed-c.err"
    grep -q "mem_get_info total 2147483648 " "$OUT/sealed-c.out" && grep -q '^OOM' "$OUT/sealed-c.out" &&
        grep -q "the sealed fence (/etc/cudatrace/fence) holds" "$OUT/sealed-c.err" &&
        pass "a container's record holds CUDATRACE_BUDGET=64GiB to 2 GiB: $(grep -m1 'sealed fence' "$OUT/sealed-c.err" | head -c 300)" ||
        fail "container record: $(cat "$OUT/sealed-c.out" "$OUT/sealed-c.err" | head -c 600)"
    rec "$SEALED/jobs/41" slurm-gpu0 share=41 share_budget=2147483648 "share_label=slurm job 41" uid="$(id -u)"
    in_ns - "$SEALED/jobs" env LD_PRELOAD="$SHIM" SLURM_JOB_ID=41 CUDATRACE_SHARE_BUDGET=64GiB \
        python3 "$OUT/take.py" 3 >"$OUT/sealed-j.out" 2>"$OUT/sealed-j.err"
    grep -q "mem_get_info total 2147483648 " "$OUT/sealed-j.out" && grep -q '^OOM' "$OUT/sealed-j.out" &&
        grep -q "CUDATRACE_SHARE_BUDGET='64GiB' (not below the fence)" "$OUT/sealed-j.err" &&
        pass "a Slurm job's record holds CUDATRACE_SHARE_BUDGET=64GiB to its 2 GiB share: $(grep -m1 'budget exceeded' "$OUT/sealed-j.err" | head -c 240)" ||
        fail "job record: $(cat "$OUT/sealed-j.out" "$OUT/sealed-j.err" | head -c 600)"
    printf 'cudatrace-fence 1\ngroup=team\nbudget=lots\nledger-dir=/x\n' >"$SEALED/damaged"
    refused "damaged record" "budget='lots' is not a budget" in_ns "$SEALED/damaged" - \
        env LD_PRELOAD="$SHIM" CUDATRACE_ON_FENCE_ERROR=warn
    # a long setting beside the record: the fence holds, and the environment is still weighed
    in_ns "$SEALED/container" - env LD_PRELOAD="$SHIM" CUDATRACE_HINTS="$LONG" CUDATRACE_BUDGET=64GiB \
        python3 "$OUT/take.py" 3 >"$OUT/sealed-l.out" 2>"$OUT/sealed-l.err"
    grep -q "mem_get_info total 2147483648 " "$OUT/sealed-l.out" && grep -q '^OOM' "$OUT/sealed-l.out" &&
        grep -q "CUDATRACE_BUDGET='64GiB'" "$OUT/sealed-l.err" &&
        pass "an 8,190-byte CUDATRACE_HINTS beside the record: still 2 GiB, CUDATRACE_BUDGET=64GiB ignored" ||
        fail "long setting beside the record: $(cat "$OUT/sealed-l.out" "$OUT/sealed-l.err" | head -c 600)"
    # another user's job: its record names its uid, this process (root) names the job
    rec "$SEALED/jobs/42" slurm-gpu0 share=42 share_budget=2147483648 "share_label=slurm job 42" uid=61011
    refused "another user's job record" "is another user's job's" in_ns - "$SEALED/jobs" \
        env LD_PRELOAD="$SHIM" SLURM_JOB_ID=42 CUDATRACE_ON_FENCE_ERROR=warn
fi

# ---- a truncated ledger survived (two users of the node, the real driver) -----------------------
# Each user maps only its own part of a shared group; the others read it with pread: a user who
# truncates its own part kills none of the other user's processes and never a reader.
SH="$OUT/shared"; PUB="$OUT/pub"; UA=61011; UB=61012
asuser() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups "$@"; }
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
    fail "truncated ledger: needs root and setpriv (util-linux) to run two users"
else
    rm -rf "$SH" "$PUB"; mkdir -p "$SH" "$PUB"; chmod 1777 "$SH"; chmod 755 "$OUT" "$PUB"
    touch "$SH/.cudatrace-shared"  # root made it for ledgers (an unmarked sticky one is refused)
    cp "$SHIM" "$PUB/libcudatrace.so"
    cat >"$PUB/alloc.py" <<'PY'
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def alloc(gib):
    p = ctypes.c_uint64()
    return cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(gib * (1 << 30))))
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
print("cuInit", cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), 0),
      cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), flush=True)
print("alloc1", alloc(float(sys.argv[1])), flush=True)
print("held", flush=True)
if len(sys.argv) > 3:
    deadline = time.time() + 120
    while not os.path.exists(sys.argv[2]) and time.time() < deadline:
        time.sleep(0.1)
    print("alloc2", alloc(float(sys.argv[3])), flush=True)
time.sleep(float(os.environ.get("HOLD_S", "0")))
print("done", flush=True)
PY
    chmod -R a+rX "$PUB"
fi
if [ "$(id -u)" = 0 ] && ! asuser $UB test -r "$PUB/alloc.py"; then
    fail "truncated ledger: $OUT is not reachable by other users (give an OUTDIR under /tmp)"
elif [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    U=(env LD_PRELOAD="$PUB/libcudatrace.so" CUDATRACE_LEDGER_DIR="$SH" CUDATRACE_GROUP=trust
       CUDATRACE_BUDGET=8GiB)
    rm -f "$OUT/trunc.flag" "$OUT/agent.in"
    asuser $UA "${U[@]}" HOLD_S=60 python3 "$PUB/alloc.py" 2 >"$OUT/alice.out" 2>"$OUT/alice.err" &
    PA=$!
    asuser $UB "${U[@]}" HOLD_S=10 python3 "$PUB/alloc.py" 1 "$OUT/trunc.flag" 1 \
        >"$OUT/bob.out" 2>"$OUT/bob.err" &
    PB=$!
    if wait_held "$OUT/alice.out" $PA && wait_held "$OUT/bob.out" $PB; then
        pass "Alice (uid $UA) holds 2 GiB and Bob (uid $UB) 1 GiB of group trust: $(ls "$SH" | tr '\n' ' ')"
        cat >"$OUT/agent.py" <<'PY'
import json, sys
from pathlib import Path
from cudatrace.deploy.agent import Agent, Config
base = Path(sys.argv[1]); base.mkdir(exist_ok=True); (base / "groups.conf").write_text("")
cfg = Config(groups=base / "groups.conf", root=base / "root", state=base / "state",
             cdi_dir=base / "cdi", vendor="trust.cudatrace.dev", interval=0.1, node="gpu")
a = Agent(cfg, say=lambda line: print("SAY " + line, flush=True))
a.prepare()
for _ in sys.stdin:
    a.cycle()
    print("PASS " + json.dumps(a.published()), flush=True)
PY
        mkfifo "$OUT/agent.in"
        python3 "$OUT/agent.py" "$OUT/agent-base" <"$OUT/agent.in" >"$OUT/agent.out" 2>"$OUT/agent.err" &
        PG=$!
        exec 7>"$OUT/agent.in"
        echo >&7; sleep 3
        if asuser $UA truncate -s 0 "$SH/trust@$UB.ledger" 2>"$OUT/deny.err"; then
            fail "Alice truncated Bob's part"
        else
            pass "Alice cannot truncate Bob's part: $(head -c 160 "$OUT/deny.err")"
        fi
        asuser $UA truncate -s 0 "$SH/trust@$UA.ledger" && pass "Alice truncated her own part" ||
            fail "Alice could not truncate her own part"
        echo >&7; sleep 3
        touch "$OUT/trunc.flag"
        for _ in $(seq 100); do grep -q '^alloc2' "$OUT/bob.out" && break; kill -0 $PB 2>/dev/null || break; sleep 0.1; done
        python3 -m cudatrace status trust --json --ledger-dir "$SH" >"$OUT/trust-status.json" 2>"$OUT/trust-status.err"
        python3 - "$OUT/trust-status.json" $UA $UB <<'PY' && pass "status read the group" || fail "status: $(head -c 600 "$OUT/trust-status.json") $(head -c 300 "$OUT/trust-status.err")"
import json, sys
st = json.load(open(sys.argv[1]))
ua, ub = int(sys.argv[2]), int(sys.argv[3])
bob = [m for g in st["ledgers"] for m in g["members"] if m.get("uid") == ub and m["state"] == "alive"]
held = sum(d["held"] for m in bob for d in m["devices"].values())
print("   Bob counted:", held / (1 << 30), "GiB (allocations and context); unusable:",
      [e["path"] for e in st["errors"]])
assert bob and held >= 2 << 30, st
assert [e["path"].endswith(f"trust@{ua}.ledger") for e in st["errors"]] == [True], st["errors"]
PY
        wait $PB; rb=$?
        grep -q '^alloc2 0$' "$OUT/bob.out" && [ $rb = 0 ] &&
            pass "Bob ran on (exit $rb) and allocated 1 GiB more after Alice's truncation" ||
            fail "Bob: exit $rb: $(tail -3 "$OUT/bob.out" "$OUT/bob.err")"
        echo >&7; sleep 3; exec 7>&-
        wait $PG; rg=$?
        [ $rg = 0 ] && grep -q "SAY skipping the ledger .*trust@$UA.ledger" "$OUT/agent.out" &&
            pass "the node agent survived and said: $(grep -m1 'SAY skipping' "$OUT/agent.out" | head -c 200)" ||
            fail "the node agent: exit $rg: $(tail -3 "$OUT/agent.err") $(grep SAY "$OUT/agent.out" | tail -3)"
    else
        fail "two users: $(tail -2 "$OUT/alice.out" "$OUT/alice.err" "$OUT/bob.out" "$OUT/bob.err")"
    fi
    kill $PA $PB 2>/dev/null; wait $PA $PB 2>/dev/null
fi

echo "== $fails failed"
[ $fails = 0 ]
