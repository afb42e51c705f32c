/* route.h - the real side of every hooked function (route.c): the real-pointer slots, the
 * hook table derived from hooks.def, and the driver / NVML entry points the shim itself calls.
 * The ways in that hand out the wrappers are entry.c's (entry.h).
 *
 * Routes, all reaching the same wrappers (generated from hooks.def, defined in shim.c):
 *   1. exported driver symbols (programs linked with -lcuda, through their PLT);
 *   2. dlsym(handle, "cuMemAlloc_v2"...): the wrapper is returned, the real pointer kept;
 *   3. cuGetProcAddress[_v2] (how the static and shared CUDA runtimes reach the driver): after
 *      the real call succeeds the wrapper of exactly the ABI variant asked for is handed back
 *      (base name + cudaVersion + per-thread flag), one real pointer per variant. */
#ifndef CUDATRACE_ROUTE_H
#define CUDATRACE_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_abi.h"
#include "util.h"

/* ---- tables derived from hooks.def ------------------------------------------------------ */
enum {
#define CT_DRIVER(ID, ...) CT_SLOT_##ID, CT_SLOT_##ID##_ptsz,
#define CT_RUNTIME(ID, ...) CT_SLOT_##ID,
#define CT_NVML(ID, ...) CT_SLOT_##ID,
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
    CT_SLOT_cuGetProcAddress,
    CT_SLOT_cuGetProcAddress_v2,
    CT_NSLOTS
};

enum {
    CT_API_NONE = 0,
#define CT_DRIVER(ID, ...) CT_API_##ID,
#define CT_RUNTIME(ID, ...) CT_API_##ID,
#define CT_NVML(ID, ...) CT_API_##ID,
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
    CT_API_COUNT
};

typedef struct {
    size_t width, height, depth;
} CT_EXTENT3D; /* cudaExtent, in the runtime hooks' prototypes */

/* one hooked name */
struct ct_hook {
    const char *sym;  /* exact exported name of this variant */
    const char *base; /* cuGetProcAddress name; NULL for runtime/NVML */
    int minver;
    int ptsz;
    uint8_t layer, op, kind, space;
    uint16_t api;
    int slot; /* its slot; slot + 1 is the _ptsz twin's */
};
extern CT_HIDDEN const struct ct_hook ct_hooks[];
extern CT_HIDDEN const size_t ct_nhooks;
const char *ct_api_name(uint16_t api);

/* ---- real pointers ------------------------------------------------------------------------ */
extern CT_HIDDEN void *ct_real_ptr[CT_NSLOTS];
void *ct_resolve_slot(int slot); /* cold: first call through a slot */
/* the real function behind a wrapper (hot: one acquire load) */
static inline void *ct_real(int slot)
{
    void *p = __atomic_load_n(&ct_real_ptr[slot], __ATOMIC_ACQUIRE);
    return p ? p : ct_resolve_slot(slot);
}

/* a driver / NVML entry point the shim itself calls (not hooked): through the libraries the
 * program opened */
void *ct_driver_sym(const char *name);
void *ct_nvml_sym(const char *name);

/* the entry points (entry.c) found the real p of a slot: keep the first one found */
CT_NO_SANITIZE void ct_route_keep_real(int slot, void *p);
/* the handle the program reached a hooked library through (CT_LAYER_DRIVER / _NVML): the
 * shim's own driver and NVML queries use it */
CT_NO_SANITIZE void ct_route_set_handle(int layer, void *handle);

#endif
