/* group_loop.cu - one member of a group budget on the GPU (tools/gpu/group_budget.sh).
 *
 * Usage: group_loop CHUNK HOLD_S [MAX]    (CHUNK in MiB; MAX: stop after MAX chunks)
 * Launches one kernel first (as a service does some work: with lazy loading that is when its
 * module is loaded), then cudaMalloc's CHUNK MiB at a time until an allocation fails, prints
 * "held N CHUNK_BYTES pid PID" and keeps everything for HOLD_S seconds, so that NVML can be read
 * while all members hold their memory. Exit 0 when an allocation was refused, 1 if none was.
 */
#include <cuda_runtime.h>

#include "gpu_common.h"

__global__ void touch(int *p) { p[threadIdx.x] = threadIdx.x; }

extern "C" NOINLINE cudaError_t group_alloc(size_t size, void **out)
{
    return cudaMalloc(out, size);
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: group_loop CHUNK_MIB HOLD_S [MAX]\n");
        return 2;
    }
    gc_line_buffered();
    size_t chunk = (size_t)atoll(argv[1]) << 20;
    int hold = atoi(argv[2]);
    int max = argc == 4 ? atoi(argv[3]) : 4096;
    int *small = NULL;
    if (cudaMalloc(&small, 4096) != cudaSuccess) {
        fprintf(stderr, "group_loop: CUDA init failed\n");
        return 2;
    }
    touch<<<1, 32>>>(small);
    cudaDeviceSynchronize();
    int n = 0;
    cudaError_t e = cudaSuccess;
    for (; n < max; n++) {
        void *p = NULL;
        e = group_alloc(chunk, &p);
        if (e != cudaSuccess)
            break;
    }
    printf("held %d %zu pid %d result %s\n", n, chunk, (int)getpid(), cudaGetErrorName(e));
    sleep(hold);
    return e == cudaErrorMemoryAllocation ? 0 : 1;
}
