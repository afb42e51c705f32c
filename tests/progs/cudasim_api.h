/* cudasim_api.h - what the test programs know of the CUDA driver and NVML: hand-written
 * prototypes over native/include/cuda_abi.h (no cuda.h), and the one output format they share.
 *
 * Output: one line per memory operation, five fields separated by single spaces:
 *     OP API SIZE PTR RESULT
 *   OP      alloc | free | map | unmap | import | unimport | meminfo
 *   API     the exported driver symbol the program meant to call (cuMemAlloc_v2,
 *           cuMemAllocAsync_ptsz, ...; for NVML the NVML function)
 *   SIZE    bytes, decimal (meminfo: the total; "-" when that out-pointer was NULL)
 *   PTR     0x-prefixed hex pointer or handle (meminfo: the free bytes, decimal, or "-")
 *   RESULT  the CUresult / nvmlReturn_t, decimal
 * Other lines start with '#' (notes), "resolve"/"dlsym" (symbol lookups), or are a program's
 * documented status line (ready, done ..., ok ...).
 */
#ifndef CUDASIM_API_H
#define CUDASIM_API_H

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"

typedef unsigned int CUdeviceptr_v1;

#define CT_RUNTIME(...)
#define CT_NVML(...)
#define CUDASIM_PTSZ_DECL_0(ID, PROTO)
#define CUDASIM_PTSZ_DECL_1(ID, PROTO) CUresult ID##_ptsz PROTO;
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, OP, KIND, SPACE, PROTO, ...) \
    CUresult ID PROTO;                                                 \
    CUDASIM_PTSZ_DECL_##PTSZ(ID, PROTO)
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML

CUresult cuInit(unsigned int Flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult cuMemFree(CUdeviceptr_v1 dptr);
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphDestroy(CUgraph hGraph);

/* simulator-only (libcuda_sim.c) */
int cudasim_device_stats(int dev, unsigned long long *used, unsigned long long *hwm,
                         unsigned long long *total);
int cudasim_pid_stats(int dev, int index, int *pid, unsigned long long *used, unsigned long long *hwm);

/* NVML */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;
#define CUDASIM_NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* CUmemAccessDesc, for cuMemSetAccess */
typedef struct {
    CUmemLocation location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} CUmemAccessDesc;

#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ATTACH_GLOBAL 1
#define CU_AD_FORMAT_UNSIGNED_INT8 0x01
#define CU_AD_FORMAT_HALF 0x10
#define CU_AD_FORMAT_FLOAT 0x20

#define NOINLINE __attribute__((noinline, noclone))

static int g_failures; /* operations whose result was not CUDA_SUCCESS */

static inline void op_line(const char *op, const char *api, unsigned long long size, unsigned long long ptr,
                           int result)
{
    printf("%s %s %llu 0x%llx %d\n", op, api, size, ptr, result);
    fflush(stdout);
    if (result != 0)
        g_failures++;
}

static inline void meminfo_line(const char *api, const size_t *total, const size_t *freeb, int result)
{
    char t[32] = "-", f[32] = "-";
    if (total)
        snprintf(t, sizeof(t), "%llu", (unsigned long long)*total);
    if (freeb)
        snprintf(f, sizeof(f), "%llu", (unsigned long long)*freeb);
    printf("meminfo %s %s %s %d\n", api, t, f, result);
    fflush(stdout);
    if (result != 0)
        g_failures++;
}

static inline void note(const char *what, int result)
{
    printf("# %s %d\n", what, result);
    fflush(stdout);
    if (result != 0)
        g_failures++;
}

static inline unsigned long long parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    default: break;
    }
    return v;
}

#endif
