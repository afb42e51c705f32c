#!/usr/bin/env bash
# `cudatrace sweep` on a real GPU (issue 15): PyTorch swept over sizing knobs, laws printed.
#
#   tools/gpu/sweep_torch.sh [OUTDIR [N ...]]   (from the repository root; default /tmp/ct-sweep;
#                                                N: only the sweeps numbered N below)
#
# Needs a CUDA GPU and python3 with torch (CUDA build), click, cffi, pyelftools. Runs
# tools/gpu/workloads/torch_kv.py (weights, one KV tensor per layer of 64 KiB per block, a
# forward pass of a batch):
#   1. --num-blocks 256,512,1024 --expect 64KiB --predict 4096: the KV per-layer law, 28 layers x
#      64 KiB = 1.75 MiB per block, flagged against a promised 64 KiB per block
#   2. --batch 4,8,16,32: the activations' law in the batch size (the caching allocator's
#      rounding may make it steps)
#   3. a grid: --layers 8,16 x --num-blocks 256,512
#   4. the server form: --until-url (it answers HTTP after start-up), values 256,512
#   5. --budget 8GiB with one value too big: that run fails under the budget and is left out
# Each sweep's text goes to OUTDIR/N-*.txt and its JSON to OUTDIR/N-*.json; everything is
# printed as well. Exit status: the number of sweeps that did not exit 0.
set -u
OUT=${1:-/tmp/ct-sweep}
shift
ONLY=" $* "
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
make -s -C shim OUT=../cudatrace/_native || { echo "shim build failed"; exit 1; }
nvidia-smi -L 2>&1 | head -2
$PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "sweep_torch: torch with CUDA is not importable by $PY"; exit 2; }
W=tools/gpu/workloads/torch_kv.py
PORT=${PORT:-18431}
fails=0

sweep() {  # sweep NAME ARGS... : text to OUT/NAME.txt, JSON read back from DIR/sweep.json
  local name=$1; shift
  if [ "$ONLY" != "  " ] && [[ "$ONLY" != *" ${name%%-*} "* ]]; then return; fi
  echo
  echo "==== $name: cudatrace sweep $*"
  rm -rf "$OUT/$name"
  timeout "${SWEEP_TIMEOUT:-300}" $PY -m cudatrace sweep -o "$OUT/$name" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
  local st=$?
  cat "$OUT/$name.err" "$OUT/$name.txt"
  cp "$OUT/$name/sweep.json" "$OUT/$name.json" 2>/dev/null
  echo "==== $name: exit $st"
  [ $st -eq 0 ] || fails=$((fails + 1))
}

sweep 1-kv-blocks --values 256,512,1024 --expect 64KiB --predict 4096 -- \
  $PY $W --layers 28 --num-blocks {}
sweep 2-batch --values 4,8,16,32 --predict 64 -- \
  $PY $W --num-blocks 64 --batch {}
sweep 3-grid --values layers=8,16 --values blocks=256,512 --predict layers=32,blocks=1024 -- \
  $PY $W --layers {layers} --num-blocks {blocks}
sweep 4-server --values 256,512 --until-url "http://127.0.0.1:$PORT/health" --settle 2s \
  --grace 5s -- $PY $W --num-blocks {} --serve $PORT
sweep 5-budget --values 256,512,8192 --budget 8GiB -- \
  $PY $W --layers 28 --num-blocks {}

echo
echo "sweep_torch: $fails sweep(s) did not exit 0; outputs in $OUT"
exit $fails
