/* aggregate_loop.cu - a service's steady state for `cudatrace run --aggregate` (issue 13): a
 * KV pool kept for the whole run, then stream-ordered allocations every step until SECONDS
 * have passed, with a spike (a new peak) every PERIOD seconds.
 *
 *   aggregate_loop SECONDS [PERIOD]      (defaults 600 and 60)
 *
 * Each step: three cudaMallocAsync of 1, 3 and 7 MiB on a stream (the device's default pool, its
 * release threshold at the maximum: the pool keeps its memory), cudaFreeAsync of them. Every
 * PERIOD seconds one step also allocates a spike of (64 MiB x the period's number), so the peak
 * grows through the run and the snapshots have new peaks to record. Prints one line a second:
 *     t SECONDS steps N
 * and at the end:
 *     done steps N peak BYTES kv BYTES     (BYTES: what cudatrace's report must show)
 * Static runtime (nvcc's default).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            fprintf(stderr, "aggregate_loop: %s failed at line %d: %s\n", #call, __LINE__,     \
                    cudaGetErrorName(err_));                                                  \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

#define KV_LAYERS 28
#define KV_BYTES (16ull << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void *kv_layer(void)
{
    void *p = NULL;
    CK(cudaMalloc(&p, KV_BYTES));
    return p;
}

__attribute__((noinline)) void step(cudaStream_t s, size_t spike)
{
    void *a = NULL, *b = NULL, *c = NULL, *x = NULL;
    CK(cudaMallocAsync(&a, 1 << 20, s));
    CK(cudaMallocAsync(&b, 3 << 20, s));
    CK(cudaMallocAsync(&c, 7 << 20, s));
    if (spike)
        CK(cudaMallocAsync(&x, spike, s));
    if (x)
        CK(cudaFreeAsync(x, s));
    CK(cudaFreeAsync(c, s));
    CK(cudaFreeAsync(b, s));
    CK(cudaFreeAsync(a, s));
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 600, period = argc > 2 ? atof(argv[2]) : 60;
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    for (int l = 0; l < KV_LAYERS; l++)
        kv_layer();
    double t0 = now_s(), next_print = 1, next_spike = period;
    unsigned long long steps = 0, spikes = 0, biggest = 0;
    for (;;) {
        double t = now_s() - t0;
        if (t >= seconds)
            break;
        size_t spike = 0;
        if (t >= next_spike) {
            spike = (size_t)(++spikes) * (64ull << 20);
            biggest = spike;
            next_spike += period;
        }
        step(s, spike);
        steps++;
        if ((steps & 1023) == 0)
            CK(cudaStreamSynchronize(s));
        if (t >= next_print) {
            printf("t %.0f steps %llu\n", t, steps);
            fflush(stdout);
            next_print += 1;
        }
    }
    CK(cudaStreamSynchronize(s));
    printf("done steps %llu peak %llu kv %llu\n", steps,
           KV_LAYERS * KV_BYTES + (11ull << 20) + biggest, KV_LAYERS * KV_BYTES);
    return 0;
}
