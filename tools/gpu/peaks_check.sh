#!/usr/bin/env bash
# peaks_check.sh OUTDIR - peaks across processes and threads on a CUDA machine. From the
# repository root:   bash tools/gpu/peaks_check.sh /tmp/hp
#  1. three programs one after another, each leaking 2048 MiB: the report's peak is 2 GiB (one
#     program's), not 6 GiB;
#  2. 64 threads allocating and freeing 16 MiB buffers under --budget 1GiB (contexts counted):
#     the report's peak never exceeds what the budget ledger saw in use (contexts included),
#     nor the budget.
#  3. the same threads under --aggregate (the shim keeps the peak itself): the same bound.
#  4. a program holding 2048 MiB killed with SIGKILL, then one leaking 2048 MiB: the peak is
#     2 GiB (the killed one's memory ends when the launcher saw it exit), not 4 GiB.
# Prints the figures and one PASS/FAIL line per check; exit 0 when all pass. About a minute.
set -u
OUT=${1:?usage: peaks_check.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
"$NVCC" -O2 -arch="${GPU_ARCH:-sm_90}" -cudart shared -Xcompiler -fno-omit-frame-pointer \
    -o "$OUT/peaks" "$HERE/peaks.cu" -lpthread || exit 1
P="$OUT/peaks"
rc=0
rm -rf "$OUT/seq" "$OUT/thr" "$OUT/agg" "$OUT/kill" "$OUT/ready"
python3 -m cudatrace run -q -o "$OUT/seq" -- sh -c "$P leak 2048 && $P leak 2048 && $P leak 2048"
python3 - "$OUT/seq" <<'PY' || rc=1
import json, subprocess, sys
r = json.loads(subprocess.run([sys.executable, "-m", "cudatrace", "report", sys.argv[1], "--json"],
                              capture_output=True, text=True, check=True).stdout)
peak, never = r["peak_bytes"], r["end_bytes"]
print("sequential: peak %d MiB, never freed %d MiB" % (peak >> 20, never >> 20))
ok = peak == 2048 << 20 and never == 3 * (2048 << 20)
print("PASS sequential peak" if ok else "FAIL sequential peak (expected 2048 MiB)")
sys.exit(0 if ok else 1)
PY
for mode in thr agg; do
    extra=""
    [ "$mode" = agg ] && extra="--aggregate"
    python3 -m cudatrace run -q -o "$OUT/$mode" --budget 1GiB $extra -- "$P" threads 64 400 16
    python3 - "$OUT/$mode" "$mode" <<'PY' || rc=1
import json, subprocess, sys
d, mode = sys.argv[1], sys.argv[2]
r = json.loads(subprocess.run([sys.executable, "-m", "cudatrace", "report", d, "--json"],
                              capture_output=True, text=True, check=True).stdout)
run = json.load(open(d + "/run.json"))
led = max(x["peak"] for x in run["ledger_final"]["devices"])
peak = r["peak_bytes"]
name = "threads" if mode == "thr" else "threads --aggregate"
print("%s: traced peak %.1f MiB, ledger peak (contexts included) %.1f MiB, budget 1024 MiB"
      % (name, peak / 2**20, led / 2**20))
ok = 0 < peak <= led <= 1 << 30
print("PASS %s peak within the ledger" % name if ok else "FAIL %s peak above the ledger" % name)
sys.exit(0 if ok else 1)
PY
done
python3 -m cudatrace run -q -o "$OUT/kill" -- sh -c "$P hold 2048 > '$OUT/ready' & p=\$!; \
    until grep -q ready '$OUT/ready'; do sleep 0.1; done; sleep 1; kill -9 \$p; wait \$p; \
    sleep 1; $P leak 2048"
python3 - "$OUT/kill" <<'PY' || rc=1
import json, subprocess, sys
r = json.loads(subprocess.run([sys.executable, "-m", "cudatrace", "report", sys.argv[1], "--json"],
                              capture_output=True, text=True, check=True).stdout)
ended = [p.get("ended_time") for p in r["processes"] if p["status"] == "truncated"]
print("killed: peak %d MiB, killed process ended at %s s" % (r["peak_bytes"] >> 20, ended))
ok = r["peak_bytes"] == 2048 << 20 and len(ended) == 1 and ended[0] is not None
print("PASS killed process's memory ends" if ok else "FAIL killed peak (expected 2048 MiB)")
sys.exit(0 if ok else 1)
PY
exit $rc
