#!/usr/bin/env bash
# sealed_shm.sh OUTDIR - a sealed trace on tmpfs (/dev/shm) on a CUDA machine: 8 threads of
# cudaMallocAsync/cudaFreeAsync pairs (tools/gpu/bench_alloc.cu `async_threads`, ~8 M events,
# ~50 MB of trace) traced into /dev/shm. Checks, on the real driver, what tests/integration/test_sealed_disks.py and test_trace_at_rest.py check on
# the simulated one:
#   - the program's own exit status (no SIGBUS from the trace cut at exit);
#   - the trace's sealed chunks punched: it takes about one chunk of /dev/shm after the run's
#     summary read it back, and `report` takes no room back either;
#   - `report --json` reads every event the shim wrote (END's count), no chunk lost, exit 0.
# From the repository root:   bash tools/gpu/sealed_shm.sh /tmp/sealed
# Prints one PASS/FAIL line per check; exit status 1 when any failed.
set -u
OUT=${1:?usage: sealed_shm.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
make -s -C native OUT=../cudatrace/_native || exit 1
bash tools/gpu/build.sh "$OUT/bin" >"$OUT/build.log" 2>&1 || { echo "FAIL build (see $OUT/build.log)"; exit 1; }
TRACE=/dev/shm/cudatrace-sealed-$$
rm -rf "$TRACE"
trap 'rm -rf "$TRACE"' EXIT
python3 -m cudatrace run -o "$TRACE" -- "$OUT/bin/bench_alloc" async_threads 4096 8 500000 \
    >"$OUT/run.out" 2>"$OUT/run.err"
RC=$?
python3 - "$TRACE" "$RC" "$OUT" <<'PY'
import json, os, subprocess, sys
trace_dir, rc, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fails = 0
def check(ok, what):
    global fails
    fails += not ok
    print(("PASS " if ok else "FAIL ") + what)
check(rc == 0, f"the program's exit status under cudatrace run: {rc}")
traces = [os.path.join(trace_dir, f) for f in os.listdir(trace_dir) if f.endswith(".ctrace")]
main = max(traces, key=os.path.getsize)
st = os.stat(main)
check(st.st_blocks * 512 <= (2 << 20) + (64 << 10),
      f"{os.path.basename(main)}: {st.st_size} bytes, {st.st_blocks * 512} on /dev/shm after the summary")
before = os.statvfs(trace_dir)
r = subprocess.run([sys.executable, "-m", "cudatrace", "report", trace_dir, "--json"],
                   capture_output=True, text=True)
after = os.statvfs(trace_dir)
grew = (before.f_bfree - after.f_bfree) * after.f_frsize
check(r.returncode == 0, f"report exit status {r.returncode}")
check(grew <= 64 << 10, f"/dev/shm used {grew} more bytes after report")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check(not j.get("lost_chunks"), f"lost chunks: {j.get('lost_chunks')}")
from cudatrace.analyze.read.trace import read_trace
t = read_trace(main)
check(t.status == "complete" and t.end is not None and t.n_events == t.end.events and t.gaps == 0,
      f"events read back {t.n_events}, written {t.end.events if t.end else None}, gaps {t.gaps}")
open(os.path.join(out, "sealed_shm.txt"), "w").write(f"fails {fails}\n")
sys.exit(1 if fails else 0)
PY
