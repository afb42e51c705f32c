/* dlsym_next.c - checks that dlsym(RTLD_NEXT) keeps its meaning (relative to the caller) while
 * the cudatrace shim hooks dlsym. Run with LD_PRELOAD="<shim> <libnext.so>".
 *
 * Prints:
 *     getpid P                     what getpid() returned (through libnext.so when preloaded)
 *     real R                       syscall(SYS_getpid)
 *     via libnext yes|no           whether libnext.so's getpid was called
 *     next LIB                     the library libnext's RTLD_NEXT lookup found (basename), or -
 *     ok | bad                     ok when P == R (and, when libnext.so is loaded, the lookup
 *                                  found a library other than libnext.so)
 * Exit 0 for ok, 1 for bad.
 */
#include <dlfcn.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "cudasim_api.h"

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t p = getpid();
    pid_t real = (pid_t)syscall(SYS_getpid);
    int *calls = (int *)dlsym(RTLD_DEFAULT, "libnext_calls");
    void **next = (void **)dlsym(RTLD_DEFAULT, "libnext_next_getpid");
    int via = calls && *calls > 0;
    const char *lib = "-";
    Dl_info di;
    if (next && *next && dladdr(*next, &di) && di.dli_fname) {
        const char *s = strrchr(di.dli_fname, '/');
        lib = s ? s + 1 : di.dli_fname;
    }
    printf("getpid %d\n", (int)p);
    printf("real %d\n", (int)real);
    printf("via libnext %s\n", via ? "yes" : "no");
    printf("next %s\n", lib);
    int ok = p == real && (!calls || strcmp(lib, "libnext.so") != 0);
    printf("%s\n", ok ? "ok" : "bad");
    return ok ? 0 : 1;
}
