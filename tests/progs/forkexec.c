/* forkexec.c - a process tree that allocates in every process: fork+exec chains and a fork
 * without exec.
 *
 * usage: forkexec [--fork-child] DEPTH
 * Every image: cuInit, primary context, then cuMemAlloc_v2 of 1 MiB (forkexec_alloc). If
 * DEPTH > 0 it forks, and the child execs /proc/self/exe with DEPTH-1 (so DEPTH+1 images, each a
 * fresh process image, form a chain). The parent waits for the child, frees its buffer
 * (forkexec_free) and exits with the child's exit status.
 * --fork-child (top process only): before the chain, fork one child that does NOT exec; it
 * allocates and frees 1 MiB itself (forkchild_alloc / forkchild_free) and exits 0 with exit().
 * So `forkexec --fork-child 2` runs 3 exec'd images (pids P0 -> P1 -> P2) plus one fork-only
 * child of P0: 4 processes, each allocating 1 MiB once.
 *
 * Output: every process prints
 *     # forkexec pid P ppid Q depth D mode top|exec|fork
 * then its op lines (alloc/free cuMemAlloc_v2 1048576 PTR RESULT); the top prints
 *     # forkexec done status S
 * last. Lines of different processes interleave in time order (stdout is line-buffered and
 * flushed before every fork).
 */
#include <sys/wait.h>
#include <unistd.h>

#include "cudasim_api.h"

#define FE_SIZE (1ULL << 20)

NOINLINE CUresult forkexec_alloc(CUdeviceptr *p)
{
    return cuMemAlloc_v2(p, FE_SIZE);
}

NOINLINE CUresult forkexec_free(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}

NOINLINE CUresult forkchild_alloc(CUdeviceptr *p)
{
    return cuMemAlloc_v2(p, FE_SIZE);
}

NOINLINE CUresult forkchild_free(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}

static int cuda_setup(void)
{
    CUresult r = cuInit(0);
    CUdevice dev;
    CUcontext ctx;
    if (!r)
        r = cuDeviceGet(&dev, 0);
    if (!r)
        r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!r)
        r = cuCtxSetCurrent(ctx);
    if (r)
        printf("# setup failed %d\n", r);
    return r;
}

static int wait_status(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        ;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int fork_child = 0, i = 1, exec_child = 0;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
        if (!strcmp(argv[i], "--fork-child"))
            fork_child = 1;
        else if (!strcmp(argv[i], "--exec-child"))
            exec_child = 1; /* internal: marks an exec'd image */
        else
            break;
    }
    if (argc - i != 1) {
        fprintf(stderr, "usage: forkexec [--fork-child] DEPTH\n");
        return 2;
    }
    int depth = atoi(argv[i]);
    printf("# forkexec pid %d ppid %d depth %d mode %s\n", (int)getpid(), (int)getppid(), depth,
           exec_child ? "exec" : "top");
    if (cuda_setup())
        return 1;
    CUdeviceptr p = 0;
    CUresult r = forkexec_alloc(&p);
    op_line("alloc", "cuMemAlloc_v2", FE_SIZE, p, r);
    int status = r ? 1 : 0;

    if (fork_child) {
        fflush(stdout);
        pid_t c = fork();
        if (c == 0) {
            printf("# forkexec pid %d ppid %d depth %d mode fork\n", (int)getpid(), (int)getppid(), depth);
            CUdeviceptr q = 0;
            CUresult rc = forkchild_alloc(&q);
            op_line("alloc", "cuMemAlloc_v2", FE_SIZE, q, rc);
            if (!rc)
                op_line("free", "cuMemFree_v2", FE_SIZE, q, forkchild_free(q));
            exit(g_failures ? 1 : 0);
        }
        int cs = c < 0 ? 1 : wait_status(c);
        if (cs)
            status = cs;
    }

    if (depth > 0) {
        fflush(stdout);
        pid_t c = fork();
        if (c == 0) {
            char d[16];
            snprintf(d, sizeof(d), "%d", depth - 1);
            const char *via = getenv("FORKEXEC_VIA");   /* "qemu-aarch64 -L SYSROOT": no binfmt */
            if (via && *via) {
                char exe[4096], buf[4096], *args[16];
                int n = 0;
                ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
                exe[l > 0 ? l : 0] = 0;
                snprintf(buf, sizeof buf, "%s", via);
                for (char *t = strtok(buf, " "); t && n < 11; t = strtok(NULL, " "))
                    args[n++] = t;
                args[n++] = exe;
                args[n++] = "--exec-child";
                args[n++] = d;
                args[n] = NULL;
                execvp(args[0], args);
            }
            execl("/proc/self/exe", argv[0], "--exec-child", d, (char *)NULL);
            perror("forkexec: exec");
            _exit(127);
        }
        int cs = c < 0 ? 1 : wait_status(c);
        if (cs)
            status = cs;
    }

    if (!r) {
        CUresult fr = forkexec_free(p);
        op_line("free", "cuMemFree_v2", FE_SIZE, p, fr);
        if (fr && !status)
            status = 1;
    }
    if (!exec_child)
        printf("# forkexec done status %d\n", status);
    return status;
}
