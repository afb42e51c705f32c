/* libinterpose.c - libinterpose.so: a minimal interposer of cuMemAlloc_v2 for testing the
 * simulator itself. Preloaded, it takes the program's cuMemAlloc_v2 calls (PLT) and forwards them
 * with dlsym(RTLD_NEXT); at exit it prints "# interpose cuMemAlloc_v2 N" to stderr. The simulated
 * driver's cuGetProcAddress must still hand out its own cuMemAlloc_v2 (as a real driver does),
 * never this one.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>

typedef unsigned long long CUdeviceptr;
typedef int CUresult;

static int g_calls;

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    static CUresult (*next)(CUdeviceptr *, size_t);
    if (!next)
        next = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    __atomic_fetch_add(&g_calls, 1, __ATOMIC_RELAXED);
    return next ? next(dptr, bytesize) : 999;
}

__attribute__((destructor)) static void report(void)
{
    fprintf(stderr, "# interpose cuMemAlloc_v2 %d\n", g_calls);
}
