/* entry.h - the program's ways in (entry.c): the exported cuGetProcAddress[_v2] and dlsym.
 *
 *   1. exported driver symbols (programs linked with -lcuda, through their PLT) are the
 *      wrappers themselves (shim.c);
 *   2. dlsym(handle, "cuMemAlloc_v2"...): the wrapper is returned, the real pointer kept;
 *   3. cuGetProcAddress[_v2] (how the static and shared CUDA runtimes reach the driver): after
 *      the real call succeeds the wrapper of exactly the ABI variant asked for is handed back
 *      (base name + cudaVersion + per-thread flag), one real pointer per variant. */
#ifndef CUDATRACE_ENTRY_H
#define CUDATRACE_ENTRY_H

#include "cuda_abi.h"
#include "util.h"

CT_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags);
CT_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status);

#endif
