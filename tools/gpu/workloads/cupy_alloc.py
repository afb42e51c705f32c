"""CuPy arrays of known sizes, then freed (GPU suite).

CuPy's default memory pool rounds a request to 512 bytes and calls cudaMalloc once per new
block (cuMemAlloc_v2 of that size); free_all_blocks() gives the blocks back with cudaFree.
Prints the same lines as the C programs (tools/gpu/gpu_common.h):
  alloc cupy SIZE PTR / free cupy PTR / meminfo FREE TOTAL / info KEY VALUE / done
"""

import sys

import cupy as cp

MiB = 1 << 20
SIZES = (8 * MiB, 24 * MiB, 40 * MiB + 512)  # multiples of 512: no rounding


def allocate_arrays():
    out = []
    for n in SIZES:
        a = cp.zeros(n, dtype=cp.uint8)
        print("alloc cupy %d 0x%x" % (a.nbytes, a.data.ptr), flush=True)
        out.append(a)
    return out


def main():
    print(f"info cupy {cp.__version__}")
    print("info cuda_runtime %d" % cp.cuda.runtime.runtimeGetVersion())
    arrays = allocate_arrays()
    cp.cuda.Device(0).synchronize()
    f, t = cp.cuda.runtime.memGetInfo()
    print("meminfo %d %d" % (f, t))
    ptrs = [a.data.ptr for a in arrays]
    del arrays
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    for p in ptrs:
        print(f"free cupy 0x{p:x}")
    print("info pool_used %d" % pool.used_bytes())
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
