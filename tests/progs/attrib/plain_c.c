/* plain_c.c - a plain C program whose static helper, called once from main, is the site: at -O2
 * the compiler inlines it into main, so only the debug information's inline frames name it
 * (tests/integration/test_attrib_shapes.py).   plain_c [--mib M] */
#include "cuda_min.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CUdeviceptr alloc_big_device(size_t mib)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, mib * ATTRIB_MiB) != 0) {
        fprintf(stderr, "plain_c: out of memory\n");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 2 && !strcmp(argv[1], "--mib") ? (size_t)atoi(argv[2]) : 448;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 2;
    CUdeviceptr p = alloc_big_device(mib);
    printf("ready %llx\n", p);
    return 0;
}
