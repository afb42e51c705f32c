/* bench_pairs.c - N cuMemAllocAsync + cuMemFreeAsync pairs through the linked driver symbols:
 * the async pair whose cost the shim's hot path sets. tools/bench_callgrind.sh runs it on the
 * simulated driver under callgrind, with and without the shim, to count instructions per pair
 * (deterministic, unlike wall time on a shared machine).
 *
 *   bench_pairs PAIRS          exit 0 when every call succeeded
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);

__attribute__((noinline)) static CUresult one_pair(void)
{
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocAsync(&p, 1 << 20, (CUstream)0);
    if (r)
        return r;
    return cuMemFreeAsync(p, (CUstream)0);
}

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 10000;
    CUresult r = cuInit(0);
    for (long i = 0; i < pairs && r == 0; i++)
        r = one_pair();
    if (r) {
        fprintf(stderr, "bench_pairs: CUresult %d\n", (int)r);
        return 1;
    }
    printf("pairs %ld\n", pairs);
    return 0;
}
