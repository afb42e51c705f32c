#!/usr/bin/env bash
# aggregate_check.sh OUTDIR [SECONDS] [PERIOD] - `cudatrace run --aggregate` of a loop of
# stream-ordered allocations (aggregate_loop.cu) on a CUDA machine, the trace's size printed
# every 10 s while it runs, then the report's peak and KV site against what the program says.
#   defaults: 600 s, a new peak every 60 s. From the repository root:
#     tools/gpu/aggregate_check.sh /tmp/agg 600 60
# Prints "size T APPARENT_BYTES DISK_BYTES DIR_BYTES" lines (the trace file; the whole trace
# directory, the sampler's files included), the program's "done" line, the report's figures,
# and "PASS" when the trace file stayed <= 4 MiB on disk, the directory <= 6 MiB, and the report
# matches.
set -u
OUT=${1:?usage: aggregate_check.sh OUTDIR [SECONDS] [PERIOD]}
SECS=${2:-600}
PERIOD=${3:-60}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
"$NVCC" -g -O2 -arch="${GPU_ARCH:-sm_90}" -Xcompiler -fno-omit-frame-pointer \
    -Xlinker --export-dynamic -o "$OUT/aggregate_loop" "$HERE/aggregate_loop.cu" || exit 1
make -s -C native OUT=../cudatrace/_native || exit 1
rm -rf "$OUT/trace"
python3 -m cudatrace run -q --aggregate -o "$OUT/trace" -- "$OUT/aggregate_loop" "$SECS" "$PERIOD" \
    >"$OUT/loop.out" 2>"$OUT/loop.err" &
RUN=$!
start=$(date +%s)
maxdisk=0
maxdir=0
while kill -0 "$RUN" 2>/dev/null; do
    sleep 10
    f=$(ls "$OUT"/trace/*.ctrace 2>/dev/null | head -1)
    [ -n "$f" ] || continue
    app=$(stat -c %s "$f"); disk=$(( $(stat -c %b "$f") * $(stat -c %B "$f") ))
    dir=$(du -sb "$OUT/trace" | cut -f1)
    [ "$disk" -gt "$maxdisk" ] && maxdisk=$disk
    [ "$dir" -gt "$maxdir" ] && maxdir=$dir
    echo "size $(( $(date +%s) - start )) $app $disk $dir"
done
ls -l "$OUT/trace"
wait "$RUN"; echo "run exit $?"
tail -1 "$OUT/loop.out"
python3 -m cudatrace report "$OUT/trace" --json >"$OUT/report.json" || exit 1
python3 - "$OUT/report.json" "$OUT/loop.out" "$maxdisk" "$maxdir" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
done = open(sys.argv[2]).read().split("done")[-1].split()
want = dict(zip(done[::2], map(int, done[1::2])))
kv = sum(s["bytes"] for s in rep["sites"] if any("kv_layer" in (f.get("function") or "") for f in s["frames"]))
agg = rep["aggregate"]["files"][0]
print("report peak", rep["peak_bytes"], "want", want["peak"], "| kv", kv, "want", want["kv"],
      "| allocs", agg["allocs"], "snapshots", agg["snapshots_written"], "| max on disk", sys.argv[3],
      "| directory at most", sys.argv[4], "| samples read", rep["observed"]["samples"])
# the runtime may allocate a little of its own through the driver: the peak may exceed the
# program's arithmetic by that (printed); the KV site must be exact
print("peak - program's figure:", rep["peak_bytes"] - want["peak"])
ok = (kv == want["kv"] and 0 <= rep["peak_bytes"] - want["peak"] < (64 << 20)
      and int(sys.argv[3]) <= 4 << 20 and int(sys.argv[4]) <= 6 << 20)
print("PASS" if ok else "FAIL")
PY
