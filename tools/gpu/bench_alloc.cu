/* bench_alloc.cu - the inner loops of the overhead benchmark (tools/bench_overhead.py).
 *
 *   bench_alloc alloc SIZE N     N cudaMalloc/cudaFree pairs of SIZE bytes (cuMemAlloc_v2/cuMemFree_v2)
 *   bench_alloc async SIZE N     N cudaMallocAsync/cudaFreeAsync pairs on a stream, from the
 *                                device's default pool with its release threshold at the maximum
 *                                (the pool never gives memory back, so a pair never reaches the OS)
 *   bench_alloc async_threads SIZE T N
 *                                the same on T threads at once, each on its own stream, N pairs
 *                                each: ns_per_op is the wall time of the timed loops over N (a
 *                                pair's time on one thread while T run); the shared pool and the
 *                                shim's shared counters are what T adds
 *   bench_alloc meminfo N        N cudaMemGetInfo calls
 *   bench_alloc startup          cudaFree(0) and exit (process start-up cost is timed outside)
 *
 * The loops run after a warm-up, timed inside the program with clock_gettime(CLOCK_MONOTONIC):
 *   ns_per_op X      nanoseconds per pair (alloc, async) or per call (meminfo)
 * Static runtime (nvcc's default), like most CUDA binaries.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "gpu_common.h"
#include "timed_threads.h"

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t err_ = (call);                                                          \
        if (err_ != cudaSuccess) {                                                          \
            fprintf(stderr, "bench_alloc: %s failed at line %d: %s\n", #call, __LINE__,       \
                    cudaGetErrorName(err_));                                                \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

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
        default: fprintf(stderr, "bench_alloc: bad size %s\n", s); exit(2);
        }
    }
    return (unsigned long long)(v * (double)mul);
}

extern "C" NOINLINE void bench_alloc_pairs(size_t size, long n)
{
    for (long i = 0; i < n; i++) {
        void *p;
        CK(cudaMalloc(&p, size));
        CK(cudaFree(p));
    }
}

/* the device's default pool never gives memory back: a pair never reaches the OS */
static void keep_pool_memory(void)
{
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
}

/* the untimed pairs before an async loop of n */
static long async_warmup(long n) { return n / 10 > 1000 ? 1000 : (n / 10 > 0 ? n / 10 : 1); }

extern "C" NOINLINE void bench_async_pairs(size_t size, long n, cudaStream_t s)
{
    for (long i = 0; i < n; i++) {
        void *p;
        CK(cudaMallocAsync(&p, size, s));
        CK(cudaFreeAsync(p, s));
    }
    CK(cudaStreamSynchronize(s));
}

/* T threads, each on its own stream, start their timed loops together; the wall time from the
 * start to the last thread's end (timed_threads.h) */
static uint64_t async_threads(size_t size, int nthreads, long n)
{
    return timed_threads(nthreads, async_warmup(n), n,
                         [&](cudaStream_t s, long k) { bench_async_pairs(size, k, s); });
}

extern "C" NOINLINE void bench_meminfo(long n)
{
    for (long i = 0; i < n; i++) {
        size_t f, t;
        CK(cudaMemGetInfo(&f, &t));
    }
}

static void report(const char *mode, unsigned long long size, long n, uint64_t ns)
{
    printf("mode %s\nsize %llu\nops %ld\ntotal_ns %llu\nns_per_op %.3f\n", mode, size, n,
           (unsigned long long)ns, n ? (double)ns / (double)n : 0.0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_alloc alloc SIZE N | async SIZE N | async_threads SIZE T N | "
                        "meminfo N | startup\n");
        return 2;
    }
    gc_line_buffered();
    const char *mode = argv[1];
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    if (!strcmp(mode, "startup")) {
        printf("mode startup\n");
        return 0;
    }
    if (!strcmp(mode, "alloc") && argc == 4) {
        size_t size = parse_size(argv[2]);
        long n = atol(argv[3]);
        bench_alloc_pairs(size, n / 10 > 20 ? 20 : (n / 10 > 0 ? n / 10 : 1));
        uint64_t t0 = tt_now_ns();
        bench_alloc_pairs(size, n);
        uint64_t t1 = tt_now_ns();
        report(mode, size, n, t1 - t0);
        return 0;
    }
    if (!strcmp(mode, "async") && argc == 4) {
        size_t size = parse_size(argv[2]);
        long n = atol(argv[3]);
        keep_pool_memory();
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        bench_async_pairs(size, async_warmup(n), s);
        uint64_t t0 = tt_now_ns();
        bench_async_pairs(size, n, s);
        uint64_t t1 = tt_now_ns();
        report(mode, size, n, t1 - t0);
        CK(cudaStreamDestroy(s));
        return 0;
    }
    if (!strcmp(mode, "async_threads") && argc == 5) {
        size_t size = parse_size(argv[2]);
        int nthreads = atoi(argv[3]);
        long n = atol(argv[4]);
        keep_pool_memory();
        if (nthreads < 1)
            nthreads = 1;
        report(mode, size, n, async_threads(size, nthreads, n));
        return 0;
    }
    if (!strcmp(mode, "meminfo") && argc == 3) {
        long n = atol(argv[2]);
        bench_meminfo(n / 10 > 100 ? 100 : (n / 10 > 0 ? n / 10 : 1));
        uint64_t t0 = tt_now_ns();
        bench_meminfo(n);
        uint64_t t1 = tt_now_ns();
        report(mode, 0, n, t1 - t0);
        return 0;
    }
    fprintf(stderr, "bench_alloc: bad arguments\n");
    return 2;
}
