/* over_budget.cu - asks cudaMalloc (static runtime) for SIZE bytes from a named function.
 *
 * Usage: over_budget SIZE        (SIZE in bytes; suffixes K, M, G = 2^10, 2^20, 2^30)
 * Prints "result <cudaError_t name>" and, on success, an alloc line.
 * Exit status: 0 if the allocation failed with cudaErrorMemoryAllocation (what a budget smaller
 * than SIZE must cause), 1 if it succeeded, 2 on any other error.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "gpu_common.h"

static unsigned long long parse_size(const char *s)
{
    char *end = NULL;
    double v = strtod(s, &end);
    unsigned long long mul = 1;
    if (end && *end) {
        switch (*end) {
        case 'k': case 'K': mul = 1ull << 10; break;
        case 'm': case 'M': mul = 1ull << 20; break;
        case 'g': case 'G': mul = 1ull << 30; break;
        default: fprintf(stderr, "over_budget: bad size %s\n", s); exit(2);
        }
    }
    return (unsigned long long)(v * (double)mul);
}

extern "C" NOINLINE cudaError_t allocate_giant_pool(size_t size, void **out)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    *out = p;
    if (e == cudaSuccess)
        gc_alloc("cudaMalloc", size, p);
    return e;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: over_budget SIZE\n");
        return 2;
    }
    gc_line_buffered();
    size_t size = (size_t)parse_size(argv[1]);
    cudaError_t e0 = cudaFree(0);
    if (e0 != cudaSuccess) {
        fprintf(stderr, "over_budget: CUDA init failed: %s\n", cudaGetErrorName(e0));
        return 2;
    }
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) == cudaSuccess)
        gc_meminfo(f, t);
    printf("info request %zu\n", size);
    void *p = NULL;
    cudaError_t e = allocate_giant_pool(size, &p);
    printf("result %s\n", cudaGetErrorName(e));
    if (e == cudaSuccess) {
        cudaFree(p);
        gc_free("cudaFree", p);
        printf("done\n");
        return 1;
    }
    (void)cudaGetLastError();   /* clear the sticky-free error state */
    /* the process must still be usable after a denial */
    void *small = NULL;
    cudaError_t e2 = cudaMalloc(&small, 1 << 20);
    printf("after %s\n", cudaGetErrorName(e2));
    if (e2 == cudaSuccess)
        cudaFree(small);
    printf("done\n");
    return e == cudaErrorMemoryAllocation ? 0 : 2;
}
