/* cuda_api_context.c - the simulated driver's exported API, part 1: init, version, devices,
 * contexts, streams, errors, cuGetProcAddress (sim_driver.h; libcuda_sim.c has the rest). */
#include "sim_driver.h"

/* ==== exported API ========================================================================= */

/* ---- init, version, devices --------------------------------------------------------------- */
CUresult cuInit(unsigned int Flags)
{
    COUNT(cuInit);
    setup();
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < g_ndev; d++)
        cudasim_reclaim_dead(g_st, d);
    __atomic_store_n(&g_initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    COUNT(cuDriverGetVersion);
    setup();
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = g_driver_version;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    SIM_ENTER(cuDeviceGetCount, 0);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    SIM_ENTER(cuDeviceGet, 0);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    SIM_ENTER(cuDeviceGetName, 0);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "cudasim %s device %d", g_integrated ? "integrated" : "discrete",
             dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    SIM_ENTER(cuDeviceTotalMem, 0);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t t = g_st->dev[dev].total;
    *bytes = t > 0xFFFFFFFFULL ? 0xFFFFFFFFU : (unsigned)t;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    SIM_ENTER(cuDeviceTotalMem_v2, 0);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_st->dev[dev].total;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
    SIM_ENTER(cuDeviceGetAttribute, 0);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pi = attrib == CU_DEVICE_ATTRIBUTE_INTEGRATED ? g_integrated : 0;
    return CUDA_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------------------------- */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    SIM_ENTER(cuDevicePrimaryCtxRetain, 0);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = ctx_touch(dev);
    if (r)
        return r;
    __atomic_fetch_add(&g_primary_refs[dev], 1, __ATOMIC_RELAXED);
    *pctx = &g_ctx[dev];
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev)
{
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    int cur = __atomic_load_n(&g_primary_refs[dev], __ATOMIC_RELAXED);
    do {
        if (cur <= 0)
            return CUDA_ERROR_INVALID_CONTEXT;
    } while (!__atomic_compare_exchange_n(&g_primary_refs[dev], &cur, cur - 1, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    SIM_ENTER(cuDevicePrimaryCtxRelease_v2, 0);
    return primary_release(dev);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    SIM_ENTER(cuDevicePrimaryCtxRelease, 0);
    return primary_release(dev);
}

/* the primary context's references dropped at once (its allocations stay: the sim does not
 * destroy a context's memory) */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    SIM_ENTER(cuDevicePrimaryCtxReset_v2, 0);
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    __atomic_store_n(&g_primary_refs[dev], 0, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

/* A created context is an object of its own on its device (libcuda_sim.c ctx_new); creating
 * one makes it current on the calling thread. */
static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = ctx_touch(dev);
    if (r)
        return r;
    CUcontext c = ctx_new(dev);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pctx = c;
    t_ctx = c;
    t_ctx_set = 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    SIM_ENTER(cuCtxCreate_v2, 0);
    return ctx_create(pctx, dev);
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    SIM_ENTER(cuCtxCreate, 0);
    return ctx_create(pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, const void *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev)
{
    SIM_ENTER(cuCtxCreate_v3, 0);
    return ctx_create(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, const void *ctxCreateParams, unsigned int flags,
                        CUdevice dev)
{
    SIM_ENTER(cuCtxCreate_v4, 0);
    return ctx_create(pctx, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    if (ctx_index(ctx) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (current_ctx() == ctx) {
        t_ctx = NULL;
        t_ctx_set = 1;
    }
    ctx_free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    SIM_ENTER(cuCtxDestroy_v2, 0);
    return ctx_destroy(ctx);
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    SIM_ENTER(cuCtxDestroy, 0);
    return ctx_destroy(ctx);
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    SIM_ENTER(cuCtxSetCurrent, 0);
    if (ctx && ctx_index(ctx) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = ctx;
    t_ctx_set = 1;
    return CUDA_SUCCESS;
}

/* the context stack of cuCtxPushCurrent / cuCtxPopCurrent: its top is the current context */
#define CTX_STACK 16
static __thread CUcontext t_pushed[CTX_STACK];
static __thread int t_npushed;

static CUresult ctx_push(CUcontext ctx)
{
    if (!ctx || ctx_index(ctx) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_npushed == CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    t_pushed[t_npushed++] = current_ctx();
    t_ctx = ctx;
    t_ctx_set = 1;
    return CUDA_SUCCESS;
}

static CUresult ctx_pop(CUcontext *pctx)
{
    if (!t_npushed)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx)
        *pctx = current_ctx();
    t_ctx = t_pushed[--t_npushed];
    t_ctx_set = 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    SIM_ENTER(cuCtxPushCurrent_v2, 0);
    return ctx_push(ctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    SIM_ENTER(cuCtxPopCurrent_v2, 0);
    return ctx_pop(pctx);
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    SIM_ENTER(cuCtxGetCurrent, 0);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_ctx();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    SIM_ENTER(cuCtxGetDevice, 0);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    *device = dev;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    SIM_ENTER(cuCtxGetDevice_v2, 0);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) {
        int dev;
        CUresult r = current_dev(&dev);
        if (r)
            return r;
        *device = dev;
        return CUDA_SUCCESS;
    }
    int i = ctx_index(ctx);
    if (i < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = i;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    SIM_ENTER(cuCtxSynchronize, 0);
    int dev;
    return current_dev(&dev);
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    SIM_ENTER(cuCtxSynchronize_v2, 0);
    if (ctx)
        return ctx_index(ctx) < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
    int dev;
    return current_dev(&dev);
}

/* ---- streams ------------------------------------------------------------------------------ */
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    SIM_ENTER(cuStreamCreate, 0);
    if (!phStream || Flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    uint64_t h;
    r = new_object(SP_STREAM, dev, &h);
    if (!r)
        *phStream = (CUstream)(uintptr_t)h;
    return r;
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    SIM_ENTER(cuStreamDestroy_v2, 0);
    return do_free(SP_STREAM, (uintptr_t)hStream, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE
                                                              : CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    SIM_ENTER(cuStreamDestroy, 0);
    return do_free(SP_STREAM, (uintptr_t)hStream, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE
                                                              : CUDA_SUCCESS;
}

/* the context of a stream: the one it was made in (the current one for the NULL, legacy and
 * per-thread streams) */
CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    SIM_ENTER(cuStreamGetCtx, 0);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if ((uintptr_t)hStream <= 2) {
        *pctx = current_ctx();
        return *pctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    int dev = object_dev(SP_STREAM, (uintptr_t)hStream);
    if (dev < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    *pctx = &g_ctx[dev];
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    SIM_ENTER(cuStreamSynchronize, 0);
    return valid_stream(hStream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    SIM_ENTER(cuStreamSynchronize_ptsz, 0);
    return valid_stream(hStream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- errors ------------------------------------------------------------------------------- */
static const struct {
    int code;
    const char *name, *text;
} g_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **pStr, int text)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(g_errors) / sizeof(g_errors[0]); i++)
        if (g_errors[i].code == error) {
            *pStr = text ? g_errors[i].text : g_errors[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    COUNT(cuGetErrorName);
    return error_lookup(error, pStr, 0);
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    COUNT(cuGetErrorString);
    return error_lookup(error, pStr, 1);
}

/* ---- cuGetProcAddress ---------------------------------------------------------------------
 * As measured on driver 580.159 (CUDA 13.0): a cudaVersion newer than the driver, or flags with
 * bits other than 1|2, return CUDA_ERROR_INVALID_VALUE and leave *pfn and the status untouched.
 * Otherwise *pfn is written: an unknown name gives NULL with SYMBOL_NOT_FOUND, a known name asked
 * at a version older than all its variants gives NULL with VERSION_NOT_SUFFICIENT; _v2 returns
 * CUDA_SUCCESS for both, v1 (which has no status) CUDA_ERROR_NOT_FOUND. (A NULL pfn crashes the
 * real driver; here it is CUDA_ERROR_INVALID_VALUE.) */
static CUresult gpa(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, int *status,
                    int v1)
{
    setup();
    if (!symbol || !pfn || (flags & ~(cuuint64_t)3) || cudaVersion > g_driver_version)
        return CUDA_ERROR_INVALID_VALUE;
    const struct gpa_row *best = NULL;
    int known = 0, st;
    for (size_t i = 0; i < gpa_nrows; i++) {
        const struct gpa_row *row = &gpa_rows[i];
        if (strcmp(row->base, symbol) != 0)
            continue;
        known = 1;
        if (row->minver <= cudaVersion && (!best || row->minver > best->minver))
            best = row;
    }
    if (!best) {
        *pfn = NULL;
        st = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                   : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    } else {
        *pfn = ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz) ? best->ptsz
                                                                                       : best->fn;
        st = CU_GET_PROC_ADDRESS_SUCCESS;
    }
    if (status)
        *status = st;
    if (st != CU_GET_PROC_ADDRESS_SUCCESS && v1)
        return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    COUNT(cuGetProcAddress);
    return gpa(symbol, pfn, cudaVersion, flags, NULL, 1);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    COUNT(cuGetProcAddress_v2);
    return gpa(symbol, pfn, cudaVersion, flags, symbolStatus, 0);
}

CUresult cuGetExportTable(const void **ppExportTable, const void *pExportTableId)
{
    COUNT(cuGetExportTable);
    if (ppExportTable)
        *ppExportTable = NULL;
    return CUDA_ERROR_NOT_FOUND;
}
