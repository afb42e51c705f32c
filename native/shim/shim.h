/* shim.h - what shim.c defines for the one module above it (entry.c): the wrappers generated
 * from hooks.def and the shim's initialization on first use. Nothing else calls into shim.c. */
#ifndef CUDATRACE_SHIM_H
#define CUDATRACE_SHIM_H

#include "route.h"

/* The wrappers the routes hand out: ID, and ct_ptsz_ID for the
 * per-thread-default-stream twin of a driver function. */
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, OP, KIND, SPACE, PROTO, ...)                             \
    CT_EXPORT CUresult ID PROTO;                                                                   \
    CUresult ct_ptsz_##ID PROTO;
#define CT_RUNTIME(ID, PROTO, ARGS) CT_EXPORT int ID PROTO;
#define CT_NVML(ID, PROTO, ARGS) CT_EXPORT nvmlReturn_t ID PROTO;
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML

/* Called by cuGetProcAddress[_v2] after a successful lookup: lookups can come before the shim's
 * constructor ran. */
void ct_shim_first_use(void);

#endif
