/* contention_probe.cu - does a driver query beside each stream-ordered allocation slow the
 * allocations of other threads? (no shim needed; tools/gpu/contention.sh runs it)
 *
 *   contention_probe QUERY SIZE T N
 *
 * T threads at once, each on its own non-blocking stream, N cudaMallocAsync/cudaFreeAsync pairs
 * of SIZE bytes each from device 0's default pool (its release threshold at the maximum, so no
 * pair reaches the OS), after a warm-up. Before each allocation every thread makes QUERY:
 *
 *   none      nothing (the bare loop)
 *   ctx       cuCtxGetCurrent         (what the shim asks for an allocation on a NULL stream)
 *   sctx      cuStreamGetCtx          (what it asks for one on a created stream)
 *   sctx_dev  cuStreamGetCtx, then cuCtxGetDevice_v2 of that context (the shim's cache missed)
 *   spin      CONTENTION_SPIN_NS (default 200) ns of the thread's own work, no driver call (a
 *             shim's cost without a lock; or, under the shim, a program that works between its
 *             allocations)
 *
 * Prints `ns_per_op X`: the wall time of the timed loops (all threads started together, to the
 * last one's end) over N, i.e. one thread's pair while T run. If a query contends with the
 * pool's own calls, ctx/sctx cost much more than spin under T > 1; if not, about the same.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "gpu_common.h"
#include "timed_threads.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "contention_probe: %s failed at line %d: %s\n", #call, __LINE__,       \
                    cudaGetErrorName(err_));                                                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#define CKD(call)                                                                                  \
    do {                                                                                           \
        CUresult err_ = (call);                                                                    \
        if (err_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "contention_probe: %s failed at line %d: %d\n", #call, __LINE__,       \
                    (int)err_);                                                                    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

enum query { Q_NONE, Q_CTX, Q_SCTX, Q_SCTX_DEV, Q_SPIN };

static volatile uint64_t spin_sink;
static uint64_t spin_ns = 200;
static void spin(void)
{
    uint64_t t0 = tt_now_ns(), x = 0;
    while (tt_now_ns() - t0 < spin_ns)
        x++;
    spin_sink += x;
}

static CUresult (*get_dev2)(CUdevice *, CUcontext);

static void ask(enum query q, cudaStream_t s)
{
    CUcontext ctx;
    CUdevice d;
    switch (q) {
    case Q_NONE:
        return;
    case Q_CTX:
        CKD(cuCtxGetCurrent(&ctx));
        return;
    case Q_SCTX:
        CKD(cuStreamGetCtx((CUstream)s, &ctx));
        return;
    case Q_SCTX_DEV:
        CKD(cuStreamGetCtx((CUstream)s, &ctx));
        if (get_dev2)
            CKD(get_dev2(&d, ctx));
        return;
    case Q_SPIN:
        spin();
        return;
    }
}

static void pairs(enum query q, size_t size, long n, cudaStream_t s)
{
    for (long i = 0; i < n; i++) {
        void *p;
        ask(q, s);
        CK(cudaMallocAsync(&p, size, s));
        CK(cudaFreeAsync(p, s));
    }
    CK(cudaStreamSynchronize(s));
}

static uint64_t run(enum query q, size_t size, int nthreads, long n)
{
    long warm = n / 10 > 1000 ? 1000 : (n / 10 > 0 ? n / 10 : 1);
    return timed_threads(nthreads, warm, n, [&](cudaStream_t s, long k) { pairs(q, size, k, s); });
}

int main(int argc, char **argv)
{
    static const char *names[] = {"none", "ctx", "sctx", "sctx_dev", "spin"};
    if (argc != 5) {
        fprintf(stderr, "usage: contention_probe none|ctx|sctx|sctx_dev|spin SIZE T N\n");
        return 2;
    }
    int q = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(argv[1], names[i]))
            q = i;
    size_t size = strtoull(argv[2], NULL, 0);
    int nthreads = atoi(argv[3]);
    long n = atol(argv[4]);
    if (q < 0 || !size || nthreads < 1 || n < 1) {
        fprintf(stderr, "contention_probe: bad arguments\n");
        return 2;
    }
    const char *sn = getenv("CONTENTION_SPIN_NS");
    if (sn && *sn)
        spin_ns = strtoull(sn, NULL, 10);
    gc_line_buffered();
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    get_dev2 = (CUresult(*)(CUdevice *, CUcontext))dlsym(RTLD_DEFAULT, "cuCtxGetDevice_v2");
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    uint64_t ns = run((enum query)q, size, nthreads, n);
    printf("query %s\nspin_ns %llu\nthreads %d\nops %ld\nns_per_op %.3f\n", names[q],
           (unsigned long long)spin_ns, nthreads, n, (double)ns / (double)n);
    return 0;
}
