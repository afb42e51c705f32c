/* device.c - the device of a call (device.h): the calling thread's current context's (a
 * thread's answer kept while its context stays and the epoch does not move), a stream's, a
 * context's. */
#include "device.h"

#include "cuda_abi.h"
#include "route.h"
#include "util.h"

CUresult (*ct_device_get_ctx)(CUcontext *); /* device.h */
static CUresult (*get_dev)(CUdevice *);

/* A context's device never changes, but a context can end and its handle come back as another
 * device's context: every call that may end one (hooks.def CT_OP_CTX_END) moves the epoch
 * first, and a thread drops what it learned in an earlier epoch. */
uint32_t ct_device_epoch; /* device.h */

void ct_device_ctx_ends(void) { __atomic_add_fetch(&ct_device_epoch, 1, __ATOMIC_ACQ_REL); }

static inline void ctx_answers_check(void)
{
    uint32_t now = __atomic_load_n(&ct_device_epoch, __ATOMIC_ACQUIRE);
    if (__builtin_expect(ct_thr.ctx_epoch != now, 0)) {
        ct_thr.dev_ctx = ct_thr.sdev_ctx = 0;
        ct_thr.ctx_epoch = now;
    }
}
/* looked up by the first threads to need them, perhaps several at once: atomics, relaxed for
 * get_ctx (get_dev's release store publishes it) */
static void device_syms(void)
{
    __atomic_store_n(&ct_device_get_ctx, (CUresult(*)(CUcontext *))ct_driver_sym("cuCtxGetCurrent"),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&get_dev, (CUresult(*)(CUdevice *))ct_driver_sym("cuCtxGetDevice"),
                     __ATOMIC_RELEASE);
}

int ct_device_current_slow(void)
{
    CUresult (*gd)(CUdevice *) = __atomic_load_n(&get_dev, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!gd, 0)) {
        device_syms();
        gd = __atomic_load_n(&get_dev, __ATOMIC_ACQUIRE);
    }
    ctx_answers_check();
    CUcontext ctx = NULL;
    CUresult (*gc)(CUcontext *) = __atomic_load_n(&ct_device_get_ctx, __ATOMIC_RELAXED);
    if (gc && gc(&ctx) == CUDA_SUCCESS && ctx && (uintptr_t)ctx == ct_thr.dev_ctx)
        return ct_thr.dev;
    CUdevice d = -1;
    if (!gd || gd(&d) != CUDA_SUCCESS)
        return -1;
    ct_thr.dev_ctx = (uintptr_t)ctx;
    ct_thr.dev = d;
    return d;
}

/* The device of context ctx, which need not be current: cuCtxGetDevice_v2 where the driver has
 * it (CUDA 13), else ctx made current for the question and the thread's own put back. -1: the
 * driver could not say. */
static int context_device(CUcontext ctx)
{
    static CUresult (*get_dev2)(CUdevice *, CUcontext);
    static CUresult (*push)(CUcontext), (*pop)(CUcontext *);
    static int looked; /* several threads may look them up at once: atomics, relaxed */
    if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&get_dev2,
                         (CUresult(*)(CUdevice *, CUcontext))ct_driver_sym("cuCtxGetDevice_v2"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&push, (CUresult(*)(CUcontext))ct_driver_sym("cuCtxPushCurrent_v2"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&pop, (CUresult(*)(CUcontext *))ct_driver_sym("cuCtxPopCurrent_v2"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    CUresult (*gd2)(CUdevice *, CUcontext) = __atomic_load_n(&get_dev2, __ATOMIC_RELAXED);
    CUresult (*gd)(CUdevice *) = __atomic_load_n(&get_dev, __ATOMIC_ACQUIRE);
    CUresult (*pu)(CUcontext) = __atomic_load_n(&push, __ATOMIC_RELAXED);
    CUresult (*po)(CUcontext *) = __atomic_load_n(&pop, __ATOMIC_RELAXED);
    CUdevice d = -1;
    if (gd2)
        return gd2(&d, ctx) == CUDA_SUCCESS ? d : -1;
    if (!gd || !pu || !po || pu(ctx) != CUDA_SUCCESS)
        return -1;
    CUresult r = gd(&d);
    CUcontext back;
    po(&back);
    return r == CUDA_SUCCESS ? d : -1;
}

/* A stream's device (device.h: stream_device): cuStreamGetCtx costs what cuCtxGetCurrent does,
 * and is allowed while the stream is being captured; the thread remembers the device of the last
 * other context. */
int ct_device_of_stream(CUstream s)
{
    static CUresult (*get_sctx)(CUstream, CUcontext *);
    static int looked;
    if (__builtin_expect(!__atomic_load_n(&looked, __ATOMIC_ACQUIRE), 0)) {
        if (!__atomic_load_n(&get_dev, __ATOMIC_ACQUIRE))
            device_syms();
        __atomic_store_n(&get_sctx,
                         (CUresult(*)(CUstream, CUcontext *))ct_driver_sym("cuStreamGetCtx"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    ctx_answers_check();
    CUcontext ctx = NULL;
    CUresult (*gs)(CUstream, CUcontext *) = __atomic_load_n(&get_sctx, __ATOMIC_RELAXED);
    if (!gs || gs(s, &ctx) != CUDA_SUCCESS || !ctx)
        return -1;
    if ((uintptr_t)ctx == ct_thr.dev_ctx)
        return ct_thr.dev;
    if ((uintptr_t)ctx == ct_thr.sdev_ctx)
        return ct_thr.sdev;
    int d = context_device(ctx);
    if (d >= 0) {
        ct_thr.sdev_ctx = (uintptr_t)ctx;
        ct_thr.sdev = d;
    }
    return d;
}
