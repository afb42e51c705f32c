/* entry.c - the program's ways into the hooked functions (entry.h): dlsym(handle, name) and
 * cuGetProcAddress[_v2] hand out the wrappers (shim.c) and keep the real pointers (route.c).
 * The top of the shim: it needs the wrappers' addresses, and nothing of the shim calls it. */
#include "entry.h"

#include <dlfcn.h>
#include <string.h>

#include "route.h"
#include "shim.h"
#include "trace_format.h"
#include "util.h"

/* the wrappers (shim.c) of each row of ct_hooks, in the same order (both from hooks.def) */
static const struct {
    void *wrap, *wrap_ptsz;
} wrappers[] = {
#define CT_DRIVER(ID, ...) {(void *)ID, (void *)ct_ptsz_##ID},
#define CT_RUNTIME(ID, ...) {(void *)ID, NULL},
#define CT_NVML(ID, ...) {(void *)ID, NULL},
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
};
_Static_assert(sizeof wrappers / sizeof wrappers[0] == CT_API_COUNT - 1,
               "one wrapper row per hooks.def line");

CT_NO_SANITIZE static int is_own_wrapper(void *p)
{
    if (p == (void *)cuGetProcAddress || p == (void *)cuGetProcAddress_v2)
        return 1;
    for (size_t i = 0; i < ct_nhooks; i++)
        if (p == wrappers[i].wrap || (wrappers[i].wrap_ptsz && p == wrappers[i].wrap_ptsz))
            return 1;
    return 0;
}

/* dlsym(handle, name) found p: the wrapper to hand out instead, or p */
CT_NO_SANITIZE static void *wrap_symbol(void *handle, const char *name, void *p)
{
    if (is_own_wrapper(p))
        return p;
    if (strcmp(name, "cuGetProcAddress") == 0 || strcmp(name, "cuGetProcAddress_v2") == 0) {
        /* the handle the program reaches the driver through: the shim's own queries use it */
        ct_route_set_handle(CT_LAYER_DRIVER, handle);
        int v2 = name[16] != 0;
        ct_route_keep_real(v2 ? CT_SLOT_cuGetProcAddress_v2 : CT_SLOT_cuGetProcAddress, p);
        return v2 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    }
    size_t n = strlen(name);
    for (size_t i = 0; i < ct_nhooks; i++) {
        const struct ct_hook *h = &ct_hooks[i];
        size_t l = strlen(h->sym);
        if (strncmp(name, h->sym, l) != 0)
            continue;
        int exact = n == l, twin = h->ptsz && n == l + 5 && strcmp(name + l, "_ptsz") == 0;
        if (!exact && !twin)
            continue;
        ct_route_set_handle(h->layer, handle);
        ct_route_keep_real(exact ? h->slot : h->slot + 1, p);
        return exact ? wrappers[i].wrap : wrappers[i].wrap_ptsz;
    }
    return p;
}

/* cuGetProcAddress gave p for (symbol, version, flags): the wrapper of exactly that variant */
static void *wrap_proc(const char *symbol, void *p, int ver, cuuint64_t flags)
{
    if (is_own_wrapper(p))
        return p;
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        if (ver >= 12000) {
            ct_route_keep_real(CT_SLOT_cuGetProcAddress_v2, p);
            return (void *)cuGetProcAddress_v2;
        }
        ct_route_keep_real(CT_SLOT_cuGetProcAddress, p);
        return (void *)cuGetProcAddress;
    }
    size_t best = ct_nhooks;
    for (size_t i = 0; i < ct_nhooks; i++) {
        const struct ct_hook *h = &ct_hooks[i];
        if (h->base && strcmp(h->base, symbol) == 0 && h->minver <= ver &&
            (best == ct_nhooks || h->minver > ct_hooks[best].minver))
            best = i;
    }
    if (best == ct_nhooks)
        return p; /* not hooked, or an older ABI: the driver's own, unwrapped */
    const struct ct_hook *h = &ct_hooks[best];
    if (h->ptsz && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
        ct_route_keep_real(h->slot + 1, p);
        return wrappers[best].wrap_ptsz;
    }
    ct_route_keep_real(h->slot, p);
    return wrappers[best].wrap;
}

CT_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status)
{
    typedef CUresult (*fn_t)(const char *, void **, int, cuuint64_t,
                             CUdriverProcAddressQueryResult *);
    fn_t real = (fn_t)ct_real(CT_SLOT_cuGetProcAddress_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn) {
        ct_shim_first_use();
        *pfn = wrap_proc(symbol, *pfn, ver, flags);
    }
    return r;
}

CT_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    typedef CUresult (*fn_t)(const char *, void **, int, cuuint64_t);
    fn_t real = (fn_t)ct_real(CT_SLOT_cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, ver, flags);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn) {
        ct_shim_first_use();
        *pfn = wrap_proc(symbol, *pfn, ver, flags);
    }
    return r;
}

/* dlsym: RTLD_NEXT must keep meaning "after the caller", so that path is a plain tail call
 * (the real dlsym then sees the caller's return address, not ours). Optimized whatever CFLAGS
 * say, so the compiler emits that tail call even in a -O0 build. */
#if defined(__GNUC__) && !defined(__clang__)
#define CT_TAILCALLS __attribute__((optimize("O2", "optimize-sibling-calls")))
#else
#define CT_TAILCALLS
#endif
CT_EXPORT CT_TAILCALLS CT_NO_SANITIZE void *dlsym(void *handle, const char *name)
{
    /* ct_real_dlsym() spelled out: an inline copy could be instrumented (CT_NO_SANITIZE) */
    ct_dlsym_fn ds = __atomic_load_n(&ct_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (!ds)
        ds = ct_real_dlsym_lookup();
    if (!ds)
        return NULL;
    if (handle == RTLD_NEXT || (name[0] != 'c' && name[0] != 'n'))
        return ds(handle, name);
    void *p = ds(handle, name);
    if (!p)
        return p;
    return wrap_symbol(handle, name, p);
}
