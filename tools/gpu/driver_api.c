/* driver_api.c - the CUDA driver API called directly (linked with -lcuda: calls go through the
 * PLT to exported symbols, not through cuGetProcAddress).
 *
 * Primary context: cuMemAlloc_v2 / cuMemFree_v2, cuMemGetInfo_v2, and the VMM path
 * (cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease).
 * Then a context of its own (cuCtxCreate) with one allocation in it.
 *
 * Prints gpu_common.h lines, plus
 *   map cuMemMap SIZE VA HANDLE
 *   unmap cuMemUnmap SIZE VA
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <string.h>

#include "gpu_common.h"

#define CK(call)                                                                            \
    do {                                                                                    \
        CUresult r_ = (call);                                                               \
        if (r_ != CUDA_SUCCESS) {                                                           \
            const char *n_ = "?";                                                           \
            cuGetErrorName(r_, &n_);                                                        \
            fprintf(stderr, "driver_api: %s failed at %s:%d: %s (%d)\n", #call, __FILE__,    \
                    __LINE__, n_, (int)r_);                                                 \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

#define MiB (1ull << 20)

/* cuCtxCreate changed ABI in CUDA 13 (cuCtxCreate_v4); a weak reference lets this program run
 * on a driver, or a test double, that lacks it: that section is then skipped. */
#if CUDA_VERSION >= 13000
extern CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev) __attribute__((weak));
#endif

NOINLINE CUdeviceptr drv_alloc_big(size_t size)
{
    CUdeviceptr p = 0;
    CK(cuMemAlloc(&p, size));
    gc_alloc("cuMemAlloc", size, (void *)(uintptr_t)p);
    return p;
}

NOINLINE CUdeviceptr drv_alloc_small(size_t size)
{
    CUdeviceptr p = 0;
    CK(cuMemAlloc(&p, size));
    gc_alloc("cuMemAlloc", size, (void *)(uintptr_t)p);
    return p;
}

NOINLINE void drv_free(CUdeviceptr p)
{
    CK(cuMemFree(p));
    gc_free("cuMemFree", (void *)(uintptr_t)p);
}

NOINLINE void drv_meminfo(void)
{
    size_t f = 0, t = 0;
    CK(cuMemGetInfo(&f, &t));
    gc_meminfo(f, t);
}

NOINLINE CUmemGenericAllocationHandle vmm_create_physical(CUdevice dev, size_t size)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h = 0;
    CK(cuMemCreate(&h, size, &prop, 0));
    gc_alloc("cuMemCreate", size, (void *)(uintptr_t)h);
    return h;
}

NOINLINE void vmm_section(CUdevice dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (!gran)
        gran = 2 * MiB;
    size_t size = (48 * MiB + gran - 1) / gran * gran;
    printf("info vmm_granularity %zu\n", gran);

    CUmemGenericAllocationHandle h = vmm_create_physical(dev, size);
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CK(cuMemMap(va, size, 0, h, 0));
    printf("map cuMemMap %zu 0x%llx 0x%llx\n", size, (unsigned long long)va, (unsigned long long)h);
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(va, size, &acc, 1));
#ifndef GPU_SIM /* the test double has no memset */
    CK(cuMemsetD8(va, 0, size));
#endif
    CK(cuCtxSynchronize());
    CK(cuMemUnmap(va, size));
    printf("unmap cuMemUnmap %zu 0x%llx\n", size, (unsigned long long)va);
    CK(cuMemRelease(h));
    gc_free("cuMemRelease", (void *)(uintptr_t)h);
    CK(cuMemAddressFree(va, size));
}

NOINLINE void own_context_section(CUdevice dev, CUcontext primary)
{
#if CUDA_VERSION >= 13000
    if (!cuCtxCreate_v4) {
        printf("info own_context skipped\n");
        return;
    }
    CUcontext c = NULL;
    CUctxCreateParams prm;
    memset(&prm, 0, sizeof prm);            /* no affinity, no CIG: a plain context */
    CK(cuCtxCreate_v4(&c, &prm, 0, dev));
#else
    CUcontext c = NULL;
    CK(cuCtxCreate(&c, 0, dev));
#endif
    CUdeviceptr p = drv_alloc_small(5 * MiB + 12288);
    drv_free(p);
    CK(cuCtxDestroy(c));
    CK(cuCtxSetCurrent(primary));
    printf("info own_context 1\n");
}

int main(void)
{
    gc_line_buffered();
    CK(cuInit(0));
    int ver = 0;
    CK(cuDriverGetVersion(&ver));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    printf("info driver_version %d\ninfo main_tid %lu\n", ver, gc_tid());

    drv_meminfo();
    CUdeviceptr big = drv_alloc_big(96 * MiB);
    CUdeviceptr a = drv_alloc_small(9 * MiB);
    CUdeviceptr b = drv_alloc_small(1 * MiB + 4096);
    drv_free(a);
    drv_free(b);
    vmm_section(dev);
    drv_meminfo();
    drv_free(big);
    own_context_section(dev, ctx);

    CK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
