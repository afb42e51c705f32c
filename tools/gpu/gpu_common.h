/* gpu_common.h - helpers shared by the GPU-suite programs (tools/gpu).
 *
 * Every program prints machine-readable lines on stdout, one fact per line, which
 * tests/gpu/test_gpu.py compares against the trace:
 *
 *   alloc RTAPI SIZE PTR     an allocation the program made (RTAPI: the call it used)
 *   free RTAPI PTR           a free
 *   meminfo FREE TOTAL       what cudaMemGetInfo/cuMemGetInfo answered
 *   thread TID PAIRS SIZE    a worker thread (kernel tid) made PAIRS alloc+free pairs of SIZE
 *   info KEY VALUE           anything else worth knowing
 *   done                     the program reached its end
 *
 * Sizes are decimal, pointers hex (0x...). Errors go to stderr with exit status 2.
 */
#ifndef GPU_COMMON_H
#define GPU_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/syscall.h>

#define NOINLINE __attribute__((noinline, noclone, used))

static inline unsigned long gc_tid(void) { return (unsigned long)syscall(SYS_gettid); }

static inline void gc_line_buffered(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

static inline void gc_alloc(const char *api, unsigned long long size, const void *p)
{
    printf("alloc %s %llu 0x%llx\n", api, size, (unsigned long long)(uintptr_t)p);
}

static inline void gc_free(const char *api, const void *p)
{
    printf("free %s 0x%llx\n", api, (unsigned long long)(uintptr_t)p);
}

static inline void gc_meminfo(unsigned long long f, unsigned long long t)
{
    printf("meminfo %llu %llu\n", f, t);
}

#endif
