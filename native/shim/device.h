/* device.h - the device of a call (device.c): the calling thread's current context's, or a
 * stream's. A context's device never changes, so the thread remembers the one it last asked
 * about: cuCtxGetCurrent (a thread-local read in the driver) tells whether the context is still
 * that one, and only a new context costs cuCtxGetDevice. (The cache is per thread because the
 * current context is; a context that ends moves the epoch, so a handle given again to another
 * device's context is asked again.) The common case is inline: one driver call and a compare. */
#ifndef CUDATRACE_DEVICE_H
#define CUDATRACE_DEVICE_H

#include <stdint.h>

#include "cuda_abi.h"
#include "util.h"

/* cuCtxGetCurrent, once looked up (device.c); the contexts' epoch (moved by ct_device_ctx_ends) */
extern CT_HIDDEN CUresult (*ct_device_get_ctx)(CUcontext *);
extern CT_HIDDEN uint32_t ct_device_epoch;

/* the general case of current_device (device.c): a new context, an epoch moved, no lookup yet */
int ct_device_current_slow(void);
/* the device of stream s (not the NULL, legacy or per-thread stream), -1: unknown */
int ct_device_of_stream(CUstream s);
/* a call that may end a context is about to run (hooks.def CT_OP_CTX_END): every thread asks
 * again (a handle may come back as another device's context) */
void ct_device_ctx_ends(void);

/* the device of the calling thread's current context, -1: unknown */
static inline int current_device(void)
{
    CUresult (*gc)(CUcontext *) = __atomic_load_n(&ct_device_get_ctx, __ATOMIC_RELAXED);
    CUcontext ctx = NULL;
    if (__builtin_expect(
            gc && ct_thr.ctx_epoch == __atomic_load_n(&ct_device_epoch, __ATOMIC_ACQUIRE), 1) &&
        gc(&ctx) == CUDA_SUCCESS && ctx && (uintptr_t)ctx == ct_thr.dev_ctx)
        return ct_thr.dev;
    return ct_device_current_slow();
}

/* The device a stream-ordered allocation on stream s comes from: the stream's (the pool current
 * to the stream's device, the driver's rule), which need not be the current context's. -1 for
 * the NULL, legacy and per-thread streams (the current context's: current_device) or when the
 * driver cannot say. */
static inline int stream_device(CUstream s)
{
    /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the current context's */
    return (uintptr_t)s <= 2 ? -1 : ct_device_of_stream(s);
}

#endif
