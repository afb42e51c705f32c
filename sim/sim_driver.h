/* sim_driver.h - what the simulated driver's files share (libcuda_sim.c, cuda_api_*.c): the
 * exported surface, the per-symbol counters, the prologue of every exported function, the live
 * objects' table and the accounting of device memory. Private to sim/. */
#ifndef CUDASIM_DRIVER_H
#define CUDASIM_DRIVER_H
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
#define SIM_INTERNAL __attribute__((visibility("hidden"))) /* shared by sim/'s files alone */

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
    X(cuDriverGetVersion, "cuDriverGetVersion", 2020, 0)                                           \
    X(cuDeviceGetCount, "cuDeviceGetCount", 2000, 0)                                               \
    X(cuDeviceGet, "cuDeviceGet", 2000, 0)                                                         \
    X(cuDeviceGetName, "cuDeviceGetName", 2000, 0)                                                 \
    X(cuDeviceTotalMem, "cuDeviceTotalMem", 2000, 0)                                               \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                                            \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000, 0)                                       \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)                               \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0)                             \
    X(cuCtxCreate, "cuCtxCreate", 2000, 0)                                                         \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                                      \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                                     \
    X(cuCtxCreate_v4, "cuCtxCreate", 12080, 0)                                                     \
    X(cuCtxDestroy, "cuCtxDestroy", 2000, 0)                                                       \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0)                                                 \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", 4000, 0)                                                 \
    X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, 0)                                            \
    X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, 0)                                              \
    X(cuCtxGetDevice, "cuCtxGetDevice", 2000, 0)                                                   \
    X(cuCtxGetDevice_v2, "cuCtxGetDevice", 13000, 0)                                               \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000, 0)                                               \
    X(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, 0)                                           \
    X(cuStreamCreate, "cuStreamCreate", 2000, 0)                                                   \
    X(cuStreamDestroy, "cuStreamDestroy", 2000, 0)                                                 \
    X(cuStreamDestroy_v2, "cuStreamDestroy", 4000, 0)                                              \
    X(cuStreamGetCtx, "cuStreamGetCtx", 9020, 0)                                                   \
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
    X(cuGraphCreate, "cuGraphCreate", 10000, 0)                                                    \
    X(cuGraphDestroy, "cuGraphDestroy", 10000, 0)

SIM_EXPORT CUresult cuDriverGetVersion(int *driverVersion);
SIM_EXPORT CUresult cuDeviceGetCount(int *count);
SIM_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal);
SIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
SIM_EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, const void *paramsArray, int numParams,
                                   unsigned int flags, CUdevice dev);
SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, const void *ctxCreateParams, unsigned int flags,
                                   CUdevice dev);
SIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx);
SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx);
SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx);
SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx);
SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
SIM_EXPORT CUresult cuCtxGetDevice(CUdevice *device);
SIM_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
SIM_EXPORT CUresult cuCtxSynchronize(void);
SIM_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx);
SIM_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
SIM_EXPORT CUresult cuStreamDestroy(CUstream hStream);
SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream);
SIM_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx);
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

/* ---- what libcuda_sim.c keeps for the API files ------------------------------------------ */
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
#define COUNT(ID) __atomic_fetch_add(&g_calls[SYM_##ID], 1, __ATOMIC_RELAXED)
struct gpa_row {
    const char *base;
    int minver;
    const char *name;
    void *fn;
    void *ptsz; /* per-thread-default-stream twin, or NULL */
};

#define SIM_ROW_PTSZ_0(ID) NULL
#define SIM_ROW_PTSZ_1(ID) (void *)ID##_ptsz
struct CUctx_st {
    int dev;
};

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        setup();                                                                                   \
        if (!__atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE))                                    \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)
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

/* ---- libcuda_sim.c's state and helpers the API files use ---------------------------------- */
SIM_INTERNAL void sim_setup(void);
SIM_INTERNAL int ctx_index(CUcontext c);
SIM_INTERNAL CUcontext ctx_new(int dev); /* a created context (NULL: too many) */
SIM_INTERNAL int ctx_free(CUcontext c);  /* 1: it was a created context, now freed */
SIM_INTERNAL CUresult ctx_touch(int dev);
SIM_INTERNAL CUcontext current_ctx(void);
SIM_INTERNAL CUresult current_dev(int *dev);
SIM_INTERNAL CUresult do_free(int space, uint64_t key, int (*accept)(const struct ent *),
                              struct ent *out);
SIM_INTERNAL CUresult new_object(int space, int dev, uint64_t *out);
SIM_INTERNAL int valid_dev(int dev);
SIM_INTERNAL int valid_stream(CUstream s);
SIM_INTERNAL CUresult do_alloc(int space, int kind, int dev, uint64_t size, uint64_t charge_bytes,
                               uint64_t key, int va32, uint64_t aux, uint64_t *out_key);
SIM_INTERNAL int inject_failure(void);
SIM_INTERNAL uint64_t new_handle(void);
SIM_INTERNAL int object_dev(int space, uint64_t key);
SIM_INTERNAL uint64_t round_up(uint64_t v, uint64_t a);
SIM_INTERNAL struct ent *tab_find(int space, uint64_t key);
SIM_INTERNAL void tab_unlink(struct ent *e);
SIM_INTERNAL void uncharge(int dev, uint64_t bytes, int slotted);
SIM_INTERNAL uint64_t va_alloc(uint64_t size, uint64_t align);
SIM_INTERNAL int accept_freeable(const struct ent *e);
SIM_INTERNAL int accept_graph(const struct ent *e);
SIM_INTERNAL int accept_import(const struct ent *e);
extern SIM_INTERNAL uint64_t g_calls[SYM_COUNT];
extern SIM_INTERNAL struct CUctx_st g_ctx[CUDASIM_MAX_DEVICES];
extern SIM_INTERNAL int g_driver_version;
extern SIM_INTERNAL int g_initialized;
extern SIM_INTERNAL int g_integrated;
extern SIM_INTERNAL int g_ndev;
extern SIM_INTERNAL pthread_once_t g_once;
extern SIM_INTERNAL int g_primary_refs[CUDASIM_MAX_DEVICES];
extern SIM_INTERNAL struct cudasim_state *g_st;
extern SIM_INTERNAL const struct gpa_row gpa_rows[];
extern SIM_INTERNAL const size_t gpa_nrows;
extern SIM_INTERNAL __thread CUcontext t_ctx;
extern SIM_INTERNAL __thread int t_ctx_set;
extern SIM_INTERNAL long g_live;
extern SIM_INTERNAL struct range *g_maps;
extern SIM_INTERNAL pthread_mutex_t g_mu;
extern SIM_INTERNAL struct range *g_resv;
extern SIM_INTERNAL struct ent *g_tab[NBUCKETS];

/* every exported function's first step: the simulator's state, once */
static inline void setup(void) { pthread_once(&g_once, sim_setup); }

/* The prologue of every exported driver function: count the call (CUDASIM_CALLS), answer
 * CUDA_ERROR_NOT_INITIALIZED before cuInit and, for an allocating one (SIM_MAY_FAIL), fail the
 * process's CUDASIM_FAIL_NTH-th allocating call with out-of-memory. */
#define SIM_MAY_FAIL 1
#define SIM_ENTER(ID, FAILS)                                                                       \
    do {                                                                                           \
        COUNT(ID);                                                                                 \
        NEED_INIT();                                                                               \
        if ((FAILS) && inject_failure())                                                           \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                       \
    } while (0)

#endif
