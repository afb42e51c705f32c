/* ort_chat.c - the executable over libonnxruntime-genai.so (ortlike.h):
 *   ort_chat [--layers N] [--mib M] [--serve] */
#include "cuda_min.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *OgaCreateGenerator(int layers, size_t mib, int serve);

int main(int argc, char **argv)
{
    int layers = 28, serve = 0;
    size_t mib = 16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--serve"))
            serve = 1;
    }
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 2;
    OgaCreateGenerator(layers, mib, serve);
    printf("ready\n");
    return 0;
}
