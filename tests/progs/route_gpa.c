/* route_gpa.c - the allocation surface reached as the static CUDA runtime reaches it:
 * dlopen("libcuda.so.1"), dlsym(h, "cuGetProcAddress_v2"), then everything (cuInit and the
 * context calls included) through cuGetProcAddress by base name, cudaVersion and flags. The
 * first lookup asks cuGetProcAddress for "cuGetProcAddress" itself (cudaVersion 12000, or 11030
 * with --v1) and all later lookups go through the pointer that returned.
 *
 * Output and sizes: route_seq.h, preceded by one line per lookup:
 *     resolve BASE VERSION FLAGS RESULT STATUS SYMBOL LIBRARY
 *   RESULT the CUresult; STATUS the CUdriverProcAddressQueryResult (- for v1); SYMBOL and
 *   LIBRARY: dladdr of the returned pointer (- when NULL).
 *
 * usage: route_gpa [--ptsz | --legacy] [--old-abi] [--v1] [--runtime-versions]
 *   --ptsz              flags=2 (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) for every lookup:
 *                       the stream-ordered calls get (and print) their _ptsz variants
 *   --legacy            flags=1 (CU_GET_PROC_ADDRESS_LEGACY_STREAM)
 *   --old-abi           also look up ("cuMemAlloc", 2000) and ("cuMemFree", 2000), the 32-bit
 *                       ABI, and call them once: alloc cuMemAlloc 20971520 / free cuMemFree
 *   --v1                use cuGetProcAddress (4 arguments) instead of cuGetProcAddress_v2
 *   --runtime-versions  ask each function at the cudaVersion that introduced its ABI (3020 for
 *                       cuMemAlloc, 11020 for cuMemAllocAsync, ...) as the real runtime does,
 *                       instead of 13000 (12000 for cuCtxGetDevice, whose 13000 ABI differs)
 */
#include <dlfcn.h>

#include "route_seq.h"

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);

static int g_v1, g_old_abi, g_runtime_versions;
static cuuint64_t g_flags;
static gpa_v2_t g_gpa2;
static gpa_v1_t g_gpa1;
static CUresult (*p_cuMemAlloc_old)(CUdeviceptr_v1 *, unsigned int);
static CUresult (*p_cuMemFree_old)(CUdeviceptr_v1);

static void *resolve(const char *base, int version, cuuint64_t flags)
{
    void *p = NULL;
    CUresult r;
    char status[16] = "-";
    if (g_v1) {
        r = g_gpa1(base, &p, version, flags);
    } else {
        CUdriverProcAddressQueryResult st = -1;
        r = g_gpa2(base, &p, version, flags, &st);
        snprintf(status, sizeof(status), "%d", st);
    }
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
    printf("resolve %s %d %llu %d %s %s %s\n", base, version, (unsigned long long)flags, r, status, sym, lib);
    return r ? NULL : p;
}

static int route_resolve(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "route_gpa: %s\n", dlerror());
        return -1;
    }
    const char *entry = g_v1 ? "cuGetProcAddress" : "cuGetProcAddress_v2";
    void *first = dlsym(h, entry);
    printf("dlsym %s %s\n", entry, first ? "found" : "missing");
    if (!first)
        return -1;
    g_gpa1 = (gpa_v1_t)first;
    g_gpa2 = (gpa_v2_t)first;
    /* the runtime asks cuGetProcAddress for itself, then uses what it got */
    void *self = resolve("cuGetProcAddress", g_v1 ? 11030 : 12000, 0);
    if (!self)
        return -1;
    g_gpa1 = (gpa_v1_t)self;
    g_gpa2 = (gpa_v2_t)self;
    int missing = 0;
#define X(sym, base, minver, ptsz, ask)                                                   \
    p_##sym = (__typeof__(p_##sym))resolve(base, g_runtime_versions ? minver : ask, g_flags); \
    if (!p_##sym)                                                                         \
        missing++;
    ROUTE_FUNCS(X)
#undef X
    if (g_old_abi) {
        p_cuMemAlloc_old = (__typeof__(p_cuMemAlloc_old))resolve("cuMemAlloc", 2000, g_flags);
        p_cuMemFree_old = (__typeof__(p_cuMemFree_old))resolve("cuMemFree", 2000, g_flags);
        if (!p_cuMemAlloc_old || !p_cuMemFree_old)
            missing++;
    }
    return missing ? -1 : 0;
}

NOINLINE void do_alloc_old_abi(void)
{
    CUdeviceptr_v1 p = 0;
    CUresult r = p_cuMemAlloc_old(&p, (unsigned int)SZ_OLD);
    op_line("alloc", "cuMemAlloc", SZ_OLD, p, r);
    if (!r) {
        r = p_cuMemFree_old(p);
        op_line("free", "cuMemFree", SZ_OLD, p, r);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ptsz")) {
            g_ptsz = 1;
            g_flags = 2;
        } else if (!strcmp(argv[i], "--legacy")) {
            g_flags = 1;
        } else if (!strcmp(argv[i], "--old-abi")) {
            g_old_abi = 1;
        } else if (!strcmp(argv[i], "--v1")) {
            g_v1 = 1;
        } else if (!strcmp(argv[i], "--runtime-versions")) {
            g_runtime_versions = 1;
        } else {
            fprintf(stderr, "usage: route_gpa [--ptsz|--legacy] [--old-abi] [--v1] [--runtime-versions]\n");
            return 2;
        }
    }
    printf("# route gpa ptsz %d v1 %d flags %llu\n", g_ptsz, g_v1, (unsigned long long)g_flags);
    if (route_resolve() < 0) {
        fprintf(stderr, "route_gpa: a lookup failed\n");
        return 1;
    }
    run_sequence(g_old_abi ? do_alloc_old_abi : NULL);
    return g_failures ? 1 : 0;
}
