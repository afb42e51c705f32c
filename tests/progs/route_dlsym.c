/* route_dlsym.c - the allocation surface reached through dlopen("libcuda.so.1") and
 * dlsym(handle, "<exported name>"), as CUDA runtimes before 11.3 (and loaders like it) do.
 * Output and sizes: route_seq.h, preceded by one line per lookup:
 *     dlsym NAME SYMBOL LIBRARY        (dladdr of the result: symbol name, library basename)
 *
 * usage: route_dlsym [--ptsz]
 *   --ptsz  look up the _ptsz names of the stream-ordered functions
 */
#include <dlfcn.h>
#include <libgen.h>

#include "route_seq.h"

static void describe(const char *kind, const char *name, void *p)
{
    Dl_info di;
    const char *sym = "-", *lib = "-";
    if (p && dladdr(p, &di)) {
        if (di.dli_sname)
            sym = di.dli_sname;
        if (di.dli_fname) {
            const char *s = strrchr(di.dli_fname, '/');
            lib = s ? s + 1 : di.dli_fname;
        }
    }
    printf("%s %s %s %s\n", kind, name, sym, lib);
}

static int route_resolve(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "route_dlsym: %s\n", dlerror());
        return -1;
    }
    int missing = 0;
    char name[128];
#define X(sym, base, minver, ptsz, ask)                                                \
    snprintf(name, sizeof(name), "%s%s", #sym, (ptsz && g_ptsz) ? "_ptsz" : "");   \
    p_##sym = (__typeof__(p_##sym))dlsym(h, name);                                  \
    describe("dlsym", name, (void *)p_##sym);                                       \
    if (!p_##sym)                                                                   \
        missing++;
    ROUTE_FUNCS(X)
#undef X
    return missing ? -1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ptsz")) {
            g_ptsz = 1;
        } else {
            fprintf(stderr, "usage: route_dlsym [--ptsz]\n");
            return 2;
        }
    }
    printf("# route dlsym ptsz %d\n", g_ptsz);
    if (route_resolve() < 0) {
        fprintf(stderr, "route_dlsym: a symbol is missing\n");
        return 1;
    }
    run_sequence(NULL);
    return g_failures ? 1 : 0;
}
