/* route.c - the real side of every hooked function (route.h): one real pointer per hooked ABI
 * variant, the hook table derived from hooks.def, the driver / NVML symbols the shim calls. */
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

CT_NO_SANITIZE void ct_route_set_handle(int layer, void *handle)
{
    if (layer == CT_LAYER_DRIVER)
        __atomic_store_n(&cuda_handle, handle, __ATOMIC_RELEASE);
    else if (layer == CT_LAYER_NVML)
        __atomic_store_n(&nvml_handle, handle, __ATOMIC_RELEASE);
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
    {#ID, BASE, MINVER, PTSZ, CT_LAYER_DRIVER, OP, KIND, SPACE, CT_API_##ID, CT_SLOT_##ID},
#define CT_RUNTIME(ID, ...)                                                                        \
    {#ID, NULL, 0, 0, CT_LAYER_RUNTIME, CT_OP_NONE, 0, 0, CT_API_##ID, CT_SLOT_##ID},
#define CT_NVML(ID, ...)                                                                           \
    {#ID, NULL, 0, 0, CT_LAYER_NVML, CT_OP_MEMINFO, 0, 0, CT_API_##ID, CT_SLOT_##ID},
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

CT_NO_SANITIZE void ct_route_keep_real(int slot, void *p)
{
    void *expected = NULL;
    __atomic_compare_exchange_n(&ct_real_ptr[slot], &expected, p, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}
