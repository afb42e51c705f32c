/* cuda_abi.h - the few CUDA driver and NVML types cudatrace needs, declared by hand.
 *
 * The shim is built with a C compiler alone: no CUDA toolkit or headers (design principle 1).
 * Layouts follow cuda.h / nvml.h of CUDA 13 (LP64); tests/unit/test_abi.py checks the sizes and
 * offsets the shim relies on against the documented values, and against cuda.h itself where a
 * CUDA toolkit is installed.
 */
#ifndef CUDATRACE_CUDA_ABI_H
#define CUDATRACE_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUextMemory_st *CUexternalMemory;
typedef int CUmemAllocationHandleType;
typedef int CUdriverProcAddressQueryResult;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_PERMITTED 800

#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

#define CU_DEVICE_ATTRIBUTE_INTEGRATED 18

typedef struct {
    int type;
    int id;
} CUmemLocation;
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_LOCATION_TYPE_HOST 2
#define CU_MEM_LOCATION_TYPE_HOST_NUMA 3
#define CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 4
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_ALLOCATION_TYPE_MANAGED 2

typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef struct {
    CUmemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef struct {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    int type;
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_HANDLE_DESC;

typedef struct {
    char reserved[64];
} CUipcMemHandle;

/* NVML */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
#define NVML_SUCCESS 0
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
/* nvmlProcessInfo_v2_t: what nvmlDeviceGetComputeRunningProcesses_v3 fills (ctxhold.c reads a
 * process's own figure to measure its CUDA context) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

/* Bytes per element of a CUarray_format (channels multiply it). */
static inline unsigned ct_array_format_bytes(int fmt)
{
    switch (fmt) {
    case 0x01:
    case 0x08:
        return 1; /* UNSIGNED_INT8, SIGNED_INT8 */
    case 0x02:
    case 0x09:
    case 0x10:
        return 2; /* (U)INT16, HALF */
    case 0x03:
    case 0x0a:
    case 0x20:
        return 4; /* (U)INT32, FLOAT */
    default:
        return 4;
    }
}

#endif
