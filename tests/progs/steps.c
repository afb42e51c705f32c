/* steps.c - device memory changed step by step, on commands read from stdin: for tests that look
 * at a run while it goes on (metrics scraped between steps, a disk filled before the exit).
 *
 * usage: steps          then one command a line; each is answered "ok" (or "# failed R"):
 *     a SIZE       allocate SIZE bytes with cuMemAlloc_v2 (steps_alloc) and keep them
 *     f            free the last buffer kept (steps_free)
 *     n N SIZE     N cuMemAlloc_v2/cuMemFree_v2 pairs of SIZE (steps_pair): events, no memory
 *     q            exit 0 (also at the end of stdin), keeping what is held
 * SIZE may end in k, m or g. Prints "ready" once the driver is initialized.
 */
#include "cudasim_api.h"

#define MAX_KEPT 4096

NOINLINE CUresult steps_alloc(CUdeviceptr *p, unsigned long long size)
{
    return cuMemAlloc_v2(p, size);
}

NOINLINE CUresult steps_free(CUdeviceptr p)
{
    return cuMemFree_v2(p);
}

NOINLINE CUresult steps_pair(unsigned long long size)
{
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc_v2(&p, size);
    return r ? r : cuMemFree_v2(p);
}

int main(void)
{
    static CUdeviceptr kept[MAX_KEPT];
    int nkept = 0;
    char line[256], arg1[64], arg2[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cuInit(0)) {
        printf("# cuInit failed\n");
        return 1;
    }
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        CUresult r = 0;
        arg1[0] = arg2[0] = 0;
        int n = sscanf(line + 1, "%63s %63s", arg1, arg2);
        if (line[0] == 'q')
            break;
        if (line[0] == 'a' && n >= 1 && nkept < MAX_KEPT) {
            r = steps_alloc(&kept[nkept], parse_size(arg1));
            nkept += r == 0;
        } else if (line[0] == 'f' && nkept > 0) {
            r = steps_free(kept[--nkept]);
        } else if (line[0] == 'n' && n == 2) {
            long count = atol(arg1);
            unsigned long long size = parse_size(arg2);
            for (long i = 0; i < count && !r; i++)
                r = steps_pair(size);
        } else {
            printf("# bad command\n");
            continue;
        }
        if (r)
            printf("# failed %d\n", r);
        else
            printf("ok\n");
    }
    return 0;
}
