# common.sh - the start the GPU checks of tools/gpu share, sourced after `set -u` with the
# script's own arguments (`. "$(dirname "$0")/common.sh"`): OUTDIR, the first argument, made
# and absolute in OUT; HERE, this folder; REPO, the checkout, made the working directory and put
# first in PYTHONPATH (so `python3 -m cudatrace` is this checkout's from anywhere); the native
# libraries built into cudatrace/_native, or "FAIL shim build" and exit 2.
OUT=${1:?usage: $(basename "$0") OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
make -s -C native OUT=../cudatrace/_native || { echo "FAIL shim build"; exit 2; }
