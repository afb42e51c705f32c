/* hold.c - allocate and keep device memory, for kill/leak/concurrency tests.
 *
 * usage: hold [--exit-after-ms M] [--free] [--managed] N SIZE     (SIZE may end in k, m or g)
 * Allocates N buffers of SIZE with cuMemAlloc_v2 (hold_alloc; --managed: cuMemAllocManaged),
 * printing one "alloc cuMemAlloc_v2 SIZE PTR RESULT" line each, then prints "ready" and flushes.
 * Then it sleeps until killed; with --exit-after-ms M it instead exits 0 after M milliseconds,
 * leaving the buffers allocated (a leak at exit) unless --free is given, which frees them first
 * ("free cuMemFree_v2 SIZE PTR RESULT" lines). A failed allocation is printed and counted; the
 * program still prints "ready" (with "# failed K" before it) and exits 1 at the end.
 * SIGTERM/SIGINT end the sleep like the timer does (exit status 0, or 1 after failures).
 */
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "cudasim_api.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int s)
{
    (void)s;
    g_stop = 1;
}

NOINLINE CUresult hold_alloc(CUdeviceptr *p, unsigned long long size, int managed)
{
    if (managed)
        return cuMemAllocManaged(p, size, CU_MEM_ATTACH_GLOBAL);
    return cuMemAlloc_v2(p, size);
}

NOINLINE CUresult hold_free(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    long exit_after_ms = -1;
    int do_free = 0, managed = 0, i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
        if (!strcmp(argv[i], "--exit-after-ms") && i + 1 < argc)
            exit_after_ms = atol(argv[++i]);
        else if (!strcmp(argv[i], "--free"))
            do_free = 1;
        else if (!strcmp(argv[i], "--managed"))
            managed = 1;
        else
            break;
    }
    if (argc - i != 2) {
        fprintf(stderr, "usage: hold [--exit-after-ms M] [--free] [--managed] N SIZE\n");
        return 2;
    }
    int n = atoi(argv[i]);
    unsigned long long size = parse_size(argv[i + 1]);
    CUresult r = cuInit(0);
    if (r) {
        printf("# cuInit %d\n", r);
        return 1;
    }
    CUdeviceptr *p = calloc((size_t)(n > 0 ? n : 1), sizeof(*p));
    for (int k = 0; k < n; k++) {
        r = hold_alloc(&p[k], size, managed);
        op_line("alloc", managed ? "cuMemAllocManaged" : "cuMemAlloc_v2", size, p[k], r);
    }
    if (g_failures)
        printf("# failed %d\n", g_failures);
    /* blocked until the wait: a signal that comes between the test of g_stop and the wait
     * is held and ends sigsuspend, never lost (pause() there would sleep for ever) */
    sigset_t stops, before;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    sigprocmask(SIG_BLOCK, &stops, &before);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    printf("ready\n");
    fflush(stdout);
    if (exit_after_ms >= 0) {
        sigprocmask(SIG_SETMASK, &before, NULL); /* a pending stop runs its handler here */
        struct timespec ts = {exit_after_ms / 1000, (exit_after_ms % 1000) * 1000000L};
        while (!g_stop && nanosleep(&ts, &ts) < 0 && !g_stop)
            ;
    } else {
        while (!g_stop)
            sigsuspend(&before);
        sigprocmask(SIG_SETMASK, &before, NULL);
    }
    if (do_free)
        for (int k = 0; k < n; k++)
            if (p[k])
                op_line("free", "cuMemFree_v2", size, p[k], hold_free(p[k]));
    return g_failures ? 1 : 0;
}
