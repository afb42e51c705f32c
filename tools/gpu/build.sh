#!/usr/bin/env bash
# build.sh OUTDIR - build the GPU-suite programs (tools/gpu) with nvcc.
#
#   runtime_basic_static   runtime_basic.cu, static CUDA runtime (nvcc's default)
#   runtime_basic_shared   runtime_basic.cu, --cudart shared (libcudart.so)
#   runtime_basic_ptsz     runtime_basic.cu, static, --default-stream per-thread (_ptsz variants)
#   driver_api             driver_api.c, driver API only, linked with -lcuda
#   over_budget            over_budget.cu, static runtime
#   bench_alloc            bench_alloc.cu, static runtime
#   alloc_layers           alloc_layers.cu, static runtime: an engine's allocator class hierarchy
#   contention_probe       contention_probe.cu, static runtime and the driver (-lcuda)
#
# Environment:
#   NVCC             nvcc to use (default: nvcc on PATH, else $CUDA_HOME/bin/nvcc)
#   GPU_ARCH         nvcc -arch value (default sm_90; the programs launch no kernels of their own)
#   CUDA_DRIVER_LIB  a libcuda.so[.1] to link driver_api against (default: the installed driver,
#                    else the toolkit's stub)
#   DRIVER_API_DEFS  extra -D flags for driver_api (GPU_SIM=1 for the simulated driver)
# Exit status: non-zero if any program failed to build.
set -u
OUT=${1:?usage: build.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")}
if [ ! -x "$NVCC" ]; then
    echo "build.sh: nvcc not found (set NVCC or CUDA_HOME)" >&2
    exit 1
fi
ARCH=${GPU_ARCH:-sm_90}
# -g -lineinfo: file:line in reports; frame pointers, no sibling calls: every named function
# keeps its frame; --export-dynamic (-rdynamic): names reach dladdr (the budget message).
COMMON=(-g -O2 -lineinfo "-arch=$ARCH" -I"$HERE"
        -Xcompiler -fno-omit-frame-pointer,-fno-optimize-sibling-calls,-Wall
        -Xlinker --export-dynamic)

find_libcuda() {
    if [ -n "${CUDA_DRIVER_LIB:-}" ]; then
        echo "$CUDA_DRIVER_LIB"
        return
    fi
    local p
    p=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64|libcuda\.so\.1 .*AArch64/ {print $NF; exit}')
    if [ -z "$p" ]; then
        p=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}')
    fi
    for c in "$p" /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 \
             /usr/lib/aarch64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 \
             "$CUDA_HOME/lib64/stubs/libcuda.so" "$CUDA_HOME"/targets/*/lib/stubs/libcuda.so; do
        if [ -n "$c" ] && [ -e "$c" ]; then
            echo "$c"
            return
        fi
    done
}

LOGDIR="$OUT/.build-logs"
mkdir -p "$LOGDIR"
declare -A PIDS

build() {   # name, then nvcc arguments
    local name=$1
    shift
    ( "$NVCC" "${COMMON[@]}" "$@" -o "$OUT/$name" ) >"$LOGDIR/$name.log" 2>&1 &
    PIDS[$name]=$!
}

build runtime_basic_static "$HERE/runtime_basic.cu" -lpthread
build runtime_basic_shared --cudart shared "$HERE/runtime_basic.cu" -lpthread
build runtime_basic_ptsz --default-stream per-thread "$HERE/runtime_basic.cu" -lpthread
build over_budget "$HERE/over_budget.cu"
build bench_alloc "$HERE/bench_alloc.cu"
build alloc_layers "$HERE/alloc_layers.cu"

LIBCUDA=$(find_libcuda)
if [ -z "$LIBCUDA" ]; then
    echo "build.sh: no libcuda.so found to link driver_api (set CUDA_DRIVER_LIB)" >"$LOGDIR/driver_api.log"
    ( exit 1 ) &
    PIDS[driver_api]=$!
else
    # link by path: a driver install often has only libcuda.so.1, which -lcuda does not find
    build driver_api --cudart none ${DRIVER_API_DEFS:-} "$HERE/driver_api.c" \
        -L"$(dirname "$LIBCUDA")" "-l:$(basename "$LIBCUDA")"
    build contention_probe "$HERE/contention_probe.cu" -lpthread \
        -L"$(dirname "$LIBCUDA")" "-l:$(basename "$LIBCUDA")"
fi

fail=0
for name in "${!PIDS[@]}"; do
    if wait "${PIDS[$name]}"; then
        echo "built $OUT/$name"
    else
        echo "build.sh: FAILED to build $name:" >&2
        cat "$LOGDIR/$name.log" >&2
        fail=1
    fi
done
exit $fail
