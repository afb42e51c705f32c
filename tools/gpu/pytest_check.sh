#!/usr/bin/env bash
# The pytest plugin on a real GPU (issue 23): `pytest --cudatrace` with PyTorch, CuPy and JAX.
#
#   bash tools/gpu/pytest_check.sh [OUTDIR]     (from the repository root; default /tmp/ct-pytest)
#
# Needs a CUDA GPU, python3 with pytest, torch (CUDA build), cupy and jax[cuda], plus click, cffi,
# pyelftools. The suites are tools/gpu/pytest_suite/*.py; each run's output goes to OUTDIR.
#   1. torch: a test whose tensors and cuBLAS workspace exceed limit_gpu_memory("64 MiB") fails
#      naming its own lines (a, b, the matmul, d) with bytes
#   2. torch + CuPy: torch.cuda.max_memory_allocated() misses the CuPy array (and cuBLAS's own
#      memory); the plugin's peak counts it: both figures printed
#   3. JAX: limit_gpu_memory("8 GiB") fails on XLA's preallocation (75% of the device at the first
#      array operation) naming the test's line; with XLA_PYTHON_CLIENT_PREALLOCATE=false it passes
# Prints PASS/FAIL lines; exit status: the number of FAILs.
set -u
OUT=${1:-/tmp/ct-pytest}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
make -s -C native OUT=../cudatrace/_native || { echo "FAIL shim build"; exit 1; }
nvidia-smi -L 2>&1 | head -2
S=tools/gpu/pytest_suite
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
line() { grep -n "# LINE:$2\b" "$S/$1" | cut -d: -f1; }
# the plugin from this checkout (-p), whether or not the package's entry point is installed
run() {  # run NAME ARGS...: pytest output to OUT/NAME.txt, figures to OUT/NAME.json
  local name=$1; shift
  timeout 240 $PY -m pytest -p cudatrace.pytest_plugin --cudatrace -s -q -p no:cacheprovider \
    --cudatrace-json "$OUT/$name.json" --cudatrace-dir "$OUT/$name.traces" "$@" \
    >"$OUT/$name.txt" 2>&1
  echo "---- $name (exit $?)"; cat "$OUT/$name.txt"
}
fig() { $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(next(t[sys.argv[3]] for t in d['tests'] if t['nodeid'].endswith(sys.argv[2])))" "$@" 2>/dev/null; }

# 1. torch over its limit
run torch "$S/test_torch_limits.py::test_torch_matmul_over_limit"
T="$OUT/torch.txt"
if grep -q "Test was limited to 64.0 MiB" "$T" &&
   grep -q "test_torch_limits.py:$(line test_torch_limits.py a) in test_torch_matmul_over_limit" "$T" &&
   grep -q "test_torch_limits.py:$(line test_torch_limits.py d) in test_torch_matmul_over_limit" "$T"; then
  pass "torch: limit_gpu_memory failure names the test's lines (peak $(fig "$OUT/torch.json" over_limit peak) bytes of its own allocations)"
else fail "torch: the failure does not name lines $(line test_torch_limits.py a) and $(line test_torch_limits.py d)"; fi
grep -q "test_torch_limits.py:$(line test_torch_limits.py mm) in test_torch_matmul_over_limit" "$T" &&
  echo "note: the matmul's line (cuBLAS workspace, result) is among the sites"

# 2. what torch.cuda.max_memory_allocated() misses
export TORCH_FIGURE="$OUT/torch_figure.json"
run blind "$S/test_torch_limits.py::test_torch_blind_to_cupy"
tf=$($PY -c "import json; print(json.load(open('$TORCH_FIGURE'))['torch_max_memory_allocated'])" 2>/dev/null)
cf=$(fig "$OUT/blind.json" blind_to_cupy peak)
echo "torch.cuda.max_memory_allocated(): ${tf:-?} bytes; cudatrace plugin peak: ${cf:-?} bytes"
if [ -n "$tf" ] && [ -n "$cf" ] && [ "$cf" -ge $((tf + (256 << 20))) ]; then
  pass "plugin counts the CuPy array torch misses ($cf >= $tf + 256 MiB)"
else fail "plugin peak ${cf:-?} is not torch's ${tf:-?} + 256 MiB"; fi

# 3. JAX
run jax "$S/test_jax_limit.py"
if grep -q "test_jax_limit.py:$(line test_jax_limit.py jax) in test_jax_small_array" "$OUT/jax.txt"; then
  pass "jax: XLA's preallocation ($(fig "$OUT/jax.json" small_array peak) bytes) fails limit_gpu_memory naming the test's line"
else fail "jax: preallocation not named at line $(line test_jax_limit.py jax)"; fi
XLA_PYTHON_CLIENT_PREALLOCATE=false run jax_noprealloc "$S/test_jax_limit.py"
if grep -q "1 passed" "$OUT/jax_noprealloc.txt"; then
  pass "jax without preallocation: under 8 GiB (peak $(fig "$OUT/jax_noprealloc.json" small_array peak) bytes)"
else fail "jax without preallocation did not pass"; fi
echo "pytest_check: $fails FAIL(s)"
exit $fails
