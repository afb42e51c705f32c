#!/usr/bin/env bash
# ranks.sh OUTDIR - issue 24 item 4 on a GPU: a 2-"host" x 4-rank PyTorch job started by torchrun
# (two agents on this machine, --nnodes 2, static rendezvous on 127.0.0.1; the "hosts" named
# through CUDATRACE_HOST), each agent traced by its own `cudatrace run` into its own directory.
# Every rank allocates 256 MiB with torch.empty and holds it 3 s; rank 5 allocates 1 GiB. All
# ranks share GPU 0, so each "host"'s device 0 holds its four ranks' memory.
# Checks, from one merged `cudatrace report A B --json`: the rank variables torchrun set reached
# every worker's trace (8 ranks, RANK 0-7, 2 hosts), rank 5 is named as the outlier, per-rank
# peaks (256 MiB and 1 GiB, as requested), no device figure above what NVML saw used on the GPU,
# and that --by rank, --html (8 rank timelines) and export work. Prints PASS/FAIL lines.
# Needs python3 with torch and torchrun, and nvidia-smi. Exit 0 when every check passes.
set -u
. "$(dirname "$0")/common.sh"
cat >"$OUT/worker.py" <<'EOF'
import os, time
import torch
rank = int(os.environ["RANK"])
n = 4 if rank == 5 else 1
held = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(n)]
torch.cuda.synchronize()
print("rank", rank, "holds", n * 256, "MiB", flush=True)
time.sleep(3)
EOF
rm -rf "$OUT/run"
mkdir -p "$OUT/run"
PORT=${PORT:-29531}
pids=()
for node in 0 1; do
    host=host$([ $node = 0 ] && echo A || echo B)
    CUDATRACE_HOST=$host CUDA_VISIBLE_DEVICES=0 python3 -m cudatrace run -q -o "$OUT/run/$host" -- \
        torchrun --nnodes 2 --node-rank $node --nproc-per-node 4 --master-addr 127.0.0.1 \
        --master-port "$PORT" "$OUT/worker.py" >"$OUT/$host.out" 2>"$OUT/$host.err" &
    pids+=($!)
done
: >"$OUT/nvml.csv"   # NVML's used memory every 0.5 s while the agents run (the highest is kept)
while kill -0 "${pids[0]}" 2>/dev/null || kill -0 "${pids[1]}" 2>/dev/null; do
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits >>"$OUT/nvml.csv" 2>&1
    sleep 0.5
done
status=0
for p in "${pids[@]}"; do wait "$p" || { echo "FAIL a torchrun agent exited non-zero (see $OUT/*.err)"; status=1; }; done
python3 -m cudatrace report "$OUT/run/hostA" "$OUT/run/hostB" >"$OUT/report.txt" 2>&1
python3 -m cudatrace report "$OUT/run" --json >"$OUT/report.json" 2>"$OUT/report.err"
python3 -m cudatrace report "$OUT/run" --by rank --at peak >"$OUT/by_rank.txt" 2>&1 || status=1
python3 -m cudatrace report "$OUT/run" --html "$OUT/report.html" >/dev/null 2>&1 || status=1
python3 -m cudatrace export "$OUT/run" --format perfetto -o "$OUT/run.pftrace" 2>"$OUT/export.err" ||
    python3 -m cudatrace export "$OUT/run" --format folded -o "$OUT/run.folded" 2>>"$OUT/export.err" ||
    { echo "FAIL export"; status=1; }
sed -n '/^Peak/,/^Traced versus/p' "$OUT/report.txt"
python3 - "$OUT" <<'EOF' || status=1
import json, sys
out = sys.argv[1]
d = json.load(open(out + "/report.json"))
rk = d["ranks"] or {}
ok = True
def check(what, cond, detail=""):
    global ok
    print(("PASS " if cond else "FAIL ") + what + (": " + detail if detail else ""))
    ok = ok and cond
MiB = 1 << 20
ranks = {x["label"]: x for x in rk.get("ranks", [])}
check("8 ranks from RANK on 2 hosts", sorted(ranks) == ["rank %d" % i for i in range(8)]
      and len(rk.get("hosts", [])) == 2, "%s; hosts %s" % (sorted(ranks), [h["host"] for h in rk.get("hosts", [])]))
check("rank 5 named as the outlier", [o["label"] for o in rk.get("outliers", [])] == ["rank 5"],
      str(rk.get("outliers")))
peaks = {k: v["peak_bytes"] // MiB for k, v in ranks.items()}
check("per-rank peaks: 256 MiB, rank 5 1024 MiB (torch.empty's requests)",
      all(v >= (1024 if k == "rank 5" else 256) and v < (1024 if k == "rank 5" else 256) + 64
          for k, v in peaks.items()), str(peaks))
used = 0
for line in open(out + "/nvml.csv"):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[1].isdigit():
        used = max(used, int(parts[1]))
top = max((x["peak_bytes"] for x in rk.get("devices", [])), default=0) // MiB
check("no device figure above what NVML saw used on the GPU", 0 < top <= used or used == 0,
      "highest device peak %d MiB, NVML used %d MiB (both hosts' ranks on one GPU)" % (top, used))
check("headline peak is one device's", d["peak_bytes"] // MiB == top and d.get("peak_scope") == "device",
      "%d MiB" % (d["peak_bytes"] // MiB))
html = open(out + "/report.html").read()
check("HTML: a timeline per rank", html.count('class="rank-line"') == 8)
print("sites across ranks:", [(s["label"], s["ranks"], s["median_bytes"] // MiB) for s in rk.get("sites", [])[:3]])
sys.exit(0 if ok else 1)
EOF
[ $status = 0 ] && echo "PASS ranks.sh" || echo "FAIL ranks.sh"
exit $status
