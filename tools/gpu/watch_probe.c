/* watch_probe.c - a process for the node's watch on a real GPU (tools/gpu/watch_check.py).
 *
 * usage: watch_probe JOIN_MIB [AROUND_MIB [AFTER_MS]]
 *
 * Makes device 0's primary context current, allocates JOIN_MIB MiB through cuMemAlloc_v2 as
 * linked (-lcuda: the preload library sees it, and a process given a budget joins its group
 * with it), then after AFTER_MS milliseconds AROUND_MIB MiB through the driver's cuMemAlloc_v2
 * found by libc's own dlsym, reached through dlvsym (which the preload library does not wrap:
 * the library never sees it). Prints
 *   alloc cuMemAlloc_v2 SIZE PTR        each allocation
 *   breach NS                           CLOCK_REALTIME just after the one around the library
 *   ready
 * and sleeps until a signal ends it (SIGTERM's default: it dies of it).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef void *(*dlsym_fn)(void *, const char *);

#define CK(call)                                                                              \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            fprintf(stderr, "watch_probe: %s failed: %d\n", #call, (int)r_);                  \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

static alloc_fn around(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *libdl = dlopen("libdl.so.2", RTLD_NOW | RTLD_NOLOAD);
    dlsym_fn real = NULL;
    for (size_t i = 0; !real && i < sizeof(versions) / sizeof(*versions); i++) {
        real = libc ? (dlsym_fn)dlvsym(libc, "dlsym", versions[i]) : NULL;
        if (!real && libdl)
            real = (dlsym_fn)dlvsym(libdl, "dlsym", versions[i]);
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return real && cuda ? (alloc_fn)real(cuda, "cuMemAlloc_v2") : NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: watch_probe JOIN_MIB [AROUND_MIB [AFTER_MS]]\n");
        return 2;
    }
    size_t join = strtoull(argv[1], NULL, 0) << 20;
    size_t more = argc > 2 ? strtoull(argv[2], NULL, 0) << 20 : 0;
    long after_ms = argc > 3 ? atol(argv[3]) : 0;
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUdeviceptr p = 0;
    if (join) {
        CK(cuMemAlloc_v2(&p, join));
        printf("alloc cuMemAlloc_v2 %zu 0x%llx\n", join, (unsigned long long)p);
    }
    if (more) {
        struct timespec ts = {after_ms / 1000, (after_ms % 1000) * 1000000L};
        while (after_ms > 0 && nanosleep(&ts, &ts) != 0)
            ;
        alloc_fn raw = around();
        if (!raw) {
            fprintf(stderr, "watch_probe: no cuMemAlloc_v2 through dlvsym's dlsym\n");
            return 2;
        }
        CK(raw(&p, more));
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        printf("alloc cuMemAlloc_v2 %zu 0x%llx\n", more, (unsigned long long)p);
        printf("breach %lld\n", (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    }
    printf("ready\n");
    for (;;)
        pause();
}
