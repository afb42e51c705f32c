/* layers.c - a program whose every device allocation goes through a three-level allocator layer
 * with neutral names, as an inference engine's do (tests/integration/test_layers.py):
 *
 *   tensor_create -> pool_obtain -> device_take -> cuMemAlloc_v2
 *
 * called from a weights loader (1 large + many small), a KV-cache initializer (N x M MiB, one
 * kv_layer_buffer per layer), a table builder and a per-step workspace. Options:
 *   --kv-layers N --kv-mib M --small K --steps S
 *   --reconfigure      free the KV cache and build it again from reconfigure() (init_kv_cache
 *                      then has two callers: load_model, which also loads weights, and this)
 *   --direct-kv        init_kv_cache calls tensor_create itself (no per-layer buffer)
 *   --recursive-table  build_table recurses three times before it allocates
 *   --raw-workspace    the workspace takes memory from pool_obtain directly (nested layers)
 *   --single           only the weights loader allocates (a layer with a single caller)
 *   --keep-going       after a failed allocation, wait 2 s before exiting (a server that
 *                      keeps running after the out-of-memory)
 * Prints "ready" and exits 0; an allocation that fails prints the function and exits 1.
 * Build: cc -O0 -g -fno-omit-frame-pointer -rdynamic layers.c -lcuda
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

#define NOINLINE __attribute__((noinline, used))
#define MiB (1ULL << 20)

static int direct_kv, recursive_table, raw_workspace, keep_going;

/* ---- the allocator layer: three levels, no "alloc" in the names ---- */
NOINLINE CUdeviceptr device_take(size_t bytes)
{
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc_v2(&p, bytes);
    if (r != 0) {
        fprintf(stderr, "layers: device_take(%zu) failed: CUresult %d\n", bytes, r);
        if (keep_going) { /* a server that keeps running after the out-of-memory */
            sleep(2);
            fprintf(stderr, "layers: still serving after the denial\n");
        }
        exit(1);
    }
    return p;
}

NOINLINE CUdeviceptr pool_obtain(size_t bytes)
{
    size_t rounded = (bytes + 255) & ~(size_t)255;
    return device_take(rounded);
}

NOINLINE CUdeviceptr tensor_create(size_t bytes) { return pool_obtain(bytes); }

/* ---- the program's subsystems ---- */
static CUdeviceptr kv[4096];
static int kv_n;

NOINLINE void load_weights(int small)
{
    tensor_create(64 * MiB); /* the big matrix */
    for (int i = 0; i < small; i++)
        tensor_create(1 * MiB); /* norms, biases */
}

NOINLINE CUdeviceptr kv_layer_buffer(size_t bytes) { return tensor_create(bytes); }

NOINLINE void init_kv_cache(int layers, size_t mib)
{
    for (int i = 0; i < layers; i++)
        kv[kv_n++] = direct_kv ? tensor_create(mib * MiB) : kv_layer_buffer(mib * MiB);
}

NOINLINE void build_table(int depth)
{
    if (recursive_table && depth > 0) {
        build_table(depth - 1);
        return;
    }
    tensor_create(3 * MiB);
}

NOINLINE CUdeviceptr step_workspace(void)
{
    return raw_workspace ? pool_obtain(8 * MiB) : tensor_create(8 * MiB);
}

NOINLINE void load_model(int small, int layers, size_t mib, int single)
{
    load_weights(small);
    if (single)
        return;
    init_kv_cache(layers, mib);
    build_table(3);
}

NOINLINE void reconfigure(int layers, size_t mib)
{
    while (kv_n > 0)
        cuMemFree_v2(kv[--kv_n]);
    init_kv_cache(layers, mib);
}

NOINLINE void serve(int steps)
{
    CUdeviceptr ws = 0;
    for (int s = 0; s < steps; s++) {
        if (ws)
            cuMemFree_v2(ws);
        ws = step_workspace();
    }
}

int main(int argc, char **argv)
{
    int layers = 28, small = 20, steps = 5, reconf = 0, single = 0;
    size_t mib = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--kv-layers"))
            layers = atoi(v), i++;
        else if (!strcmp(a, "--kv-mib"))
            mib = (size_t)atoi(v), i++;
        else if (!strcmp(a, "--small"))
            small = atoi(v), i++;
        else if (!strcmp(a, "--steps"))
            steps = atoi(v), i++;
        else if (!strcmp(a, "--reconfigure"))
            reconf = 1;
        else if (!strcmp(a, "--direct-kv"))
            direct_kv = 1;
        else if (!strcmp(a, "--recursive-table"))
            recursive_table = 1;
        else if (!strcmp(a, "--raw-workspace"))
            raw_workspace = 1;
        else if (!strcmp(a, "--keep-going"))
            keep_going = 1;
        else if (!strcmp(a, "--single"))
            single = 1;
        else {
            fprintf(stderr, "layers: unknown option %s\n", a);
            return 2;
        }
    }
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) {
        fprintf(stderr, "layers: no CUDA device\n");
        return 1;
    }
    load_model(small, layers, mib, single);
    if (reconf)
        reconfigure(layers, mib);
    if (!single)
        serve(steps);
    printf("ready\n");
    return 0;
}
