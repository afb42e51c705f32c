/* churn.c - a long-running service's allocation pattern: a KV pool allocated once and kept, then
 * a loop of short-lived allocations from the same few sites, with one spike in the middle.
 *
 * usage: churn ITERS LAYERS KVBYTES [HOLD [SPAWN]]     (sizes may end in k, m or g)
 *   kv_layer()   LAYERS x cuMemAlloc_v2(KVBYTES), kept to the end (never freed)
 *   loop_async() cuMemAllocAsync(256 KiB) + cuMemFreeAsync      } each of ITERS iterations:
 *   loop_plain() cuMemAlloc_v2(64 KiB) + cuMemFree_v2           } 4 events
 *   spike()      cuMemAlloc_v2(8 MiB) once, at iteration ITERS/2, freed at once
 *   worker()     with SPAWN: after the loop, SPAWN threads one after another (each joined
 *                before the next starts), each 3 loop_plain pairs: 6 events a thread
 * The peak is KV + 256 KiB + 64 KiB + 8 MiB, reached by the spike. Prints
 *     peak BYTES kv BYTES events N
 * after the loop; with HOLD (seconds) it then prints "holding" and sleeps before exiting (a
 * test kills it there), and after the spike it prints "spiked" either way.
 */
#include <pthread.h>
#include <unistd.h>

#include "cudasim_api.h"

#define ASYNC_BYTES (256ull << 10)
#define PLAIN_BYTES (64ull << 10)
#define SPIKE_BYTES (8ull << 20)

static unsigned long long parse(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'k' || *end == 'K')
        v <<= 10;
    else if (*end == 'm' || *end == 'M')
        v <<= 20;
    else if (*end == 'g' || *end == 'G')
        v <<= 30;
    return v;
}

NOINLINE CUresult kv_layer(CUdeviceptr *p, unsigned long long n) { return cuMemAlloc_v2(p, n); }
NOINLINE CUresult loop_async(CUdeviceptr *p, CUstream s)
{
    return cuMemAllocAsync(p, ASYNC_BYTES, s);
}
NOINLINE CUresult loop_async_free(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
NOINLINE CUresult loop_plain(CUdeviceptr *p) { return cuMemAlloc_v2(p, PLAIN_BYTES); }
NOINLINE CUresult loop_plain_free(CUdeviceptr p) { return cuMemFree_v2(p); }
NOINLINE CUresult spike(void)
{
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc_v2(&p, SPIKE_BYTES);
    return r ? r : cuMemFree_v2(p);
}

static CUcontext g_ctx;

static void *worker(void *arg)
{
    CUresult *r = arg;
    *r = cuCtxSetCurrent(g_ctx);
    for (int i = 0; i < 3 && !*r; i++) {
        CUdeviceptr p = 0;
        *r = loop_plain(&p);
        if (!*r)
            *r = loop_plain_free(p);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: churn ITERS LAYERS KVBYTES [HOLD]\n");
        return 2;
    }
    long iters = atol(argv[1]);
    int layers = atoi(argv[2]);
    unsigned long long kv = parse(argv[3]);
    int hold = argc > 4 ? atoi(argv[4]) : 0;
    int spawn = argc > 5 ? atoi(argv[5]) : 0;
    CUresult r = cuInit(0);
    CUdevice dev;
    CUcontext ctx;
    if (!r)
        r = cuDeviceGet(&dev, 0);
    if (!r)
        r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!r)
        r = cuCtxSetCurrent(ctx);
    for (int l = 0; l < layers && !r; l++) {
        CUdeviceptr p;
        r = kv_layer(&p, kv);
    }
    long events = layers;
    for (long i = 0; i < iters && !r; i++) {
        CUdeviceptr a = 0, b = 0;
        r = loop_async(&a, (CUstream)0);
        if (!r)
            r = loop_plain(&b);
        if (!r && i == iters / 2) {
            r = spike();
            events += 2;
            printf("spiked\n");
            fflush(stdout);
        }
        if (!r)
            r = loop_async_free(a, (CUstream)0);
        if (!r)
            r = loop_plain_free(b);
        events += 4;
    }
    g_ctx = ctx;
    for (int i = 0; i < spawn && !r; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, &r) != 0) {
            fprintf(stderr, "churn: pthread_create failed\n");
            return 1;
        }
        pthread_join(t, NULL);
        events += 6;
    }
    if (r) {
        fprintf(stderr, "churn: CUresult %d\n", (int)r);
        return 1;
    }
    printf("peak %llu kv %llu events %ld\n",
           (unsigned long long)layers * kv + ASYNC_BYTES + PLAIN_BYTES + SPIKE_BYTES,
           (unsigned long long)layers * kv, events);
    fflush(stdout);
    if (hold > 0) {
        printf("holding\n");
        fflush(stdout);
        sleep((unsigned)hold);
    }
    return 0;
}
