// peaks.cu - shapes whose peak a replay used to overstate (tools/gpu/peaks_check.sh).
//   peaks leak SIZE_MIB         allocate SIZE MiB with cudaMalloc, exit without freeing
//   peaks threads N PAIRS MIB   N threads each cudaMalloc+cudaFree MIB MiB PAIRS times,
//                               holding up to 4 buffers (as tests/progs/budget_hammer)
//   peaks hold SIZE_MIB         allocate SIZE MiB, print "ready", wait to be killed
// Prints "done ok N oom M".
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_pairs;
static size_t g_size;
static long g_ok, g_oom;

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *held[4];
    int n = 0;
    for (int i = 0; i < g_pairs; i++) {
        int alloc = n == 0 || (n < 4 && (rand_r(&seed) & 1));
        if (alloc) {
            void *p = NULL;
            if (cudaMalloc(&p, g_size) == cudaSuccess) {
                held[n++] = p;
                __atomic_add_fetch(&g_ok, 1, __ATOMIC_RELAXED);
            } else {
                cudaGetLastError();
                __atomic_add_fetch(&g_oom, 1, __ATOMIC_RELAXED);
            }
        } else {
            cudaFree(held[--n]);
        }
    }
    while (n)
        cudaFree(held[--n]);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "leak")) {
        void *p = NULL;
        cudaError_t r = cudaMalloc(&p, (size_t)atol(argv[2]) << 20);
        printf("done ok %d oom %d\n", r == cudaSuccess, r != cudaSuccess);
        return r == cudaSuccess ? 0 : 1;
    }
    if (argc >= 3 && !strcmp(argv[1], "hold")) {
        void *p = NULL;
        if (cudaMalloc(&p, (size_t)atol(argv[2]) << 20) != cudaSuccess)
            return 1;
        printf("ready\n");
        fflush(stdout);
        for (;;)
            pause();
    }
    if (argc == 5 && !strcmp(argv[1], "threads")) {
        int n = atoi(argv[2]);
        g_pairs = atoi(argv[3]);
        g_size = (size_t)atol(argv[4]) << 20;
        cudaFree(0); /* the context first */
        pthread_t t[256];
        for (int i = 0; i < n && i < 256; i++)
            pthread_create(&t[i], NULL, worker, (void *)(size_t)(i + 1));
        for (int i = 0; i < n && i < 256; i++)
            pthread_join(t[i], NULL);
        printf("done ok %ld oom %ld\n", g_ok, g_oom);
        return 0;
    }
    fprintf(stderr, "usage: peaks leak MIB | threads N PAIRS MIB | hold MIB\n");
    return 2;
}
