/* libnext.c - libnext.so: a second preload library that forwards with dlsym(RTLD_NEXT).
 *
 * Preloaded AFTER the cudatrace shim (LD_PRELOAD="libcudatrace.so libnext.so"), its getpid()
 * asks dlsym(RTLD_NEXT, "getpid") for the next definition after libnext.so itself: libc's. The
 * shim hooks dlsym; if its hook resolved RTLD_NEXT relative to the shim instead of the caller,
 * it would hand libnext its own getpid back and getpid() would recurse until the stack overflows.
 * libnext_calls counts calls so the program can tell that libnext was in the path.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

__attribute__((visibility("default"))) int libnext_calls;
__attribute__((visibility("default"))) void *libnext_next_getpid;

pid_t getpid(void)
{
    static pid_t (*next)(void);
    __atomic_fetch_add(&libnext_calls, 1, __ATOMIC_RELAXED);
    if (!next) {
        next = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
        libnext_next_getpid = (void *)next;
    }
    if (!next || next == getpid)
        return -1;
    return next();
}
