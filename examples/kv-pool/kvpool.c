/* kvpool.c - a small stand-in for an LLM server's start-up, with the KV-cache sizing defect of
 * vllm.cpp's vllm-server (see README.md): cudatrace's worked example.
 *
 * Like every inference engine, it allocates everything through its own allocator layer, here
 * three levels with neutral names: tensor_make() -> backend_acquire() -> device_carve(), which
 * calls the driver (cuMemAlloc_v2, cuMemAllocAsync or cuMemHostAlloc). cudatrace recognizes
 * that layer from the call graph and names the code above it (docs/attribution.md).
 *
 * What it does, as the server did:
 *   load_weights()        one tensor for the model weights (--model-bytes): cuMemAlloc_v2
 *   reserve_workspace()   a grow-only activation workspace, stream-ordered tensors
 *                         (cuMemAllocAsync/cuMemFreeAsync), grown over a few "profiling" batches
 *   compute_num_blocks()  the documented precedence: --num-blocks verbatim, else
 *                         --kv-cache-memory / bytes_per_block, else 256 blocks.
 *                         THE DEFECT: bytes_per_block counts ONE layer's page, while the pool
 *                         is allocated per layer, so the pool is `layers` times the budget.
 *   allocate_kv_cache()   one allocate_layer_kv() per attention layer: a tensor of
 *                         num_blocks x page bytes (cuMemAlloc_v2), zero-filled (cuMemsetD8_v2
 *                         when the driver has it)
 *   allocate_staging()    pinned host staging tensor (cuMemHostAlloc)
 * then prints "ready", frees everything and exits 0. When an allocation fails it prints the
 * CUresult and the function that failed, frees what it holds and exits 1 (under a cudatrace
 * budget the program stops with an error instead of eating the machine).
 *
 * CUDA driver API only, prototypes declared here (no CUDA headers): build with
 *   cc -O1 -g -fno-omit-frame-pointer -rdynamic kvpool.c -ldl -lcuda
 * It runs on a real GPU and on cudatrace's simulated driver (sim/), which has no
 * cuMemsetD8_v2: the optional entry points are looked up with dlsym.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---- the driver API, declared by hand ------------------------------------------------------ */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CU_STREAM_NON_BLOCKING 0x1

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemFreeHost(void *p);

/* optional: looked up at run time, skipped when the driver lacks them */
typedef CUresult (*memset_d8_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*error_name_fn)(CUresult, const char **);
typedef CUresult (*device_name_fn)(char *, int, CUdevice);
typedef CUresult (*primary_release_fn)(CUdevice);

static memset_d8_fn p_memset_d8;
static sync_fn p_ctx_synchronize;
static stream_fn p_stream_synchronize;
static stream_fn p_stream_destroy;
static error_name_fn p_error_name;
static device_name_fn p_device_name;
static primary_release_fn p_primary_release;

#if defined(__clang__)
#define NOINLINE __attribute__((noinline, used))
#else
#define NOINLINE __attribute__((noinline, noclone, used))
#endif

/* ---- the model and the options ------------------------------------------------------------- */
struct config {
    int layers;                   /* attention layers, each with its own KV pool */
    int kv_heads;
    int head_size;
    int block_size;               /* tokens per KV block */
    int dtype_bytes;
    long long num_blocks;         /* --num-blocks, -1: unset */
    unsigned long long kv_cache_memory; /* --kv-cache-memory, 0: unset */
    unsigned long long model_bytes;
    unsigned long long workspace_bytes; /* the largest workspace the profiling batches need */
    unsigned long long staging_bytes;
    int fixed_sizing;             /* --fixed-sizing: bytes_per_block counts every layer */
    double hold_seconds;          /* stay "ready" this long before shutting down */
    int device;
};

#define FALLBACK_NUM_BLOCKS 256

/* what the program holds, so that any exit path frees it */
struct state {
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUdeviceptr weights;
    CUdeviceptr workspace;
    size_t workspace_bytes;
    CUdeviceptr *kv;              /* one pool per layer */
    int kv_count;
    void *staging;
};

static struct state S;
static struct timespec T0;

static double elapsed(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - T0.tv_sec) + (double)(t.tv_nsec - T0.tv_nsec) / 1e9;
}

static const char *fmt_bytes(unsigned long long v, char *buf, size_t n)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    int u = 0;
    while (u < 4 && d >= 1024.0) {
        d /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", v);
    else
        snprintf(buf, n, "%.2f %s", d, units[u]);
    return buf;
}

static const char *result_name(CUresult r)
{
    const char *s = NULL;
    if (p_error_name && p_error_name(r, &s) == CUDA_SUCCESS && s)
        return s;
    switch (r) {
    case 0: return "CUDA_SUCCESS";
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 201: return "CUDA_ERROR_INVALID_CONTEXT";
    default: return "CUDA_ERROR_UNKNOWN";
    }
}

/* One line on stderr naming the CUresult and the function whose allocation failed. */
static void report_failure(const char *function, const char *api, unsigned long long bytes,
                           CUresult r, const char *what)
{
    char b[32];
    fprintf(stderr, "kvpool: error: %s: %s(%s)%s%s failed: %s (CUresult %d)\n", function, api,
            fmt_bytes(bytes, b, sizeof b), what ? " for " : "", what ? what : "",
            result_name(r), r);
}

/* Sizes: plain bytes, or with a suffix: KiB/MiB/GiB/TiB (also K/M/G/T, powers of 1024) or
 * KB/MB/GB/TB (powers of 1000). Fractions allowed: 1.5GiB. 0 on error. */
static unsigned long long parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return 0;
    while (*end == ' ')
        end++;
    static const struct { const char *suffix; double scale; } units[] = {
        {"", 1.0}, {"b", 1.0},
        {"k", 1024.0}, {"kib", 1024.0}, {"kb", 1e3},
        {"m", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
        {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
        {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(end, units[i].suffix))
            return (unsigned long long)(v * units[i].scale + 0.5);
    return 0;
}

/* ---- the allocator layer: tensor -> backend -> device -------------------------------------- */

enum placement { ON_DEVICE, ON_STREAM, PINNED_HOST };

/* The innermost helper: the one place that calls the driver. */
NOINLINE CUresult device_carve(unsigned long long *out, size_t bytes, enum placement where)
{
    CUdeviceptr d = 0;
    void *h = NULL;
    CUresult r;
    switch (where) {
    case ON_STREAM:
        r = cuMemAllocAsync(&d, bytes, S.stream);
        break;
    case PINNED_HOST:
        r = cuMemHostAlloc(&h, bytes, 0);
        d = (CUdeviceptr)(uintptr_t)h;
        break;
    default:
        r = cuMemAlloc_v2(&d, bytes);
    }
    *out = r == CUDA_SUCCESS ? d : 0;
    return r;
}

/* The backend: would pick a device, an arena, a stream; here it counts what it handed out. */
static unsigned long long backend_bytes;
NOINLINE CUresult backend_acquire(unsigned long long *out, size_t bytes, enum placement where)
{
    CUresult r = device_carve(out, bytes, where);
    if (r == CUDA_SUCCESS)
        backend_bytes += bytes;
    return r;
}

/* The tensor level: what the rest of the program calls. */
NOINLINE CUresult tensor_make(unsigned long long *out, size_t bytes, enum placement where)
{
    return backend_acquire(out, bytes, where);
}

static const char *placement_api(enum placement where)
{
    return where == ON_STREAM ? "cuMemAllocAsync"
                              : where == PINNED_HOST ? "cuMemHostAlloc" : "cuMemAlloc_v2";
}

/* ---- start-up, in the server's order ------------------------------------------------------- */

/* Bytes one KV block takes in ONE layer: K and V, block_size tokens, every kv head. */
static unsigned long long page_bytes(const struct config *c)
{
    return 2ULL * (unsigned long long)c->block_size * (unsigned long long)c->kv_heads *
           (unsigned long long)c->head_size * (unsigned long long)c->dtype_bytes;
}

NOINLINE int load_weights(const struct config *c)
{
    char b[32];
    CUresult r = tensor_make(&S.weights, c->model_bytes, ON_DEVICE);
    if (r != CUDA_SUCCESS) {
        report_failure("load_weights", placement_api(ON_DEVICE), c->model_bytes, r,
                       "the model weights");
        return -1;
    }
    if (p_memset_d8)
        p_memset_d8(S.weights, 0, c->model_bytes);   /* stands in for the upload */
    printf("kvpool: weights: %s in one allocation (load_weights)\n",
           fmt_bytes(c->model_bytes, b, sizeof b));
    return 0;
}

/* Grow-only: a bigger request frees the old buffer (stream-ordered) and allocates the new
 * size; a smaller one reuses what is there. */
NOINLINE int reserve_workspace(size_t bytes)
{
    if (bytes <= S.workspace_bytes)
        return 0;
    if (S.workspace) {
        CUresult fr = cuMemFreeAsync(S.workspace, S.stream);
        if (fr != CUDA_SUCCESS)
            fprintf(stderr, "kvpool: warning: reserve_workspace: cuMemFreeAsync: %s\n",
                    result_name(fr));
        S.workspace = 0;
        S.workspace_bytes = 0;
    }
    CUresult r = tensor_make(&S.workspace, bytes, ON_STREAM);
    if (r != CUDA_SUCCESS) {
        report_failure("reserve_workspace", placement_api(ON_STREAM), bytes, r, "the workspace");
        return -1;
    }
    S.workspace_bytes = bytes;
    return 0;
}

/* The documented precedence: --num-blocks verbatim, else --kv-cache-memory / bytes per
 * block, else a fallback of 256 blocks.
 * THE DEFECT (kept on purpose): bytes_per_block counts one layer's page, but
 * allocate_kv_cache() allocates num_blocks pages for EVERY layer, so the pool comes out
 * `layers` times the --kv-cache-memory budget. --fixed-sizing counts every layer. */
NOINLINE long long compute_num_blocks(const struct config *c, const char **how)
{
    if (c->num_blocks >= 0) {
        *how = "--num-blocks";
        return c->num_blocks;
    }
    if (c->kv_cache_memory > 0) {
        unsigned long long bytes_per_block = page_bytes(c);        /* one layer: the bug */
        if (c->fixed_sizing)
            bytes_per_block *= (unsigned long long)c->layers;      /* what it should be */
        *how = "--kv-cache-memory";
        return (long long)(c->kv_cache_memory / bytes_per_block);
    }
    *how = "fallback";
    return FALLBACK_NUM_BLOCKS;
}

/* One attention layer's pool: num_blocks pages, zero-filled. */
NOINLINE int allocate_layer_kv(int layer, long long num_blocks, unsigned long long page,
                               CUdeviceptr *out)
{
    char what[64];
    unsigned long long bytes = (unsigned long long)num_blocks * page;
    CUresult r = tensor_make(out, bytes, ON_DEVICE);
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "the KV cache of layer %d", layer);
        report_failure("allocate_layer_kv", placement_api(ON_DEVICE), bytes, r, what);
        return -1;
    }
    if (p_memset_d8) {
        r = p_memset_d8(*out, 0, bytes);
        if (r != CUDA_SUCCESS)
            fprintf(stderr, "kvpool: warning: allocate_layer_kv: cuMemsetD8_v2: %s\n",
                    result_name(r));
    }
    return 0;
}

NOINLINE int allocate_kv_cache(const struct config *c, long long num_blocks)
{
    S.kv = calloc((size_t)c->layers, sizeof *S.kv);
    if (!S.kv) {
        fprintf(stderr, "kvpool: error: allocate_kv_cache: out of host memory\n");
        return -1;
    }
    unsigned long long page = page_bytes(c);
    for (int layer = 0; layer < c->layers; layer++) {
        if (allocate_layer_kv(layer, num_blocks, page, &S.kv[layer]) != 0) {
            fprintf(stderr, "kvpool: error: allocate_kv_cache: stopped at layer %d of %d\n",
                    layer, c->layers);
            return -1;
        }
        S.kv_count = layer + 1;
    }
    if (p_ctx_synchronize)
        p_ctx_synchronize();
    return 0;
}

NOINLINE int allocate_staging(const struct config *c)
{
    char b[32];
    unsigned long long p = 0;
    CUresult r = tensor_make(&p, c->staging_bytes, PINNED_HOST);
    S.staging = (void *)(uintptr_t)p;
    if (r != CUDA_SUCCESS) {
        report_failure("allocate_staging", placement_api(PINNED_HOST), c->staging_bytes, r,
                       "the pinned staging buffer");
        return -1;
    }
    printf("kvpool: staging: %s pinned host memory (allocate_staging)\n",
           fmt_bytes(c->staging_bytes, b, sizeof b));
    return 0;
}

static void shutdown_all(void)
{
    if (S.staging)
        cuMemFreeHost(S.staging);
    S.staging = NULL;
    for (int i = S.kv_count - 1; i >= 0; i--)
        if (S.kv[i])
            cuMemFree_v2(S.kv[i]);
    S.kv_count = 0;
    free(S.kv);
    S.kv = NULL;
    if (S.workspace)
        cuMemFreeAsync(S.workspace, S.stream);
    S.workspace = 0;
    if (S.stream && p_stream_synchronize)
        p_stream_synchronize(S.stream);
    if (S.weights)
        cuMemFree_v2(S.weights);
    S.weights = 0;
    if (S.stream && p_stream_destroy)
        p_stream_destroy(S.stream);
    S.stream = NULL;
    if (S.ctx && p_primary_release)
        p_primary_release(S.dev);
    S.ctx = NULL;
}

static void *optional(const char *name)
{
    return dlsym(RTLD_DEFAULT, name);
}

static int init_driver(const struct config *c)
{
    char b1[32], b2[32];
    p_memset_d8 = (memset_d8_fn)optional("cuMemsetD8_v2");
    p_ctx_synchronize = (sync_fn)optional("cuCtxSynchronize");
    p_stream_synchronize = (stream_fn)optional("cuStreamSynchronize");
    p_stream_destroy = (stream_fn)optional("cuStreamDestroy_v2");
    p_error_name = (error_name_fn)optional("cuGetErrorName");
    p_device_name = (device_name_fn)optional("cuDeviceGetName");
    p_primary_release = (primary_release_fn)optional("cuDevicePrimaryCtxRelease_v2");

    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "kvpool: error: cuInit failed: %s (CUresult %d)\n", result_name(r), r);
        return -1;
    }
    if ((r = cuDeviceGet(&S.dev, c->device)) != CUDA_SUCCESS) {
        fprintf(stderr, "kvpool: error: cuDeviceGet(%d) failed: %s (CUresult %d)\n", c->device,
                result_name(r), r);
        return -1;
    }
    r = cuDevicePrimaryCtxRetain(&S.ctx, S.dev);
    if (r == CUDA_SUCCESS)
        r = cuCtxSetCurrent(S.ctx);
    else {
        S.ctx = NULL;
        p_primary_release = NULL;
        CUcontext ctx;
        r = cuCtxCreate_v2(&ctx, 0, S.dev);
    }
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "kvpool: error: no context on device %d: %s (CUresult %d)\n", c->device,
                result_name(r), r);
        return -1;
    }
    if ((r = cuStreamCreate(&S.stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
        fprintf(stderr, "kvpool: error: cuStreamCreate failed: %s (CUresult %d)\n",
                result_name(r), r);
        return -1;
    }
    char name[128] = "CUDA device";
    if (p_device_name)
        p_device_name(name, sizeof name, S.dev);
    size_t fr = 0, tot = 0;
    if (cuMemGetInfo_v2(&fr, &tot) == CUDA_SUCCESS)
        printf("kvpool: device %d: %s, %s total, %s free\n", c->device, name,
               fmt_bytes(tot, b1, sizeof b1), fmt_bytes(fr, b2, sizeof b2));
    else
        printf("kvpool: device %d: %s\n", c->device, name);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpool [--num-blocks N] [--kv-cache-memory SIZE] [--model-bytes SIZE]\n"
            "              [--layers N] [--workspace SIZE] [--staging SIZE] [--fixed-sizing]\n"
            "              [--hold SECONDS] [--device N]\n"
            "KV cache sizing: --num-blocks verbatim, else --kv-cache-memory / bytes per block,\n"
            "else %d blocks. SIZE: bytes or 512MiB, 1GiB, 1.5GiB, 2GB (10^9).\n"
            "--fixed-sizing divides by the bytes of a block in every layer (the fix).\n",
            FALLBACK_NUM_BLOCKS);
}

static int parse_args(int argc, char **argv, struct config *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        const char *eq = strchr(a, '=');
        char key[64];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--fixed-sizing")) {
            c->fixed_sizing = 1;
            continue;
        }
        if (eq && (size_t)(eq - a) < sizeof key) {
            memcpy(key, a, (size_t)(eq - a));
            key[eq - a] = 0;
            v = eq + 1;
            a = key;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            fprintf(stderr, "kvpool: %s needs a value\n", a);
            return -1;
        }
        char *end;
        if (!strcmp(a, "--num-blocks")) {
            c->num_blocks = strtoll(v, &end, 10);
            if (*end || c->num_blocks < 1)
                goto bad;
        } else if (!strcmp(a, "--kv-cache-memory")) {
            if (!(c->kv_cache_memory = parse_size(v)))
                goto bad;
        } else if (!strcmp(a, "--model-bytes")) {
            if (!(c->model_bytes = parse_size(v)))
                goto bad;
        } else if (!strcmp(a, "--workspace")) {
            if (!(c->workspace_bytes = parse_size(v)))
                goto bad;
        } else if (!strcmp(a, "--staging")) {
            if (!(c->staging_bytes = parse_size(v)))
                goto bad;
        } else if (!strcmp(a, "--layers")) {
            c->layers = (int)strtol(v, &end, 10);
            if (*end || c->layers < 1 || c->layers > 4096)
                goto bad;
        } else if (!strcmp(a, "--device")) {
            c->device = (int)strtol(v, &end, 10);
            if (*end || c->device < 0)
                goto bad;
        } else if (!strcmp(a, "--hold")) {
            c->hold_seconds = strtod(v, &end);
            if (*end || c->hold_seconds < 0)
                goto bad;
        } else {
            fprintf(stderr, "kvpool: unknown option %s\n", argv[i - (eq ? 0 : 1)]);
            usage(stderr);
            return -1;
        }
        continue;
    bad:
        fprintf(stderr, "kvpool: bad value for %s: %s\n", a, v);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct config c = {
        .layers = 28, .kv_heads = 8, .head_size = 128, .block_size = 16, .dtype_bytes = 2,
        .num_blocks = -1, .kv_cache_memory = 0,
        .model_bytes = 1400000000ULL,                /* ~1.4 GB of weights, as in the report */
        .workspace_bytes = 256ULL << 20,
        .staging_bytes = 32ULL << 20,
        .fixed_sizing = 0, .hold_seconds = 0, .device = 0,
    };
    char b1[32], b2[32], b3[32];

    setvbuf(stdout, NULL, _IOLBF, 0);
    clock_gettime(CLOCK_MONOTONIC, &T0);
    if (parse_args(argc, argv, &c) != 0)
        return 2;

    unsigned long long page = page_bytes(&c);
    printf("kvpool: model: %d layers, %d kv heads x head size %d, block %d tokens, %d-byte dtype"
           " -> %s per block per layer\n", c.layers, c.kv_heads, c.head_size, c.block_size,
           c.dtype_bytes, fmt_bytes(page, b1, sizeof b1));

    int rc = 1;
    if (init_driver(&c) != 0)
        goto out;
    if (load_weights(&c) != 0)
        goto out;

    /* profiling batches: the workspace grows to what the largest needs */
    for (unsigned long long w = c.workspace_bytes / 4; ; w *= 2) {
        if (w > c.workspace_bytes || w == 0)
            w = c.workspace_bytes;
        if (reserve_workspace(w) != 0)
            goto out;
        if (w == c.workspace_bytes)
            break;
    }
    printf("kvpool: workspace: %s (reserve_workspace, stream-ordered)\n",
           fmt_bytes(S.workspace_bytes, b1, sizeof b1));

    const char *how = "";
    long long num_blocks = compute_num_blocks(&c, &how);
    if (num_blocks < 1) {
        fprintf(stderr, "kvpool: error: compute_num_blocks: %lld blocks (from %s): "
                "--kv-cache-memory is smaller than one block\n", num_blocks, how);
        goto out;
    }
    unsigned long long per_layer = (unsigned long long)num_blocks * page;
    unsigned long long pool = per_layer * (unsigned long long)c.layers;
    if (!strcmp(how, "--kv-cache-memory"))
        printf("kvpool: kv cache: num_blocks = %lld (--kv-cache-memory %s / %s per block%s)\n",
               num_blocks, fmt_bytes(c.kv_cache_memory, b1, sizeof b1),
               fmt_bytes(page * (c.fixed_sizing ? (unsigned long long)c.layers : 1ULL), b2,
                         sizeof b2),
               c.fixed_sizing ? ", all layers" : "");
    else
        printf("kvpool: kv cache: num_blocks = %lld (%s)\n", num_blocks, how);
    printf("kvpool: kv cache: pool = %d layers x %lld blocks x %s = %s (%llu bytes; %s per layer)\n",
           c.layers, num_blocks, fmt_bytes(page, b1, sizeof b1), fmt_bytes(pool, b2, sizeof b2),
           pool, fmt_bytes(per_layer, b3, sizeof b3));
    if (allocate_kv_cache(&c, num_blocks) != 0)
        goto out;
    if (allocate_staging(&c) != 0)
        goto out;

    printf("ready (%.3f s)\n", elapsed());
    if (c.hold_seconds > 0) {
        struct timespec ts = {(time_t)c.hold_seconds,
                              (long)((c.hold_seconds - (double)(time_t)c.hold_seconds) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    rc = 0;
out:
    shutdown_all();
    if (rc == 0)
        printf("kvpool: shut down cleanly\n");
    else
        fprintf(stderr, "kvpool: not ready: exiting with status %d\n", rc);
    return rc;
}
