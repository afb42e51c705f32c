/* libcuda_sim.c - a simulated CUDA driver (libcuda.so.1) for testing cudatrace without a GPU.
 *
 * Exports the driver surface the shim hooks (every CT_DRIVER of native/include/hooks.def, with the _ptsz
 * twins), the context/device basics a program needs, the old 32-bit ABI variants, and
 * cuGetProcAddress[_v2] with the real driver's variant selection. Device memory is accounted in
 * a state that all processes of a test share (sim_state.h), so budgets, meminfo and NVML behave
 * as they would on one real GPU. Device pointers are fake, never dereferenced; pinned host memory
 * is real.
 *
 * Built with -Wl,-Bsymbolic: the function pointers cuGetProcAddress hands out are always this
 * library's own, even when a preloaded library exports the same names (as a real driver does).
 *
 * Environment (read once, at first use):
 *   CUDASIM_STATE=path        shared state file (created on first use); unset: per-process state
 *   CUDASIM_DEVICES=n         devices (1..8, default 1)           } used when the state is
 *   CUDASIM_TOTAL_BYTES=n[,m] bytes per device (default 16 GiB)   } created
 *   CUDASIM_DRIVER_VERSION=v  cuDriverGetVersion; cuGetProcAddress refuses newer (default 13000)
 *   CUDASIM_INTEGRATED=0|1    CU_DEVICE_ATTRIBUTE_INTEGRATED; 1: pinned host memory counts as used
 *   CUDASIM_FAIL_NTH=n        the n-th allocation call of the process fails with OUT_OF_MEMORY
 *   CUDASIM_CALLS=path        at exit, append "pid symbol count" for every symbol called
 *   CUDASIM_STRICT_CONTEXT=1  no implicit context: after cuInit a thread has no current context
 *                             until it sets one (the real driver's CUDA_ERROR_INVALID_CONTEXT);
 *                             default: device 0's context is current on every thread
 *   CUDASIM_CTX_BYTES=n       bytes a context costs (default 0): charged to the process on a
 *                             device when it first creates/uses a context there, seen by
 *                             meminfo and NVML but by no hooked call (as a real context)
 *   CUDASIM_MEMINFO=path      integrated devices: a file in /proc/meminfo's format (MemTotal,
 *                             MemFree, MemAvailable) standing for the host's RAM when no device
 *                             memory is used; cuMemGetInfo then answers as a Jetson does:
 *                             free = MemFree - used by everyone (not MemAvailable: reclaimable
 *                             page cache is not free to the GPU), total = MemTotal
 *   CUDASIM_BACKED=1          device memory the process holds is real memory: a region of its
 *                             own address space is touched as it allocates and dropped as it
 *                             frees, so /proc shows it in RSS, PSS and MemAvailable (as on a
 *                             unified-memory device). Keep such tests small.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "sim_state.h"

#define SIM_EXPORT __attribute__((visibility("default")))

#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

#define GRANULARITY (2ULL << 20) /* VMM granularity and fake-pointer alignment */

typedef unsigned int CUdeviceptr_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

/* hooks.def also lists runtime and NVML functions: not the driver's business */
#define CT_RUNTIME(...)
#define CT_NVML(...)

/* ---- every exported driver function, declared from hooks.def so the compiler checks that the
 *      definitions below have exactly the hooked signatures ---------------------------------- */
#define SIM_PTSZ_DECL_0(ID, PROTO)
#define SIM_PTSZ_DECL_1(ID, PROTO) SIM_EXPORT CUresult ID##_ptsz PROTO;
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, OP, KIND, SPACE, PROTO, ...)                             \
    SIM_EXPORT CUresult ID PROTO;                                                                  \
    SIM_PTSZ_DECL_##PTSZ(ID, PROTO)
#include "hooks.def"
#undef CT_DRIVER

/* Functions the sim exports beyond hooks.def: X(symbol, base name, min cudaVersion, ptsz) */
#define SIM_EXTRA(X)                                                                               \
    X(cuInit, "cuInit", 2000, 0)                                                                   \
    X(cuDriverGetVersion, "cuDriverGetVersion", 2020, 0)                                           \
    X(cuDeviceGetCount, "cuDeviceGetCount", 2000, 0)                                               \
    X(cuDeviceGet, "cuDeviceGet", 2000, 0)                                                         \
    X(cuDeviceGetName, "cuDeviceGetName", 2000, 0)                                                 \
    X(cuDeviceTotalMem, "cuDeviceTotalMem", 2000, 0)                                               \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                                            \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000, 0)                                       \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)                               \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0)                             \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)                         \
    X(cuCtxCreate, "cuCtxCreate", 2000, 0)                                                         \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                                      \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                                     \
    X(cuCtxCreate_v4, "cuCtxCreate", 12080, 0)                                                     \
    X(cuCtxDestroy, "cuCtxDestroy", 2000, 0)                                                       \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                                                    \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0)                                                 \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", 4000, 0)                                                 \
    X(cuCtxGetDevice, "cuCtxGetDevice", 2000, 0)                                                   \
    X(cuCtxGetDevice_v2, "cuCtxGetDevice", 13000, 0)                                               \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000, 0)                                               \
    X(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, 0)                                           \
    X(cuStreamCreate, "cuStreamCreate", 2000, 0)                                                   \
    X(cuStreamDestroy, "cuStreamDestroy", 2000, 0)                                                 \
    X(cuStreamDestroy_v2, "cuStreamDestroy", 4000, 0)                                              \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000, 1)                                         \
    X(cuGetErrorName, "cuGetErrorName", 6000, 0)                                                   \
    X(cuGetErrorString, "cuGetErrorString", 6000, 0)                                               \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                                              \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                                           \
    X(cuGetExportTable, "cuGetExportTable", 3000, 0)                                               \
    X(cuMemAlloc, "cuMemAlloc", 2000, 0)                                                           \
    X(cuMemFree, "cuMemFree", 2000, 0)                                                             \
    X(cuMemGetInfo, "cuMemGetInfo", 2000, 0)                                                       \
    X(cuMemAllocHost, "cuMemAllocHost", 2000, 0)                                                   \
    X(cuMemAllocPitch, "cuMemAllocPitch", 2000, 0)                                                 \
    X(cuArrayCreate, "cuArrayCreate", 2000, 0)                                                     \
    X(cuArray3DCreate, "cuArray3DCreate", 2000, 0)                                                 \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, 0)                                           \
    X(cuMemAddressReserve, "cuMemAddressReserve", 10020, 0)                                        \
    X(cuMemAddressFree, "cuMemAddressFree", 10020, 0)                                              \
    X(cuMemSetAccess, "cuMemSetAccess", 10020, 0)                                                  \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020, 0)                    \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                                                \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0)                                              \
    X(cuGraphCreate, "cuGraphCreate", 10000, 0)                                                    \
    X(cuGraphDestroy, "cuGraphDestroy", 10000, 0)

SIM_EXPORT CUresult cuInit(unsigned int Flags);
SIM_EXPORT CUresult cuDriverGetVersion(int *driverVersion);
SIM_EXPORT CUresult cuDeviceGetCount(int *count);
SIM_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal);
SIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, const void *paramsArray, int numParams,
                                   unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, const void *ctxCreateParams, unsigned int flags,
                                   CUdevice dev);
SIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx);
SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx);
SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx);
SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx);
SIM_EXPORT CUresult cuCtxGetDevice(CUdevice *device);
SIM_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
SIM_EXPORT CUresult cuCtxSynchronize(void);
SIM_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx);
SIM_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
SIM_EXPORT CUresult cuStreamDestroy(CUstream hStream);
SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream);
SIM_EXPORT CUresult cuStreamSynchronize(CUstream hStream);
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream);
SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr);
SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr);
SIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags);
SIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                        cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus);
SIM_EXPORT CUresult cuGetExportTable(const void **ppExportTable, const void *pExportTableId);
SIM_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
SIM_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr);
SIM_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
SIM_EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize);
SIM_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch,
                                    unsigned int WidthInBytes, unsigned int Height,
                                    unsigned int ElementSizeBytes);
SIM_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d);
SIM_EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d);
SIM_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags);
SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags);
SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count);
SIM_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                  const CUmemAllocationProp *prop, int option);
SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool);
SIM_EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
SIM_EXPORT CUresult cuGraphDestroy(CUgraph hGraph);

/* test-only entry points (not CUDA; not in the cuGetProcAddress table) */
SIM_EXPORT int cudasim_device_stats(int dev, unsigned long long *used, unsigned long long *hwm,
                                    unsigned long long *total);
SIM_EXPORT int cudasim_pid_stats(int dev, int index, int *pid, unsigned long long *used,
                                 unsigned long long *hwm);
SIM_EXPORT int cudasim_reset_hwm(int dev);
SIM_EXPORT long cudasim_live_count(void);
SIM_EXPORT struct cudasim_state *cudasim_state_get(void);

/* ---- per-symbol call counters ------------------------------------------------------------- */
#define SIM_ENUM_PTSZ_0(ID)
#define SIM_ENUM_PTSZ_1(ID) SYM_##ID##_ptsz,
enum {
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, ...) SYM_##ID, SIM_ENUM_PTSZ_##PTSZ(ID)
#include "hooks.def"
#undef CT_DRIVER
#define X(ID, BASE, MINVER, PTSZ) SYM_##ID, SIM_ENUM_PTSZ_##PTSZ(ID)
    SIM_EXTRA(X)
#undef X
    SYM_COUNT
};

#define SIM_NAME_PTSZ_0(ID)
#define SIM_NAME_PTSZ_1(ID) #ID "_ptsz",
static const char *const sym_names[SYM_COUNT] = {
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, ...) #ID, SIM_NAME_PTSZ_##PTSZ(ID)
#include "hooks.def"
#undef CT_DRIVER
#define X(ID, BASE, MINVER, PTSZ) #ID, SIM_NAME_PTSZ_##PTSZ(ID)
    SIM_EXTRA(X)
#undef X
};

static uint64_t g_calls[SYM_COUNT];
#define COUNT(ID) __atomic_fetch_add(&g_calls[SYM_##ID], 1, __ATOMIC_RELAXED)

/* ---- cuGetProcAddress table: one row per ABI variant -------------------------------------- */
struct gpa_row {
    const char *base;
    int minver;
    const char *name;
    void *fn;
    void *ptsz; /* per-thread-default-stream twin, or NULL */
};
#define SIM_ROW_PTSZ_0(ID) NULL
#define SIM_ROW_PTSZ_1(ID) (void *)ID##_ptsz
static const struct gpa_row gpa_rows[] = {
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, ...)                                                     \
    {BASE, MINVER, #ID, (void *)ID, SIM_ROW_PTSZ_##PTSZ(ID)},
#include "hooks.def"
#undef CT_DRIVER
#define X(ID, BASE, MINVER, PTSZ) {BASE, MINVER, #ID, (void *)ID, SIM_ROW_PTSZ_##PTSZ(ID)},
    SIM_EXTRA(X)
#undef X
};

/* ---- process setup ------------------------------------------------------------------------ */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct cudasim_state *g_st;
static int g_ndev;
static int g_driver_version = 13000;
static int g_integrated;
static uint64_t g_fail_nth;
static uint64_t g_alloc_calls;
static uint64_t g_ctx_bytes;
static int g_strict_ctx;
static int g_backed;
static int g_initialized; /* cuInit called */

static void sim_atfork_prepare(void);
static void sim_atfork_parent(void);
static void sim_atfork_child(void);

/* Slots with our pid and start time belong to earlier images of this process (exec replaced
 * them without an exit): a real driver frees an image's memory when it goes. */
static void release_earlier_images(void)
{
    int pid = getpid();
    uint64_t start = cudasim_proc_start(pid, NULL);
    for (int dev = 0; dev < g_ndev; dev++) {
        struct cudasim_device *d = &g_st->dev[dev];
        for (int i = 0; i < CUDASIM_MAX_PIDS; i++) {
            struct cudasim_pid_slot *s = &d->pids[i];
            int32_t p = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
            if (p != pid || s->start_ticks != start ||
                !__atomic_compare_exchange_n(&s->pid, &p, -1, 0, __ATOMIC_ACQ_REL,
                                             __ATOMIC_RELAXED))
                continue;
            uint64_t u = __atomic_exchange_n(&s->used, 0, __ATOMIC_ACQ_REL);
            if (u) {
                __atomic_fetch_sub(&d->used, u, __ATOMIC_ACQ_REL);
                __atomic_fetch_add(&d->reclaimed, u, __ATOMIC_RELAXED);
            }
            s->hwm = 0;
            s->start_ticks = 0;
            __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
        }
    }
}

static void sim_setup(void)
{
    g_driver_version = (int)cudasim_env_ull("CUDASIM_DRIVER_VERSION", 13000);
    g_integrated = cudasim_env_ull("CUDASIM_INTEGRATED", 0) != 0;
    g_fail_nth = cudasim_env_ull("CUDASIM_FAIL_NTH", 0);
    g_ctx_bytes = cudasim_env_ull("CUDASIM_CTX_BYTES", 0);
    g_strict_ctx = cudasim_env_ull("CUDASIM_STRICT_CONTEXT", 0) != 0;
    g_backed = cudasim_env_ull("CUDASIM_BACKED", 0) != 0;
    g_st = cudasim_state_open("libcuda_sim");
    g_ndev = (int)g_st->ndevices;
    release_earlier_images();
    pthread_atfork(sim_atfork_prepare, sim_atfork_parent, sim_atfork_child);
}

static inline void setup(void) { pthread_once(&g_once, sim_setup); }

/* ---- contexts ----------------------------------------------------------------------------- */
struct CUctx_st {
    int dev;
};
static struct CUctx_st g_ctx[CUDASIM_MAX_DEVICES] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
static int g_primary_refs[CUDASIM_MAX_DEVICES];
static __thread CUcontext t_ctx;
static __thread int t_ctx_set;

static int ctx_index(CUcontext c)
{
    for (int i = 0; i < g_ndev; i++)
        if (c == &g_ctx[i])
            return i;
    return -1;
}

static CUcontext current_ctx(void)
{
    if (t_ctx_set)
        return t_ctx;
    return !g_strict_ctx && __atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE) ? &g_ctx[0] : NULL;
}

static CUresult ctx_touch(int dev);

/* Device of the calling thread's current context. */
static CUresult current_dev(int *dev)
{
    if (!__atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext c = current_ctx();
    int i = c ? ctx_index(c) : -1;
    if (i < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = ctx_touch(i);
    if (r)
        return r;
    *dev = i;
    return CUDA_SUCCESS;
}

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        setup();                                                                                   \
        if (!__atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE))                                    \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)

static int valid_dev(int dev) { return dev >= 0 && dev < g_ndev; }

/* ---- live objects of this process --------------------------------------------------------- */
enum {
    SP_DEV = 1, /* device pointers (incl. 32-bit ABI, managed, async, graph, IPC imports) */
    SP_HOST,    /* pinned host pointers */
    SP_ARRAY,
    SP_MIPMAP,
    SP_VMM, /* cuMemCreate / imported generic allocation handles */
    SP_EXTMEM,
    SP_POOL,
    SP_GRAPH,
    SP_STREAM,
};
enum {
    K_DEVICE = 1,
    K_PITCH,
    K_MANAGED,
    K_ASYNC,
    K_HOST,
    K_VMM,
    K_ARRAY,
    K_GRAPH,
    K_IMPORT,
    K_OBJ
};

struct ent {
    struct ent *next;
    uint64_t key;
    int space;
    int kind;
    int dev;
    int slotted;      /* charge went to this process's slot */
    uint64_t size;    /* nominal size */
    uint64_t charged; /* bytes counted toward the device's used */
    uint64_t aux;     /* graph of a graph allocation */
    int mapcount;     /* VMM: live mappings of this handle */
    int released;     /* VMM: cuMemRelease called while mapped */
};

struct range {
    struct range *next;
    uint64_t start, size;
    uint64_t handle; /* mappings: the handle */
};

#define NBUCKETS 4096
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ent *g_tab[NBUCKETS];
static long g_live;
static struct range *g_resv; /* address reservations */
static struct range *g_maps; /* VMM mappings */

static unsigned bucket(int space, uint64_t key)
{
    uint64_t h = (key ^ ((uint64_t)space << 56)) * 0x9E3779B97F4A7C15ULL;
    return (unsigned)(h >> 52) & (NBUCKETS - 1);
}

/* callers hold g_mu */
static struct ent *tab_find(int space, uint64_t key)
{
    for (struct ent *e = g_tab[bucket(space, key)]; e; e = e->next)
        if (e->space == space && e->key == key)
            return e;
    return NULL;
}

static void tab_insert(struct ent *e)
{
    unsigned b = bucket(e->space, e->key);
    e->next = g_tab[b];
    g_tab[b] = e;
    g_live++;
}

static void tab_unlink(struct ent *e)
{
    struct ent **pp = &g_tab[bucket(e->space, e->key)];
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = e->next;
        g_live--;
    }
}

/* ---- fake addresses and handles ----------------------------------------------------------- */
static uint64_t g_next_va = 0x100000000000ULL;
static uint64_t g_next_va32 = 0x10000000ULL;
static uint64_t g_next_handle = 0x200000000000ULL;

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static uint64_t va_alloc(uint64_t size, uint64_t align)
{
    if (align < GRANULARITY)
        align = GRANULARITY;
    uint64_t span = round_up(size ? size : 1, GRANULARITY) + GRANULARITY; /* + guard gap */
    uint64_t cur = __atomic_load_n(&g_next_va, __ATOMIC_RELAXED), start;
    do {
        start = round_up(cur, align);
    } while (!__atomic_compare_exchange_n(&g_next_va, &cur, start + span, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return start;
}

static uint64_t va32_alloc(uint64_t size)
{
    uint64_t span = round_up(size ? size : 1, GRANULARITY) + GRANULARITY;
    uint64_t cur = __atomic_load_n(&g_next_va32, __ATOMIC_RELAXED);
    do {
        if (cur + span > 0xFFFFFFFFULL)
            return 0;
    } while (!__atomic_compare_exchange_n(&g_next_va32, &cur, cur + span, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return cur;
}

static uint64_t new_handle(void)
{
    return __atomic_fetch_add(&g_next_handle, 0x100, __ATOMIC_RELAXED);
}

/* ---- device accounting -------------------------------------------------------------------- */
static pthread_mutex_t g_slot_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_slot_pid;                  /* pid g_slot[] belongs to */
static int g_slot[CUDASIM_MAX_DEVICES]; /* slot index + 1; 0: none yet; -1: none free */
static uint64_t g_unslotted[CUDASIM_MAX_DEVICES];
static int g_exited; /* the exit-time release ran: later frees have nothing to give back */
static uint64_t g_my_start;

/* This process's slot on dev, claimed on first use; NULL when all slots are taken. */
static struct cudasim_pid_slot *my_slot(int dev)
{
    struct cudasim_device *d = &g_st->dev[dev];
    int pid = getpid();
    pthread_mutex_lock(&g_slot_mu);
    if (g_slot_pid != pid) {
        memset(g_slot, 0, sizeof(g_slot));
        g_slot_pid = pid;
        g_my_start = cudasim_proc_start(pid, NULL);
    }
    int idx = g_slot[dev];
    if (idx == 0) {
        for (int pass = 0; pass < 2 && idx == 0; pass++) {
            for (int i = 0; i < CUDASIM_MAX_PIDS; i++) {
                struct cudasim_pid_slot *s = &d->pids[i];
                int32_t zero = 0;
                if (__atomic_compare_exchange_n(&s->pid, &zero, -1, 0, __ATOMIC_ACQ_REL,
                                                __ATOMIC_RELAXED)) {
                    s->start_ticks = g_my_start;
                    s->used = 0;
                    s->hwm = 0;
                    __atomic_store_n(&s->pid, pid, __ATOMIC_RELEASE);
                    idx = i + 1;
                    break;
                }
            }
            if (idx == 0 && pass == 0)
                cudasim_reclaim_dead(g_st, dev);
        }
        g_slot[dev] = idx ? idx : -1;
    }
    pthread_mutex_unlock(&g_slot_mu);
    return idx > 0 ? &d->pids[idx - 1] : NULL;
}

/* CUDASIM_BACKED: the process's device memory as real, touched pages of one region */
static pthread_mutex_t g_back_mu = PTHREAD_MUTEX_INITIALIZER;
static char *g_back;
static uint64_t g_back_size, g_back_used;

static void back_grow(uint64_t bytes)
{
    if (!g_backed || !bytes)
        return;
    pthread_mutex_lock(&g_back_mu);
    if (!g_back) {
        g_back_size = 64ULL << 30; /* address space only */
        void *p = mmap(NULL, g_back_size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        g_back = p == MAP_FAILED ? NULL : p;
    }
    if (g_back && g_back_used + bytes <= g_back_size) {
        memset(g_back + g_back_used, 0x5a, bytes);
        g_back_used += bytes;
    }
    pthread_mutex_unlock(&g_back_mu);
}

static void back_shrink(uint64_t bytes)
{
    if (!g_backed || !bytes)
        return;
    pthread_mutex_lock(&g_back_mu);
    if (g_back) {
        uint64_t take = bytes < g_back_used ? bytes : g_back_used;
        uint64_t lo = (g_back_used - take) & ~4095ULL; /* whole pages only */
        g_back_used -= take;
        if (lo < g_back_used + take)
            madvise(g_back + lo, ((g_back_used + take - lo) + 4095) & ~4095ULL, MADV_DONTNEED);
        if (g_back_used > lo)
            memset(g_back + lo, 0x5a, g_back_used - lo); /* keep the rest of that page */
    }
    pthread_mutex_unlock(&g_back_mu);
}

/* Count bytes toward dev's used; CUDA_ERROR_OUT_OF_MEMORY (nothing changed) if they do not fit. */
static CUresult charge(int dev, uint64_t bytes, int *slotted)
{
    struct cudasim_device *d = &g_st->dev[dev];
    uint64_t now;
    for (int attempt = 0;; attempt++) {
        uint64_t used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
        int ok = 0;
        for (;;) {
            if (bytes > d->total || used > d->total - bytes)
                break;
            if (__atomic_compare_exchange_n(&d->used, &used, used + bytes, 1, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                ok = 1;
                break;
            }
        }
        if (ok) {
            now = used + bytes;
            break;
        }
        if (attempt == 0 && cudasim_reclaim_dead(g_st, dev))
            continue;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    cudasim_atomic_max(&d->hwm, now);
    __atomic_fetch_add(&d->allocs, 1, __ATOMIC_RELAXED);
    back_grow(bytes);
    struct cudasim_pid_slot *s = my_slot(dev);
    if (s) {
        uint64_t mine = __atomic_add_fetch(&s->used, bytes, __ATOMIC_ACQ_REL);
        cudasim_atomic_max(&s->hwm, mine);
        *slotted = 1;
    } else {
        __atomic_fetch_add(&g_unslotted[dev], bytes, __ATOMIC_RELAXED);
        *slotted = 0;
    }
    return CUDA_SUCCESS;
}

static void uncharge(int dev, uint64_t bytes, int slotted)
{
    if (!bytes || __atomic_load_n(&g_exited, __ATOMIC_ACQUIRE))
        return;
    struct cudasim_device *d = &g_st->dev[dev];
    struct cudasim_pid_slot *s = slotted ? my_slot(dev) : NULL;
    if (s) {
        /* the slot may have been emptied by an exec-time or exit-time release */
        uint64_t cur = __atomic_load_n(&s->used, __ATOMIC_ACQUIRE), take;
        do {
            take = cur < bytes ? cur : bytes;
        } while (!__atomic_compare_exchange_n(&s->used, &cur, cur - take, 1, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE));
        if (take)
            __atomic_fetch_sub(&d->used, take, __ATOMIC_ACQ_REL);
        back_shrink(take);
    } else {
        uint64_t cur = __atomic_load_n(&g_unslotted[dev], __ATOMIC_ACQUIRE), take;
        do {
            take = cur < bytes ? cur : bytes;
        } while (!__atomic_compare_exchange_n(&g_unslotted[dev], &cur, cur - take, 1,
                                              __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
        if (take)
            __atomic_fetch_sub(&d->used, take, __ATOMIC_ACQ_REL);
        back_shrink(take);
    }
    __atomic_fetch_add(&d->frees, 1, __ATOMIC_RELAXED);
}

/* CUDASIM_CTX_BYTES: the first context use on a device costs memory no hook sees. */
static int g_ctx_charged[CUDASIM_MAX_DEVICES];

static CUresult ctx_touch(int dev)
{
    if (!g_ctx_bytes || __atomic_load_n(&g_ctx_charged[dev], __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_slot_mu);
    int done = g_ctx_charged[dev];
    g_ctx_charged[dev] = 1;
    pthread_mutex_unlock(&g_slot_mu);
    if (done)
        return CUDA_SUCCESS;
    int slotted;
    CUresult r = charge(dev, g_ctx_bytes, &slotted);
    if (r)
        __atomic_store_n(&g_ctx_charged[dev], 0, __ATOMIC_RELEASE);
    return r;
}

/* CUDASIM_FAIL_NTH: every allocation call passes here first. */
static int inject_failure(void)
{
    uint64_t n = __atomic_add_fetch(&g_alloc_calls, 1, __ATOMIC_RELAXED);
    return g_fail_nth && n == g_fail_nth;
}

/* Charge and record one allocation. key 0: make a fake device pointer (va32: in 32 bits). */
static CUresult do_alloc(int space, int kind, int dev, uint64_t size, uint64_t charge_bytes,
                         uint64_t key, int va32, uint64_t aux, uint64_t *out_key)
{
    int slotted = 0;
    if (charge_bytes) {
        CUresult r = charge(dev, charge_bytes, &slotted);
        if (r)
            return r;
    }
    if (!key) {
        key = va32 ? va32_alloc(size) : va_alloc(size, 0);
        if (!key) {
            uncharge(dev, charge_bytes, slotted);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    struct ent *e = calloc(1, sizeof(*e));
    if (!e) {
        uncharge(dev, charge_bytes, slotted);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->key = key;
    e->space = space;
    e->kind = kind;
    e->dev = dev;
    e->size = size;
    e->charged = charge_bytes;
    e->slotted = slotted;
    e->aux = aux;
    pthread_mutex_lock(&g_mu);
    tab_insert(e);
    pthread_mutex_unlock(&g_mu);
    *out_key = key;
    return CUDA_SUCCESS;
}

/* Remove a live object of `space` whose kind passes `accept`, giving its bytes back. */
static CUresult do_free(int space, uint64_t key, int (*accept)(const struct ent *), struct ent *out)
{
    pthread_mutex_lock(&g_mu);
    struct ent *e = tab_find(space, key);
    if (!e || (accept && !accept(e))) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    tab_unlink(e);
    pthread_mutex_unlock(&g_mu);
    uncharge(e->dev, e->charged, e->slotted);
    if (out)
        *out = *e;
    free(e);
    return CUDA_SUCCESS;
}

/* cuMemFree/cuMemFreeAsync: not imports, and not graph allocations (measured: the real driver
 * refuses those before the graph ran; here graphs never run) */
static int accept_freeable(const struct ent *e)
{
    return e->kind != K_IMPORT && e->kind != K_GRAPH;
}
static int accept_import(const struct ent *e) { return e->kind == K_IMPORT; }
static int accept_graph(const struct ent *e) { return e->kind == K_GRAPH; }

/* Streams the driver knows: NULL, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2), created ones. */
static int valid_stream(CUstream s)
{
    uintptr_t v = (uintptr_t)s;
    if (v <= 2)
        return 1;
    pthread_mutex_lock(&g_mu);
    int ok = tab_find(SP_STREAM, v) != NULL;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* Register an object with no memory (stream, pool, graph); returns its handle. */
static CUresult new_object(int space, int dev, uint64_t *out)
{
    struct ent *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->key = new_handle();
    e->space = space;
    e->kind = K_OBJ;
    e->dev = dev;
    pthread_mutex_lock(&g_mu);
    tab_insert(e);
    pthread_mutex_unlock(&g_mu);
    *out = e->key;
    return CUDA_SUCCESS;
}

static int object_dev(int space, uint64_t key)
{
    pthread_mutex_lock(&g_mu);
    struct ent *e = tab_find(space, key);
    int dev = e ? e->dev : -1;
    pthread_mutex_unlock(&g_mu);
    return dev;
}

/* ---- fork and exit ------------------------------------------------------------------------ */
static void sim_atfork_prepare(void)
{
    pthread_mutex_lock(&g_slot_mu);
    pthread_mutex_lock(&g_mu);
    pthread_mutex_lock(&g_back_mu);
}

static void sim_atfork_parent(void)
{
    pthread_mutex_unlock(&g_back_mu);
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_slot_mu);
}

/* A forked child is a new process to the driver: it owns none of its parent's memory, has its
 * own slot, its own call counters and its own CUDASIM_FAIL_NTH count. */
static void sim_atfork_child(void)
{
    for (unsigned b = 0; b < NBUCKETS; b++) {
        struct ent *e = g_tab[b];
        while (e) {
            struct ent *n = e->next;
            free(e);
            e = n;
        }
        g_tab[b] = NULL;
    }
    for (struct range *r = g_resv, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    for (struct range *r = g_maps, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    g_resv = g_maps = NULL;
    g_live = 0;
    memset(g_slot, 0, sizeof(g_slot));
    memset(g_unslotted, 0, sizeof(g_unslotted));
    g_slot_pid = 0;
    memset(g_calls, 0, sizeof(g_calls));
    memset(g_ctx_charged, 0, sizeof(g_ctx_charged));
    g_alloc_calls = 0;
    g_exited = 0;
    if (g_back && g_back_used)
        madvise(g_back, (g_back_used + 4095) & ~4095ULL, MADV_DONTNEED); /* the parent's */
    g_back_used = 0;
    pthread_mutex_init(&g_back_mu, NULL);
    pthread_mutex_init(&g_mu, NULL);
    pthread_mutex_init(&g_slot_mu, NULL);
}

__attribute__((destructor)) static void sim_fini(void)
{
    /* pthread_once has no query; the state pointer tells whether setup ran */
    if (!__atomic_load_n(&g_st, __ATOMIC_ACQUIRE))
        return;
    /* a process that exits gives its device memory back, as with a real driver */
    int pid = getpid();
    pthread_mutex_lock(&g_slot_mu);
    __atomic_store_n(&g_exited, 1, __ATOMIC_RELEASE);
    if (g_slot_pid == pid) {
        for (int dev = 0; dev < g_ndev; dev++) {
            struct cudasim_device *d = &g_st->dev[dev];
            if (g_slot[dev] > 0) {
                struct cudasim_pid_slot *s = &d->pids[g_slot[dev] - 1];
                int32_t p = pid;
                if (__atomic_compare_exchange_n(&s->pid, &p, -1, 0, __ATOMIC_ACQ_REL,
                                                __ATOMIC_RELAXED)) {
                    uint64_t u = __atomic_exchange_n(&s->used, 0, __ATOMIC_ACQ_REL);
                    if (u)
                        __atomic_fetch_sub(&d->used, u, __ATOMIC_ACQ_REL);
                    s->hwm = 0;
                    s->start_ticks = 0;
                    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
                }
            }
            uint64_t u = __atomic_exchange_n(&g_unslotted[dev], 0, __ATOMIC_ACQ_REL);
            if (u)
                __atomic_fetch_sub(&d->used, u, __ATOMIC_ACQ_REL);
            g_slot[dev] = 0;
            g_ctx_charged[dev] = 0;
        }
    }
    pthread_mutex_unlock(&g_slot_mu);

    const char *path = getenv("CUDASIM_CALLS");
    if (!path || !*path)
        return;
    size_t cap = 64 * SYM_COUNT + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return;
    for (int i = 0; i < SYM_COUNT; i++) {
        uint64_t n = __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
        if (n)
            len += (size_t)snprintf(buf + len, cap - len, "%d %s %llu\n", pid, sym_names[i],
                                    (unsigned long long)n);
    }
    if (len) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t w = write(fd, buf, len);
            (void)w;
            close(fd);
        }
    }
    free(buf);
}

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
    COUNT(cuDeviceGetCount);
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    COUNT(cuDeviceGet);
    NEED_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    COUNT(cuDeviceGetName);
    NEED_INIT();
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
    COUNT(cuDeviceTotalMem);
    NEED_INIT();
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
    COUNT(cuDeviceTotalMem_v2);
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_st->dev[dev].total;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
    COUNT(cuDeviceGetAttribute);
    NEED_INIT();
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
    COUNT(cuDevicePrimaryCtxRetain);
    NEED_INIT();
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
    COUNT(cuDevicePrimaryCtxRelease_v2);
    NEED_INIT();
    return primary_release(dev);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRelease);
    NEED_INIT();
    return primary_release(dev);
}

/* Every context of a device is the one static context of that device; creating one makes it
 * current on the calling thread. */
static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = ctx_touch(dev);
    if (r)
        return r;
    *pctx = &g_ctx[dev];
    t_ctx = &g_ctx[dev];
    t_ctx_set = 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    COUNT(cuCtxCreate_v2);
    NEED_INIT();
    return ctx_create(pctx, dev);
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    COUNT(cuCtxCreate);
    NEED_INIT();
    return ctx_create(pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, const void *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev)
{
    COUNT(cuCtxCreate_v3);
    NEED_INIT();
    return ctx_create(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, const void *ctxCreateParams, unsigned int flags,
                        CUdevice dev)
{
    COUNT(cuCtxCreate_v4);
    NEED_INIT();
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
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    COUNT(cuCtxDestroy_v2);
    NEED_INIT();
    return ctx_destroy(ctx);
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    COUNT(cuCtxDestroy);
    NEED_INIT();
    return ctx_destroy(ctx);
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    COUNT(cuCtxSetCurrent);
    NEED_INIT();
    if (ctx && ctx_index(ctx) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = ctx;
    t_ctx_set = 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    COUNT(cuCtxGetCurrent);
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_ctx();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    COUNT(cuCtxGetDevice);
    NEED_INIT();
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
    COUNT(cuCtxGetDevice_v2);
    NEED_INIT();
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
    COUNT(cuCtxSynchronize);
    NEED_INIT();
    int dev;
    return current_dev(&dev);
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    COUNT(cuCtxSynchronize_v2);
    NEED_INIT();
    if (ctx)
        return ctx_index(ctx) < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
    int dev;
    return current_dev(&dev);
}

/* ---- streams ------------------------------------------------------------------------------ */
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    COUNT(cuStreamCreate);
    NEED_INIT();
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
    COUNT(cuStreamDestroy_v2);
    NEED_INIT();
    return do_free(SP_STREAM, (uintptr_t)hStream, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE
                                                              : CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    COUNT(cuStreamDestroy);
    NEED_INIT();
    return do_free(SP_STREAM, (uintptr_t)hStream, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE
                                                              : CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    COUNT(cuStreamSynchronize);
    NEED_INIT();
    return valid_stream(hStream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    COUNT(cuStreamSynchronize_ptsz);
    NEED_INIT();
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
    for (size_t i = 0; i < sizeof(gpa_rows) / sizeof(gpa_rows[0]); i++) {
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

/* ---- device memory ------------------------------------------------------------------------ */
static CUresult alloc_dev(CUdeviceptr *dptr, uint64_t bytesize, int kind, int dev_or_cur)
{
    if (!dptr || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = dev_or_cur;
    if (dev < 0) {
        CUresult r = current_dev(&dev);
        if (r)
            return r;
    }
    uint64_t p;
    CUresult r = do_alloc(SP_DEV, kind, dev, bytesize, bytesize, 0, 0, 0, &p);
    if (!r)
        *dptr = p;
    return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    COUNT(cuMemAlloc_v2);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    return alloc_dev(dptr, bytesize, K_DEVICE, -1);
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    COUNT(cuMemAlloc);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!dptr || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    uint64_t p;
    r = do_alloc(SP_DEV, K_DEVICE, dev, bytesize, bytesize, 0, 1, 0, &p);
    if (!r)
        *dptr = (CUdeviceptr_v1)p;
    return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    COUNT(cuMemAllocPitch_v2);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!dptr || !pPitch || !WidthInBytes || !Height ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = round_up(WidthInBytes, 512);
    CUresult r = alloc_dev(dptr, pitch * Height, K_PITCH, -1);
    if (!r)
        *pPitch = pitch;
    return r;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    COUNT(cuMemAllocPitch);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!dptr || !pPitch || !WidthInBytes || !Height ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = round_up(WidthInBytes, 512), bytes = pitch * Height;
    if (pitch > 0xFFFFFFFFULL || bytes > 0xFFFFFFFFULL)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    uint64_t p;
    r = do_alloc(SP_DEV, K_PITCH, dev, bytes, bytes, 0, 1, 0, &p);
    if (!r) {
        *dptr = (CUdeviceptr_v1)p;
        *pPitch = (unsigned)pitch;
    }
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    COUNT(cuMemAllocManaged);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (flags != 1 && flags != 2) /* CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST */
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_dev(dptr, bytesize, K_MANAGED, -1);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    COUNT(cuMemFree_v2);
    NEED_INIT();
    if (!dptr)
        return CUDA_SUCCESS; /* like the real driver: freeing NULL is a no-op */
    return do_free(SP_DEV, dptr, accept_freeable, NULL);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    COUNT(cuMemFree);
    NEED_INIT();
    if (!dptr)
        return CUDA_SUCCESS;
    return do_free(SP_DEV, dptr, accept_freeable, NULL);
}

/* ---- stream-ordered ----------------------------------------------------------------------- */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!valid_stream(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    if (dptr && !bytesize) { /* measured: success with a NULL pointer */
        *dptr = 0;
        return CUDA_SUCCESS;
    }
    return alloc_dev(dptr, bytesize, K_ASYNC, -1);
}

static CUresult alloc_pool_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    int dev = object_dev(SP_POOL, (uintptr_t)pool);
    if (dev < 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_stream(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    if (dptr && !bytesize) {
        *dptr = 0;
        return CUDA_SUCCESS;
    }
    return alloc_dev(dptr, bytesize, K_ASYNC, dev);
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream)
{
    if (!valid_stream(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!dptr)
        return CUDA_SUCCESS; /* as measured */
    return do_free(SP_DEV, dptr, accept_freeable, NULL);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    COUNT(cuMemAllocAsync);
    NEED_INIT();
    return alloc_async(dptr, bytesize, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    COUNT(cuMemAllocAsync_ptsz);
    NEED_INIT();
    return alloc_async(dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    COUNT(cuMemAllocFromPoolAsync);
    NEED_INIT();
    return alloc_pool_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    COUNT(cuMemAllocFromPoolAsync_ptsz);
    NEED_INIT();
    return alloc_pool_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    COUNT(cuMemFreeAsync);
    NEED_INIT();
    return free_async(dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    COUNT(cuMemFreeAsync_ptsz);
    NEED_INIT();
    return free_async(dptr, hStream);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    COUNT(cuMemPoolCreate);
    NEED_INIT();
    if (!pool || !poolProps || poolProps->allocType != 1 || poolProps->location.type != 1 ||
        !valid_dev(poolProps->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    CUresult r = new_object(SP_POOL, poolProps->location.id, &h);
    if (!r)
        *pool = (CUmemoryPool)(uintptr_t)h;
    return r;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    COUNT(cuMemPoolDestroy);
    NEED_INIT();
    return do_free(SP_POOL, (uintptr_t)pool, NULL, NULL);
}

/* ---- virtual memory management ------------------------------------------------------------ */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       int option)
{
    COUNT(cuMemGetAllocationGranularity);
    NEED_INIT();
    if (!granularity || !prop || (option != 0 && option != 1))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    COUNT(cuMemCreate);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!handle || !prop || !size || size % GRANULARITY || flags != 0 || prop->type != 1 ||
        prop->location.type != 1 || !valid_dev(prop->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    CUresult r = do_alloc(SP_VMM, K_VMM, prop->location.id, size, size, new_handle(), 0, 0, &h);
    if (!r)
        *handle = h;
    return r;
}

/* Drop one reference to a VMM handle (release or unmap); gives the bytes back at the last. */
static void vmm_put_locked(struct ent *e, struct ent **to_free)
{
    if (e->released && e->mapcount == 0) {
        tab_unlink(e);
        *to_free = e;
    }
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    COUNT(cuMemRelease);
    NEED_INIT();
    struct ent *dead = NULL;
    pthread_mutex_lock(&g_mu);
    struct ent *e = tab_find(SP_VMM, handle);
    if (!e || e->released) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    e->released = 1;
    vmm_put_locked(e, &dead);
    pthread_mutex_unlock(&g_mu);
    if (dead) {
        uncharge(dead->dev, dead->charged, dead->slotted);
        free(dead);
    }
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    COUNT(cuMemAddressReserve);
    NEED_INIT();
    if (!ptr || !size || size % GRANULARITY || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    struct range *r = calloc(1, sizeof(*r));
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r->start = va_alloc(size, alignment);
    r->size = size;
    pthread_mutex_lock(&g_mu);
    r->next = g_resv;
    g_resv = r;
    pthread_mutex_unlock(&g_mu);
    *ptr = r->start;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    COUNT(cuMemAddressFree);
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    for (struct range **pp = &g_resv; *pp; pp = &(*pp)->next) {
        struct range *r = *pp;
        if (r->start == ptr && r->size == size) {
            *pp = r->next;
            pthread_mutex_unlock(&g_mu);
            free(r);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    COUNT(cuMemMap);
    NEED_INIT();
    if (!ptr || !size || size % GRANULARITY || offset % GRANULARITY || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct range *m = calloc(1, sizeof(*m));
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    struct ent *e = tab_find(SP_VMM, handle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (!e || e->released || (e->kind != K_IMPORT && offset + size > e->size))
        goto out;
    int inside = 0;
    for (struct range *v = g_resv; v; v = v->next)
        if (ptr >= v->start && ptr + size <= v->start + v->size)
            inside = 1;
    if (!inside)
        goto out;
    for (struct range *v = g_maps; v; v = v->next)
        if (ptr < v->start + v->size && v->start < ptr + size)
            goto out; /* overlaps a mapping */
    m->start = ptr;
    m->size = size;
    m->handle = handle;
    m->next = g_maps;
    g_maps = m;
    e->mapcount++;
    m = NULL;
    r = CUDA_SUCCESS;
out:
    pthread_mutex_unlock(&g_mu);
    free(m);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    COUNT(cuMemUnmap);
    NEED_INIT();
    if (!ptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    struct ent *dead[64];
    int ndead = 0, found = 0;
    pthread_mutex_lock(&g_mu);
    /* every mapping the range touches must lie wholly inside it */
    for (struct range *v = g_maps; v; v = v->next)
        if (ptr < v->start + v->size && v->start < ptr + size) {
            if (v->start < ptr || v->start + v->size > ptr + size) {
                pthread_mutex_unlock(&g_mu);
                return CUDA_ERROR_INVALID_VALUE;
            }
            found++;
        }
    if (!found) {
        /* the real driver accepts unmapping a reserved range that holds no mapping */
        int reserved = 0;
        for (struct range *v = g_resv; v; v = v->next)
            if (ptr >= v->start && ptr + size <= v->start + v->size)
                reserved = 1;
        pthread_mutex_unlock(&g_mu);
        return reserved ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    for (struct range **pp = &g_maps; *pp;) {
        struct range *v = *pp;
        if (v->start >= ptr && v->start + v->size <= ptr + size) {
            *pp = v->next;
            struct ent *e = tab_find(SP_VMM, v->handle);
            if (e) {
                e->mapcount--;
                struct ent *d = NULL;
                vmm_put_locked(e, &d);
                if (d && ndead < 64)
                    dead[ndead++] = d;
            }
            free(v);
        } else {
            pp = &v->next;
        }
    }
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < ndead; i++) {
        uncharge(dead[i]->dev, dead[i]->charged, dead[i]->slotted);
        free(dead[i]);
    }
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count)
{
    COUNT(cuMemSetAccess);
    NEED_INIT();
    if (!ptr || !size || !desc || !count)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* ---- pinned host memory ------------------------------------------------------------------- */
static CUresult host_alloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (!pp || (Flags & ~7u))
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    if (!bytesize) { /* measured: success with a NULL pointer */
        *pp = NULL;
        return CUDA_SUCCESS;
    }
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytesize) != 0 || !p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t key;
    r = do_alloc(SP_HOST, K_HOST, dev, bytesize, g_integrated ? bytesize : 0, (uintptr_t)p, 0, 0,
                 &key);
    if (r) {
        free(p);
        return r;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    COUNT(cuMemHostAlloc);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    return host_alloc(pp, bytesize, Flags);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    COUNT(cuMemAllocHost_v2);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    COUNT(cuMemAllocHost);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemFreeHost(void *p)
{
    COUNT(cuMemFreeHost);
    NEED_INIT();
    if (!p)
        return CUDA_SUCCESS; /* measured */
    CUresult r = do_free(SP_HOST, (uintptr_t)p, NULL, NULL);
    if (!r)
        free(p);
    return r;
}

/* ---- arrays ------------------------------------------------------------------------------- */
static uint64_t array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch, unsigned levels)
{
    uint64_t total = 0;
    for (unsigned i = 0; i < levels; i++) {
        uint64_t lw = w >> i, lh = h >> i, ld = d >> i;
        if (lw < 1)
            lw = 1;
        if (lh < 1)
            lh = 1;
        if (ld < 1)
            ld = 1;
        total += lw * lh * ld * ch * ct_array_format_bytes(fmt);
    }
    return total;
}

static int valid_channels(unsigned ch) { return ch == 1 || ch == 2 || ch == 4; }

static CUresult array_create(int space, void *pHandle, uint64_t bytes)
{
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    uint64_t h;
    r = do_alloc(space, K_ARRAY, dev, bytes, bytes, new_handle(), 0, 0, &h);
    if (!r)
        *(void **)pHandle = (void *)(uintptr_t)h;
    return r;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    COUNT(cuArrayCreate_v2);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 1));
}

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    COUNT(cuArrayCreate);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 1));
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    COUNT(cuArray3DCreate_v2);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1));
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    COUNT(cuArray3DCreate);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1));
}

CUresult cuArrayDestroy(CUarray hArray)
{
    COUNT(cuArrayDestroy);
    NEED_INIT();
    return do_free(SP_ARRAY, (uintptr_t)hArray, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE
                                                            : CUDA_SUCCESS;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels)
{
    COUNT(cuMipmappedArrayCreate);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels) || numMipmapLevels > 64)
        return CUDA_ERROR_INVALID_VALUE;
    /* the real driver accepts 0 levels: counted as 1 */
    return array_create(SP_MIPMAP, pHandle,
                        array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                                    numMipmapLevels ? numMipmapLevels : 1));
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    COUNT(cuMipmappedArrayDestroy);
    NEED_INIT();
    return do_free(SP_MIPMAP, (uintptr_t)h, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

/* ---- graphs ------------------------------------------------------------------------------- */
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    COUNT(cuGraphCreate);
    NEED_INIT();
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    CUresult r = new_object(SP_GRAPH, -1, &h);
    if (!r)
        *phGraph = (CUgraph)(uintptr_t)h;
    return r;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    COUNT(cuGraphDestroy);
    NEED_INIT();
    CUresult r = do_free(SP_GRAPH, (uintptr_t)hGraph, NULL, NULL);
    if (r)
        return r;
    /* allocations of the graph's memory nodes that no free node took: the graph never ran, so
     * they go with it */
    struct ent *dead = NULL;
    pthread_mutex_lock(&g_mu);
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct ent *e = g_tab[b], *n; e; e = n) {
            n = e->next;
            if (e->space == SP_DEV && e->kind == K_GRAPH && e->aux == (uintptr_t)hGraph) {
                tab_unlink(e);
                e->next = dead;
                dead = e;
            }
        }
    pthread_mutex_unlock(&g_mu);
    for (struct ent *e = dead, *n; e; e = n) {
        n = e->next;
        uncharge(e->dev, e->charged, e->slotted);
        free(e);
    }
    return CUDA_SUCCESS;
}

static int graph_ok(CUgraph g, const CUgraphNode *deps, size_t n)
{
    pthread_mutex_lock(&g_mu);
    int ok = g && tab_find(SP_GRAPH, (uintptr_t)g) != NULL;
    pthread_mutex_unlock(&g_mu);
    return ok && (n == 0 || deps);
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    COUNT(cuGraphAddMemAllocNode);
    NEED_INIT();
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!phGraphNode || !nodeParams || !nodeParams->bytesize ||
        !graph_ok(hGraph, dependencies, numDependencies) || nodeParams->poolProps.allocType != 1 ||
        nodeParams->poolProps.location.type != 1 || !valid_dev(nodeParams->poolProps.location.id))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p;
    CUresult r = do_alloc(SP_DEV, K_GRAPH, nodeParams->poolProps.location.id, nodeParams->bytesize,
                          nodeParams->bytesize, 0, 0, (uintptr_t)hGraph, &p);
    if (r)
        return r;
    nodeParams->dptr = p;
    *phGraphNode = (CUgraphNode)(uintptr_t)new_handle();
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr)
{
    COUNT(cuGraphAddMemFreeNode);
    NEED_INIT();
    if (!phGraphNode || !dptr || !graph_ok(hGraph, dependencies, numDependencies))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = do_free(SP_DEV, dptr, accept_graph, NULL);
    if (!r)
        *phGraphNode = (CUgraphNode)(uintptr_t)new_handle();
    return r;
}

/* ---- imports (never counted: another process or API paid for the memory) ----------------- */
static CUresult ipc_open(CUdeviceptr *pdptr, unsigned int Flags)
{
    if (!pdptr || Flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    uint64_t p;
    r = do_alloc(SP_DEV, K_IMPORT, dev, GRANULARITY, 0, 0, 0, 0, &p);
    if (!r)
        *pdptr = p;
    return r;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    COUNT(cuIpcOpenMemHandle_v2);
    NEED_INIT();
    return ipc_open(pdptr, Flags);
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    COUNT(cuIpcOpenMemHandle);
    NEED_INIT();
    return ipc_open(pdptr, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    COUNT(cuIpcCloseMemHandle);
    NEED_INIT();
    return do_free(SP_DEV, dptr, accept_import, NULL);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    COUNT(cuMemImportFromShareableHandle);
    NEED_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    uint64_t h;
    r = do_alloc(SP_VMM, K_IMPORT, dev, 0, 0, new_handle(), 0, 0, &h);
    if (!r)
        *handle = h;
    return r;
}

CUresult cuImportExternalMemory(CUexternalMemory *extMem_out,
                                const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *memHandleDesc)
{
    COUNT(cuImportExternalMemory);
    NEED_INIT();
    if (!extMem_out || !memHandleDesc || !memHandleDesc->size)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    uint64_t h;
    r = do_alloc(SP_EXTMEM, K_IMPORT, dev, memHandleDesc->size, 0, new_handle(), 0, 0, &h);
    if (!r)
        *extMem_out = (CUexternalMemory)(uintptr_t)h;
    return r;
}

CUresult cuDestroyExternalMemory(CUexternalMemory extMem)
{
    COUNT(cuDestroyExternalMemory);
    NEED_INIT();
    return do_free(SP_EXTMEM, (uintptr_t)extMem, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE
                                                             : CUDA_SUCCESS;
}

/* ---- meminfo ------------------------------------------------------------------------------ */
/* CUDASIM_MEMINFO: MemTotal and MemFree of the simulated host, in bytes; 0 if not set */
static int sim_meminfo(uint64_t *total, uint64_t *freeb)
{
    const char *path = getenv("CUDASIM_MEMINFO");
    if (!path || !*path)
        return 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256];
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kib;
        if (sscanf(line, "MemTotal: %llu", &kib) == 1) {
            *total = kib << 10;
            got |= 1;
        } else if (sscanf(line, "MemFree: %llu", &kib) == 1) {
            *freeb = kib << 10;
            got |= 2;
        }
    }
    fclose(f);
    return got == 3;
}

static CUresult meminfo(uint64_t *freep, uint64_t *totalp)
{
    int dev;
    CUresult r = current_dev(&dev);
    if (r)
        return r;
    cudasim_reclaim_dead(g_st, dev);
    struct cudasim_device *d = &g_st->dev[dev];
    uint64_t used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    *totalp = d->total;
    *freep = used < d->total ? d->total - used : 0;
    uint64_t mtotal, mfree;
    if (g_integrated && sim_meminfo(&mtotal, &mfree)) {
        *totalp = mtotal;
        *freep = mfree > used ? mfree - used : 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    COUNT(cuMemGetInfo_v2);
    NEED_INIT();
    uint64_t f, t;
    CUresult r = meminfo(&f, &t);
    if (r)
        return r;
    if (free)
        *free = f;
    if (total)
        *total = t;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    COUNT(cuMemGetInfo);
    NEED_INIT();
    uint64_t f, t;
    CUresult r = meminfo(&f, &t);
    if (r)
        return r;
    if (free)
        *free = f > 0xFFFFFFFFULL ? 0xFFFFFFFFU : (unsigned)f;
    if (total)
        *total = t > 0xFFFFFFFFULL ? 0xFFFFFFFFU : (unsigned)t;
    return CUDA_SUCCESS;
}

/* ---- test-only ---------------------------------------------------------------------------- */
int cudasim_device_stats(int dev, unsigned long long *used, unsigned long long *hwm,
                         unsigned long long *total)
{
    setup();
    if (!valid_dev(dev))
        return -1;
    struct cudasim_device *d = &g_st->dev[dev];
    cudasim_reclaim_dead(g_st, dev);
    if (used)
        *used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    if (hwm)
        *hwm = __atomic_load_n(&d->hwm, __ATOMIC_ACQUIRE);
    if (total)
        *total = d->total;
    return 0;
}

int cudasim_pid_stats(int dev, int index, int *pid, unsigned long long *used,
                      unsigned long long *hwm)
{
    setup();
    if (!valid_dev(dev) || index < 0 || index >= CUDASIM_MAX_PIDS)
        return -1;
    struct cudasim_pid_slot *s = &g_st->dev[dev].pids[index];
    int p = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    if (p <= 0)
        return 0;
    if (pid)
        *pid = p;
    if (used)
        *used = __atomic_load_n(&s->used, __ATOMIC_ACQUIRE);
    if (hwm)
        *hwm = __atomic_load_n(&s->hwm, __ATOMIC_ACQUIRE);
    return 1;
}

int cudasim_reset_hwm(int dev)
{
    setup();
    if (!valid_dev(dev))
        return -1;
    struct cudasim_device *d = &g_st->dev[dev];
    __atomic_store_n(&d->hwm, __atomic_load_n(&d->used, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    return 0;
}

long cudasim_live_count(void)
{
    setup();
    pthread_mutex_lock(&g_mu);
    long n = g_live;
    pthread_mutex_unlock(&g_mu);
    return n;
}

struct cudasim_state *cudasim_state_get(void)
{
    setup();
    return g_st;
}
