#!/usr/bin/env bash
# container_budget.sh OUTDIR - a GPU memory budget that a container gets, on a CUDA machine.
#
# The node agent (`cudatrace node`) installs the preload library and writes a CDI spec whose
# device is a budget (BUDGET, default 8GiB) under a vendor of this run's own in /var/run/cdi
# (removed at the end). A process then runs with that device:
#   - in Podman (ENGINE=podman, the default where podman works): `podman run --rootfs /:O` (the
#     host's files, an overlay on top), the GPU (nvidia.com/gpu=all where NVIDIA's CDI spec is
#     installed, else /dev/nvidia*), and `--device <vendor>/budget=BUDGET`;
#   - else (ENGINE=unshare, root): the same CDI edits applied by tools/gpu/apply_cdi.py in a new
#     mount and pid namespace, chrooted into the host's directories.
# Either way the process is in a pid namespace of its own, so NVML's host pid is not its own:
# its CUDA context is counted by the agent, which maps it to its host pid.
#
# The process (WORKLOAD=torch, default where PyTorch imports; WORKLOAD=driver: the same steps
# through the driver API with ctypes, no PyTorch): prints the memory info it sees (total = the
# budget), holds HOLD of it, waits until the agent has counted its context, then asks for
# what would fit without the context (BUDGET - HOLD - 256 MiB): denied, with the shim's line.
# Printed: PASS/FAIL lines, the denial line, the agent's figures (in use, context) beside
# NVML's (nvidia-smi's per-process used memory and the device's). Exit 0 when all pass.
#
# Then the sealed fence (docs/budgets.md, "The sealed fence"): the device's record is mounted
# read-only at /etc/cudatrace/fence; a second process in a container given the device sets
# CUDATRACE_BUDGET to 8 times the budget (and another group, in /tmp) and takes 256 MiB at a time
# up to twice the budget: it holds no more than the budget, and one line says what the fence
# ignored; root in the container cannot write the record; an 8,190-byte CUDATRACE_HINTS beside
# the raise changes nothing.
# Needs root. About a minute.
#
# A dry run without a GPU, on the simulated driver of the tests (ENGINE=unshare WORKLOAD=driver
# SIM_DIR=<a tests/support/simbuild.py build, e.g. $CUDATRACE_SIM_BUILDDIR> SIM_CTX=300MiB):
# the agent and the process share a simulated GPU, whose NVML names host pids.
set -u
OUT=${1:?usage: container_budget.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
chmod 755 "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
BUDGET=${BUDGET:-8GiB}
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
[ "$(id -u)" = 0 ] || { echo "FAIL container_budget.sh needs root"; exit 2; }
make -s -C native OUT=../cudatrace/_native || { echo "FAIL shim build"; exit 2; }
python3 -c 'import prometheus_client' 2>/dev/null ||
    { echo "FAIL the node agent needs prometheus_client: pip install prometheus_client"; exit 2; }
budget_bytes=$(python3 -c "from cudatrace.units import parse_size; print(parse_size('$BUDGET'))")

# ---- the workload ------------------------------------------------------------------------
WORKLOAD=${WORKLOAD:-$(python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null && echo torch || echo driver)}
HOLD=${HOLD:-$((budget_bytes / 2))}
EXTRA=${EXTRA:-$((budget_bytes - HOLD - (256 << 20)))}
GO="$OUT/go"
rm -f "$GO"
cat >"$OUT/take.py" <<'PY'
import ctypes, os, sys, time
hold, extra, go, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if how == "torch":
    import torch
    free, total = torch.cuda.mem_get_info()
    def alloc(n):
        try:
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            return t, ""
        except torch.cuda.OutOfMemoryError as e:
            return None, str(e).splitlines()[0]
else:  # the driver API through ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
    free, total = f.value, t.value
    def alloc(n):
        p = ctypes.c_uint64()
        rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
        return (p, "") if rc == 0 else (None, f"cuMemAlloc_v2 returned {rc}")
print(f"mem_get_info total {total} free {free}", flush=True)
x, why = alloc(hold)
print("held" if x is not None else f"not held: {why}", flush=True)
deadline = time.time() + 120
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.2)
y, why = alloc(extra)
print("extra granted" if y is not None else f"OOM {why}", flush=True)
PY
case "$WORKLOAD" in
torch | driver) CMD=(python3 "$OUT/take.py" "$HOLD" "$EXTRA" "$GO" "$WORKLOAD") ;;
*) echo "FAIL WORKLOAD=$WORKLOAD: torch or driver"; exit 2 ;;
esac
BINDS="$OUT"
if [ -n "${SIM_DIR:-}" ]; then  # the dry run: a simulated GPU shared with the agent
    : >"$OUT/sim.state"
    chmod 666 "$OUT/sim.state"
    export LD_LIBRARY_PATH="$SIM_DIR/lib" CUDASIM_STATE="$OUT/sim.state"
    export CUDASIM_CTX_BYTES=$(python3 -c "from cudatrace.units import parse_size; print(parse_size('${SIM_CTX:-300MiB}'))")
    CMD=(env CUDASIM_HOST_PROC=/host/proc "${CMD[@]}")
    BINDS="$OUT:$SIM_DIR"
fi
echo "workload: $WORKLOAD (${CMD[*]})"

# ---- the node agent and its spec ----------------------------------------------------------
VENDOR="gpu$$.cudatrace.dev"
PORT=${PORT:-9480}
python3 -m cudatrace node --root "$OUT/root" --state "$OUT/state" --cdi-dir /var/run/cdi \
    --vendor "$VENDOR" --budget "$BUDGET" --listen "127.0.0.1:$PORT" --interval 0.5 \
    >"$OUT/agent.log" 2>&1 &
AGENT=$!
SPEC="/var/run/cdi/$VENDOR-budget.json"
cleanup() {
    kill "$AGENT" 2>/dev/null
    wait "$AGENT" 2>/dev/null
    rm -f "$SPEC" "/var/run/cdi/$VENDOR-group.json"
}
trap cleanup EXIT
for _ in $(seq 120); do grep -q "serving metrics" "$OUT/agent.log" && break; sleep 0.5; done
grep -q "serving metrics" "$OUT/agent.log" && pass "node agent: $(head -1 "$OUT/agent.log")" ||
    { fail "node agent: $(tail -n 5 "$OUT/agent.log")"; exit 1; }
metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())"; }

# ---- the container -------------------------------------------------------------------------
ENGINE=${ENGINE:-}
if [ -z "$ENGINE" ]; then
    if command -v podman >/dev/null && podman run --rm --network host --rootfs /:O true >/dev/null 2>&1; then
        ENGINE=podman
    else
        ENGINE=unshare
    fi
fi
echo "engine: $ENGINE"
if [ "$ENGINE" = podman ]; then
    if grep -qs 'nvidia.com/gpu' /etc/cdi/* /var/run/cdi/*; then
        GPU=(--device nvidia.com/gpu=all)
    else
        GPU=()
        for d in /dev/nvidia*; do [ -c "$d" ] && GPU+=(--device "$d"); done
    fi
    [ -n "${SIM_DIR:-}" ] && GPU+=(-v /proc:/host/proc:ro)
    RUN=(podman run --rm --network host --security-opt label=disable --env-host
         -v "$OUT:$OUT" "${GPU[@]}" --device "$VENDOR/budget=$BUDGET" --rootfs /:O)
else
    RUN=(unshare --mount --pid --fork env "BIND=$BINDS" HOST_PROC_AT=/host/proc
         python3 "$HERE/apply_cdi.py" "$SPEC" "$BUDGET" "$OUT/root.mnt" --)
fi
"${RUN[@]}" "${CMD[@]}" >"$OUT/a.out" 2>"$OUT/a.err" &
A=$!
if true; then
    for _ in $(seq 240); do grep -q '^held' "$OUT/a.out" 2>/dev/null && break; kill -0 $A 2>/dev/null || break; sleep 0.25; done
    grep -q '^held' "$OUT/a.out" && pass "holds $HOLD bytes under budget=$BUDGET" ||
        fail "did not hold: $(tail -n 5 "$OUT/a.out" "$OUT/a.err")"
    grep -q "mem_get_info total $budget_bytes " "$OUT/a.out" && pass "sees the budget as the device: $(head -1 "$OUT/a.out")" ||
        fail "mem_get_info: $(head -1 "$OUT/a.out")"
    ctx=""
    for _ in $(seq 60); do
        ctx=$(metrics | awk '/^cudatrace_budget_context_bytes\{.*group="container@/ && $2 > 0 {print $2; exit}')
        [ -n "$ctx" ] && break
        sleep 0.5
    done
    [ -n "$ctx" ] && pass "the agent counted the container's CUDA context: $ctx bytes" ||
        fail "no context counted (agent log: $(tail -n 3 "$OUT/agent.log"))"
    echo "--- the agent's figures"
    metrics | grep -E '^cudatrace_budget_(in_use|context|member_in_use)_bytes\{.*container@' | tee "$OUT/metrics.txt"
    echo "--- NVML's: per process (host pids), then the device"
    python3 -c 'from cudatrace.nvml import Nvml
nv = Nvml()
print(nv.processes() if nv.available else nv.why)
print(nv.memory() if nv.available else "")' | tee "$OUT/nvml.txt"
    touch "$GO"
fi
wait $A
rc=$?
line=$(grep -m1 'cudatrace: budget exceeded' "$OUT/a.err")
[ -n "$line" ] && pass "denial line: $line" || fail "no denial line (exit $rc): $(tail -n 5 "$OUT/a.out" "$OUT/a.err")"
grep -q '^OOM' "$OUT/a.out" && pass "the $EXTRA bytes that fit beside the allocations, not beside the context too: $(grep -m1 OOM "$OUT/a.out")" ||
    fail "extra: $(tail -n 3 "$OUT/a.out")"
# ---- the sealed fence: the container's environment cannot raise its budget ---------------------
cat >"$OUT/raise.py" <<'PY'
import ctypes, sys
budget, how = int(sys.argv[1]), sys.argv[2]
step, held = 256 << 20, []
if how == "torch":
    import torch
    def alloc():
        try:
            held.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
            return True
        except torch.cuda.OutOfMemoryError:
            return False
else:
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
    def alloc():
        p = ctypes.c_uint64()
        ok = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(step)) == 0
        held.append(p) if ok else None
        return ok
while len(held) * step < 2 * budget and alloc():
    pass
print(f"held {len(held) * step} of budget {budget}", flush=True)
PY
RAISE=(python3 "$OUT/raise.py" "$budget_bytes" "$WORKLOAD")
[ -n "${SIM_DIR:-}" ] && RAISE=(env CUDASIM_HOST_PROC=/host/proc "${RAISE[@]}")
"${RUN[@]}" sh -c "echo x > /etc/cudatrace/fence 2>/dev/null && echo WROTE; CUDATRACE_BUDGET=$((budget_bytes * 8)) CUDATRACE_GROUP=mine CUDATRACE_LEDGER_DIR=/tmp exec \"\$@\"" raise "${RAISE[@]}" \
    >"$OUT/raise.out" 2>"$OUT/raise.err"
held=$(awk '/^held /{print $2}' "$OUT/raise.out")
[ -n "$held" ] && [ "$held" -le "$budget_bytes" ] && pass "CUDATRACE_BUDGET=8x raised nothing: $(cat "$OUT/raise.out")" ||
    fail "the raise: $(tail -n 5 "$OUT/raise.out" "$OUT/raise.err")"
line=$(grep -m1 'the sealed fence' "$OUT/raise.err")
[ -n "$line" ] && pass "one line: $line" || fail "no line of what the fence ignored: $(tail -n 5 "$OUT/raise.err")"
grep -q WROTE "$OUT/raise.out" && fail "root in the container wrote the record" ||
    pass "root in the container cannot write /etc/cudatrace/fence (read-only)"
# an 8,190-byte setting (it filled the preload library's settings pool, and the fence settings
# after it were dropped as if unset) changes nothing either
LONG=/$(head -c 8189 /dev/zero | tr '\0' h)
"${RUN[@]}" env CUDATRACE_HINTS="$LONG" CUDATRACE_BUDGET=$((budget_bytes * 8)) "${RAISE[@]}" \
    >"$OUT/long.out" 2>"$OUT/long.err"
held=$(awk '/^held /{print $2}' "$OUT/long.out")
[ -n "$held" ] && [ "$held" -le "$budget_bytes" ] && grep -q 'the sealed fence' "$OUT/long.err" &&
    pass "an 8,190-byte CUDATRACE_HINTS beside CUDATRACE_BUDGET=8x raised nothing: $(cat "$OUT/long.out")" ||
    fail "the long setting: $(tail -n 5 "$OUT/long.out" "$OUT/long.err")"

echo "container_budget: $fails failure(s); outputs in $OUT"
[ $fails = 0 ]
