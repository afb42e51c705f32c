#!/usr/bin/env bash
# bench_async_pairs.sh OUTDIR [ROUNDS] - the added cost of a cudaMallocAsync/cudaFreeAsync pair
# from a pool (tools/gpu/bench_alloc.cu `async 1M`) on a CUDA machine: uninstrumented, under
# `cudatrace run` with default stacks, and with `--stack-depth 0`, ROUNDS rounds (default 5)
# alternated in ONE invocation of tools/bench_overhead.py (medians, spread, added ns per pair).
# From the repository root:   bash tools/gpu/bench_async_pairs.sh /tmp/async
# Prints the table and one line per config, "PASS async stacks added N ns per pair" when the
# added cost with default stacks is <= 500 ns (issue 25's half of round 2's +643 ns would be
# ~320), "FAIL ..." otherwise; also the trace's bytes per event of the stacks config.
set -u
OUT=${1:?usage: bench_async_pairs.sh OUTDIR [ROUNDS]}
ROUNDS=${2:-5}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
mkdir -p "$OUT/traces"
make -s -C native OUT=../cudatrace/_native || exit 1
python3 tools/bench_overhead.py --out "$OUT" --cases async_1MiB --configs bare,stacks,nostack \
    --rounds "$ROUNDS" --tmp "$OUT/traces" || { echo "FAIL bench_overhead.py failed"; exit 1; }
python3 - "$OUT/results.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
res = next((r for r in doc["results"] if r["case"] == "async_1MiB"), None)
if res is None:
    print("FAIL no async_1MiB result")
    sys.exit(1)
med = {c: s.get("median") for c, s in res["configs"].items()}
if any(med.get(c) is None for c in ("bare", "stacks", "nostack")):
    print("FAIL a config has no runs:", med)
    sys.exit(1)
bare, stacks, nostack = med["bare"], med["stacks"], med["nostack"]
print(f"async pair ns (medians of the rounds): bare {bare:.0f}, default stacks {stacks:.0f} "
      f"(+{stacks - bare:.0f}), --stack-depth 0 {nostack:.0f} (+{nostack - bare:.0f})")
print(("PASS" if stacks - bare <= 500 else "FAIL") + f" async stacks added {stacks - bare:.0f} ns per pair")
PY
cat "$OUT/results.md" 2>/dev/null
