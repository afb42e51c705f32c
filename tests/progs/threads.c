/* threads.c - many threads allocating and freeing at once through the linked cuMemAlloc_v2.
 *
 * usage: threads NTHREADS PAIRS SIZE       (SIZE may end in k, m or g)
 * Each thread does PAIRS cuMemAlloc_v2 + cuMemFree_v2 pairs of SIZE bytes (thread_alloc,
 * thread_free), all threads starting together. Prints one line at the end:
 *     done allocs N frees N          (successful calls, summed over threads)
 * plus "# failed K first R" when K calls failed (R: the first failing CUresult). Exit 0 when all
 * succeeded, else 1.
 */
#include <pthread.h>

#include "cudasim_api.h"

static int g_pairs;
static unsigned long long g_size;
static pthread_barrier_t g_barrier;
static long g_allocs, g_frees, g_failed;
static int g_first_error;

NOINLINE CUresult thread_alloc(CUdeviceptr *p)
{
    return cuMemAlloc_v2(p, g_size);
}

NOINLINE CUresult thread_free(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}

static void failed(CUresult r)
{
    __atomic_fetch_add(&g_failed, 1, __ATOMIC_RELAXED);
    int zero = 0;
    __atomic_compare_exchange_n(&g_first_error, &zero, r, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static void *worker(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&g_barrier);
    long a = 0, f = 0;
    for (int i = 0; i < g_pairs; i++) {
        CUdeviceptr p = 0;
        CUresult r = thread_alloc(&p);
        if (r) {
            failed(r);
            continue;
        }
        a++;
        r = thread_free(p);
        if (r)
            failed(r);
        else
            f++;
    }
    __atomic_fetch_add(&g_allocs, a, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_frees, f, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4) {
        fprintf(stderr, "usage: threads NTHREADS PAIRS SIZE\n");
        return 2;
    }
    int n = atoi(argv[1]);
    g_pairs = atoi(argv[2]);
    g_size = parse_size(argv[3]);
    if (n < 1 || g_pairs < 0) {
        fprintf(stderr, "threads: bad arguments\n");
        return 2;
    }
    CUresult r = cuInit(0);
    if (r) {
        printf("# cuInit %d\n", r);
        return 1;
    }
    pthread_barrier_init(&g_barrier, NULL, (unsigned)n);
    pthread_t *t = calloc((size_t)n, sizeof(*t));
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf("done allocs %ld frees %ld\n", g_allocs, g_frees);
    if (g_failed)
        printf("# failed %ld first %d\n", g_failed, g_first_error);
    free(t);
    return g_failed ? 1 : 0;
}
