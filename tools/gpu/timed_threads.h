/* timed_threads.h - T threads at once, each on its own non-blocking stream of device 0 (C++;
 * bench_alloc.cu's async_threads and contention_probe.cu). Each thread runs loop(stream, warm)
 * untimed, then all start loop(stream, n) together; returns the wall time from that start to
 * the last thread's end, in ns. */
#ifndef TIMED_THREADS_H
#define TIMED_THREADS_H
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <atomic>
#include <thread>
#include <vector>

static inline uint64_t tt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void tt_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "timed_threads: %s failed: %s\n", what, cudaGetErrorName(e));
        exit(2);
    }
}

template <class Loop> uint64_t timed_threads(int nthreads, long warm, long n, Loop loop)
{
    std::atomic<int> ready(0), go(0);
    std::atomic<uint64_t> t_end(0);
    std::vector<std::thread> ts;
    for (int i = 0; i < nthreads; i++)
        ts.emplace_back([&] {
            tt_check(cudaSetDevice(0), "cudaSetDevice");
            cudaStream_t s;
            tt_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
            loop(s, warm);
            ready++;
            while (!go.load())
                ;
            loop(s, n);
            uint64_t t = tt_now_ns(), prev = t_end.load();
            while (t > prev && !t_end.compare_exchange_weak(prev, t))
                ;
            tt_check(cudaStreamDestroy(s), "cudaStreamDestroy");
        });
    while (ready.load() < nthreads)
        ;
    uint64_t t0 = tt_now_ns();
    go = 1;
    for (auto &t : ts)
        t.join();
    return t_end.load() - t0;
}
#endif
