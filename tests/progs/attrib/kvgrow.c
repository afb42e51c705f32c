/* kvgrow.c - a plain C program whose allocator layer has one client in small runs and two in
 * large ones (tests/integration/test_attrib_shapes.py, sweep): every buffer comes through
 *   tensor_new -> device_get -> cuMemAlloc_v2
 * from kv_buffer (one per layer); from --layers 16 up, a spill_buffer too (a code path only
 * large configurations take). One run alone cannot tell tensor_new is a layer when only
 * kv_buffer calls it; the sweep's runs together can.   kvgrow --layers N */
#include "cuda_min.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, used))

NOINLINE unsigned long long device_get(size_t bytes)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, bytes) != 0) {
        fprintf(stderr, "kvgrow: out of memory\n");
        exit(1);
    }
    return p;
}

NOINLINE unsigned long long tensor_new(size_t bytes) { return device_get((bytes + 255) & ~255ul); }

NOINLINE unsigned long long kv_buffer(int layer) { return tensor_new(16 * ATTRIB_MiB + 0 * layer); }

NOINLINE unsigned long long spill_buffer(void) { return tensor_new(2 * ATTRIB_MiB); }

int main(int argc, char **argv)
{
    int layers = argc > 2 && !strcmp(argv[1], "--layers") ? atoi(argv[2]) : 4;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 2;
    for (int i = 0; i < layers; i++)
        kv_buffer(i);
    if (layers >= 16)
        spill_buffer();
    printf("ready\n");
    return 0;
}
