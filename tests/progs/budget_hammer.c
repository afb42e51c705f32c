/* budget_hammer.c - threads allocating and freeing in a random pattern against a limit (a
 * cudatrace budget, or the simulated device's total), counting OUT_OF_MEMORY answers.
 *
 * usage: budget_hammer THREADS ITERS SIZE      (SIZE may end in k, m or g)
 * Each thread runs ITERS steps; a step allocates SIZE with the linked cuMemAlloc_v2 (hammer_alloc)
 * when it holds nothing, frees one held buffer (hammer_free) when it holds HOLD_MAX (4), and
 * otherwise picks at random (rand_r, seeded by the thread index: the same pattern every run).
 * At the end every thread frees what it holds. Prints:
 *     ok N oom M                     successful allocations, OUT_OF_MEMORY results
 * and "# errors E first R" when other results (a failed free included) occurred; under
 * cudatrace's shim also "live peak P live L": the shim's live counters (live_format.h, every
 * device together) at the end. Exit 0 when E is 0, else 1.
 */
#include <dlfcn.h>
#include <pthread.h>

#include "cudasim_api.h"
#include "live_format.h"

#define HOLD_MAX 4

static int g_iters;
static unsigned long long g_size;
static pthread_barrier_t g_barrier;
static long g_ok, g_oom, g_errors;
static int g_first_error;

NOINLINE CUresult hammer_alloc(CUdeviceptr *p)
{
    return cuMemAlloc_v2(p, g_size);
}

NOINLINE CUresult hammer_free(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}

static void error(CUresult r)
{
    __atomic_fetch_add(&g_errors, 1, __ATOMIC_RELAXED);
    int zero = 0;
    __atomic_compare_exchange_n(&g_first_error, &zero, r, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    CUdeviceptr held[HOLD_MAX];
    int n = 0;
    long ok = 0, oom = 0;
    pthread_barrier_wait(&g_barrier);
    for (int i = 0; i < g_iters; i++) {
        int do_alloc = n == 0 || (n < HOLD_MAX && rand_r(&seed) % 2 == 0);
        if (do_alloc) {
            CUdeviceptr p = 0;
            CUresult r = hammer_alloc(&p);
            if (r == 0)
                held[n++] = p, ok++;
            else if (r == CUDA_ERROR_OUT_OF_MEMORY)
                oom++;
            else
                error(r);
        } else {
            int k = rand_r(&seed) % n;
            CUresult r = hammer_free(held[k]);
            if (r)
                error(r);
            held[k] = held[--n];
        }
    }
    while (n > 0) {
        CUresult r = hammer_free(held[--n]);
        if (r)
            error(r);
    }
    __atomic_fetch_add(&g_ok, ok, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_oom, oom, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4) {
        fprintf(stderr, "usage: budget_hammer THREADS ITERS SIZE\n");
        return 2;
    }
    int nt = atoi(argv[1]);
    g_iters = atoi(argv[2]);
    g_size = parse_size(argv[3]);
    if (nt < 1 || g_iters < 0) {
        fprintf(stderr, "budget_hammer: bad arguments\n");
        return 2;
    }
    CUresult r = cuInit(0);
    if (r) {
        printf("# cuInit %d\n", r);
        return 1;
    }
    pthread_barrier_init(&g_barrier, NULL, (unsigned)nt);
    pthread_t *t = calloc((size_t)nt, sizeof(*t));
    for (int i = 0; i < nt; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (int i = 0; i < nt; i++)
        pthread_join(t[i], NULL);
    printf("ok %ld oom %ld\n", g_ok, g_oom);
    if (g_errors)
        printf("# errors %ld first %d\n", g_errors, g_first_error);
    const struct ct_live_stats *(*live)(void) =
        (const struct ct_live_stats *(*)(void))dlsym(RTLD_DEFAULT, "cudatrace_live");
    if (live && live()->active)
        printf("live peak %llu live %llu\n", (unsigned long long)live()->dev[CT_LIVE_ALL].peak,
               (unsigned long long)live()->dev[CT_LIVE_ALL].live);
    free(t);
    return g_errors ? 1 : 0;
}
