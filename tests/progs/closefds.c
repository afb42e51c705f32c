/* closefds.c - a program that closes every descriptor it did not open (as some daemons do),
 * and so drops cudatrace's ledger descriptor and with it its budget liveness lock.
 *
 * usage: closefds SIZE     (SIZE may end in k, m or g)
 * Allocates SIZE (cuMemAlloc_v2), closes descriptors 3 and up, prints "closed", waits for a line
 * on stdin (the test makes another member reclaim it meanwhile), allocates SIZE again and prints
 * one "alloc cuMemAlloc_v2 SIZE PTR RESULT" line per allocation. Exit 0.
 */
#include <unistd.h>

#include "cudasim_api.h"

NOINLINE CUresult closefds_alloc(CUdeviceptr *p, unsigned long long size)
{
    return cuMemAlloc_v2(p, size);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: closefds SIZE\n");
        return 2;
    }
    unsigned long long size = parse_size(argv[1]);
    if (cuInit(0))
        return 1;
    CUdeviceptr a = 0, b = 0;
    CUresult r = closefds_alloc(&a, size);
    op_line("alloc", "cuMemAlloc_v2", size, a, r);
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
    printf("closed\n");
    char buf[16];
    if (read(0, buf, sizeof buf) < 0)
        return 1;
    r = closefds_alloc(&b, size);
    op_line("alloc", "cuMemAlloc_v2", size, b, r);
    return 0;
}
