/* cuda_min.h - the few driver declarations the attribution shapes use (simulated driver). */
#ifndef ATTRIB_CUDA_MIN_H
#define ATTRIB_CUDA_MIN_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
#ifdef __cplusplus
}
#endif
#define ATTRIB_MiB ((size_t)1 << 20)
#endif
