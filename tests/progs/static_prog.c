/* static_prog.c - a statically linked program (built with cc -static): LD_PRELOAD cannot reach
 * it, so a tracer must notice and say so. No CUDA.
 * usage: static_prog [N]      prints "static ok pid P" and exits with N (default 0)
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    printf("static ok pid %d\n", (int)getpid());
    fflush(stdout);
    return argc > 1 ? atoi(argv[1]) : 0;
}
