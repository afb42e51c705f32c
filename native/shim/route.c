/* route.c - every way into the driver and NVML reaches the wrappers (route.h): exported
 * symbols, dlsym, cuGetProcAddress[_v2]; one real pointer per hooked ABI variant. */
#include "route.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "trace_format.h"
#include "util.h"

static const char *const slot_names[CT_NSLOTS] = {
#define CT_DRIVER(ID, ...) #ID, #ID "_ptsz",
#define CT_RUNTIME(ID, ...) #ID,
#define CT_NVML(ID, ...) #ID,
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
};

void *ct_real_ptr[CT_NSLOTS];
static void *cuda_handle; /* libcuda as the program opened it */
static void *nvml_handle;
static void (*first_use_fn)(void);

void ct_route_set_first_use(void (*fn)(void))
{
    __atomic_store_n(&first_use_fn, fn, __ATOMIC_RELEASE);
}

static void first_use(void)
{
    void (*fn)(void) = __atomic_load_n(&first_use_fn, __ATOMIC_ACQUIRE);
    if (fn)
        fn();
}

void *ct_resolve_slot(int slot)
{
    ct_dlsym_fn ds = ct_real_dlsym();
    if (!ds)
        return NULL;
    const char *name = slot_names[slot];
    void *p = ds(RTLD_NEXT, name);
    if (!p && cuda_handle && name[0] == 'c')
        p = ds(cuda_handle, name);
    if (!p && nvml_handle && name[0] == 'n')
        p = ds(nvml_handle, name);
    if (!p && name[0] == 'c' && name[1] == 'u' && name[2] != 'd') {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (h)
            p = ds(h, name);
    }
    if (p)
        __atomic_store_n(&ct_real_ptr[slot], p, __ATOMIC_RELEASE);
    return p;
}

void *ct_driver_sym(const char *name)
{
    ct_dlsym_fn ds = ct_real_dlsym();
    void *p = NULL;
    if (!ds)
        return NULL;
    if (cuda_handle)
        p = ds(cuda_handle, name);
    if (!p) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (h)
            p = ds(h, name);
    }
    return p;
}

void *ct_nvml_sym(const char *name)
{
    ct_dlsym_fn ds = ct_real_dlsym();
    void *p = NULL;
    if (ds && nvml_handle)
        p = ds(nvml_handle, name);
    if (!p && ds)
        p = ds(RTLD_NEXT, name);
    return p;
}

/* ---- what each name maps to: the dlsym and cuGetProcAddress tables --------------------- */
const struct ct_hook ct_hooks[] = {
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, OP, KIND, SPACE, ...)                                    \
    {#ID,  BASE,  MINVER,      PTSZ,         CT_LAYER_DRIVER, OP,                                  \
     KIND, SPACE, CT_API_##ID, CT_SLOT_##ID, (void *)ID,      (void *)ct_ptsz_##ID},
#define CT_RUNTIME(ID, ...)                                                                        \
    {#ID,         NULL,         0,          0,   CT_LAYER_RUNTIME, CT_OP_NONE, 0, 0,               \
     CT_API_##ID, CT_SLOT_##ID, (void *)ID, NULL},
#define CT_NVML(ID, ...)                                                                           \
    {#ID,         NULL,         0,          0,   CT_LAYER_NVML, CT_OP_MEMINFO, 0, 0,               \
     CT_API_##ID, CT_SLOT_##ID, (void *)ID, NULL},
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
};
const size_t ct_nhooks = sizeof ct_hooks / sizeof ct_hooks[0];

const char *ct_api_name(uint16_t api)
{
    for (size_t i = 0; i < ct_nhooks; i++)
        if (ct_hooks[i].api == api)
            return ct_hooks[i].sym;
    return "?";
}

static void keep_real(int slot, void *p)
{
    void *expected = NULL;
    __atomic_compare_exchange_n(&ct_real_ptr[slot], &expected, p, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

CT_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags);
CT_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status);

static int is_own_wrapper(void *p)
{
    if (p == (void *)cuGetProcAddress || p == (void *)cuGetProcAddress_v2)
        return 1;
    for (size_t i = 0; i < ct_nhooks; i++)
        if (p == ct_hooks[i].wrap || (ct_hooks[i].wrap_ptsz && p == ct_hooks[i].wrap_ptsz))
            return 1;
    return 0;
}

/* dlsym(handle, name) found p: the wrapper to hand out instead, or p */
static void *wrap_symbol(void *handle, const char *name, void *p)
{
    if (is_own_wrapper(p))
        return p;
    if (strcmp(name, "cuGetProcAddress") == 0 || strcmp(name, "cuGetProcAddress_v2") == 0) {
        /* the handle the program reaches the driver through: the shim's own queries use it */
        __atomic_store_n(&cuda_handle, handle, __ATOMIC_RELEASE);
        int v2 = name[16] != 0;
        keep_real(v2 ? CT_SLOT_cuGetProcAddress_v2 : CT_SLOT_cuGetProcAddress, p);
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
        if (h->layer == CT_LAYER_DRIVER)
            __atomic_store_n(&cuda_handle, handle, __ATOMIC_RELEASE);
        else if (h->layer == CT_LAYER_NVML)
            __atomic_store_n(&nvml_handle, handle, __ATOMIC_RELEASE);
        keep_real(exact ? h->slot : h->slot + 1, p);
        return exact ? h->wrap : h->wrap_ptsz;
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
            keep_real(CT_SLOT_cuGetProcAddress_v2, p);
            return (void *)cuGetProcAddress_v2;
        }
        keep_real(CT_SLOT_cuGetProcAddress, p);
        return (void *)cuGetProcAddress;
    }
    const struct ct_hook *best = NULL;
    for (size_t i = 0; i < ct_nhooks; i++) {
        const struct ct_hook *h = &ct_hooks[i];
        if (h->base && strcmp(h->base, symbol) == 0 && h->minver <= ver &&
            (!best || h->minver > best->minver))
            best = h;
    }
    if (!best)
        return p; /* not hooked, or an older ABI: the driver's own, unwrapped */
    if (best->ptsz && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
        keep_real(best->slot + 1, p);
        return best->wrap_ptsz;
    }
    keep_real(best->slot, p);
    return best->wrap;
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
        first_use();
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
        first_use();
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
CT_EXPORT CT_TAILCALLS void *dlsym(void *handle, const char *name)
{
    ct_dlsym_fn ds = ct_real_dlsym();
    if (!ds)
        return NULL;
    if (handle == RTLD_NEXT || (name[0] != 'c' && name[0] != 'n'))
        return ds(handle, name);
    void *p = ds(handle, name);
    if (!p)
        return p;
    return wrap_symbol(handle, name, p);
}
