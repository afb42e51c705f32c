/* leakers.c - processes that end holding device memory (a leak at exit), one after another:
 * what the device holds at any moment is one process's memory, never the sum.
 *
 * usage: leakers fork N SIZE     the top process calls cuInit only, then forks N children one
 *                                after another (waiting for each); each child allocates SIZE
 *                                (leaker_alloc) and exits with exit(0) without freeing it
 *        leakers exec N SIZE     allocates SIZE, then (N > 0) execs itself with N-1: N+1 images
 *                                of one process, each holding SIZE when exec replaces it
 *        (SIZE may end in k, m or g)
 * Prints one op line per allocation; exits 0 when every allocation succeeded, else 1 (a child's
 * failure is its exit status, which the top passes on).
 */
#include <sys/wait.h>
#include <unistd.h>

#include "cudasim_api.h"

NOINLINE CUresult leaker_alloc(CUdeviceptr *p, unsigned long long size)
{
    return cuMemAlloc_v2(p, size);
}

static int allocate(unsigned long long size)
{
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuInit(0);
    if (!r)
        r = cuDeviceGet(&dev, 0);
    if (!r)
        r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!r)
        r = cuCtxSetCurrent(ctx);
    CUdeviceptr p = 0;
    if (!r)
        r = leaker_alloc(&p, size);
    op_line("alloc", "cuMemAlloc_v2", size, p, r);
    return r ? 1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4 || (strcmp(argv[1], "fork") && strcmp(argv[1], "exec"))) {
        fprintf(stderr, "usage: leakers fork|exec N SIZE\n");
        return 2;
    }
    int n = atoi(argv[2]);
    unsigned long long size = parse_size(argv[3]);
    if (!strcmp(argv[1], "exec")) {
        if (allocate(size))
            return 1;
        if (n > 0) {
            char left[16];
            snprintf(left, sizeof left, "%d", n - 1);
            fflush(stdout);
            execl("/proc/self/exe", argv[0], "exec", left, argv[3], (char *)NULL);
            perror("leakers: exec");
            return 1;
        }
        return 0;
    }
    cuInit(0);
    int status = 0;
    for (int k = 0; k < n; k++) {
        fflush(stdout);
        pid_t c = fork();
        if (c == 0)
            exit(allocate(size));
        int st = 0;
        while (c > 0 && waitpid(c, &st, 0) < 0)
            ;
        if (c < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            status = 1;
    }
    return status;
}
