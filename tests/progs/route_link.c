/* route_link.c - the allocation surface called directly by exported name (PLT), as a program
 * linked with -lcuda does. Output and sizes: route_seq.h.
 *
 * usage: route_link [--ptsz]
 *   --ptsz  call the per-thread-default-stream symbols (cuMemAllocAsync_ptsz, ...) directly, as
 *           cuda.h maps them for code built with CUDA_API_PER_THREAD_DEFAULT_STREAM.
 */
#define ROUTE_LINK 1
#include "route_seq.h"

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ptsz")) {
            g_ptsz = 1;
        } else {
            fprintf(stderr, "usage: route_link [--ptsz]\n");
            return 2;
        }
    }
    printf("# route link ptsz %d\n", g_ptsz);
    run_sequence(NULL);
    return g_failures ? 1 : 0;
}
