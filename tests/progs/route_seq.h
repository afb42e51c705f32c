/* route_seq.h - the allocation sequence shared by route_link.c, route_dlsym.c and route_gpa.c.
 *
 * The including file defines how a driver function is reached:
 *   ROUTE_LINK: direct calls by exported name (PLT, program linked with -lcuda);
 *   otherwise:  through pointers p_<symbol>, filled by the file's route_resolve().
 * Every operation is its own non-inlined function (do_alloc_device, do_free_device, ...) so a
 * recorded stack's return address lands in a named function. Sizes are distinct (MiB counts 11..21).
 *
 * Output (cudasim_api.h format), in this order:
 *   # setup notes
 *   meminfo cuMemGetInfo_v2 T F 0                    (before anything)
 *   alloc cuMemAlloc_v2 11534336 P 0
 *   alloc cuMemAllocPitch_v2 1228800 P 0             (1000 x 1200, pitch 1024; "# pitch 1024")
 *   alloc cuMemAllocManaged 13631488 P 0
 *   alloc cuMemAllocAsync[_ptsz] 14680064 P 0
 *   alloc cuMemAllocFromPoolAsync[_ptsz] 15728640 P 0
 *   alloc cuMemCreate 16777216 H 0
 *   map cuMemMap 16777216 VA 0                       (into a 32 MiB reservation)
 *   free cuMemRelease 16777216 H 0                   (while mapped: memory stays in use)
 *   alloc cuMemHostAlloc 17825792 P 0
 *   alloc cuMemAllocHost_v2 18874368 P 0
 *   alloc cuArrayCreate_v2 4915200 H 0               (640 x 480, FLOAT x 4)
 *   alloc cuArray3DCreate_v2 786432 H 0              (96 x 64 x 32, HALF x 2)
 *   alloc cuMipmappedArrayCreate 344064 H 0          (256 x 256, UINT8 x 4, 3 levels)
 *   alloc cuGraphAddMemAllocNode 19922944 P 0
 *   meminfo cuMemGetInfo_v2 T F 0                    (everything live)
 *   meminfo cuMemGetInfo_v2 T - 0                    (free NULL)
 *   meminfo cuMemGetInfo_v2 - F 0                    (total NULL)
 *   meminfo cuMemGetInfo_v2 - - 0                    (both NULL)
 *   free cuGraphAddMemFreeNode 19922944 P 0
 *   free cuMipmappedArrayDestroy 344064 H 0
 *   free cuArrayDestroy 786432 H 0
 *   free cuArrayDestroy 4915200 H 0
 *   free cuMemFreeHost 18874368 P 0
 *   free cuMemFreeHost 17825792 P 0
 *   unmap cuMemUnmap 16777216 VA 0                   (last mapping: the memory goes back)
 *   free cuMemFreeAsync[_ptsz] 15728640 P 0
 *   free cuMemFreeAsync[_ptsz] 14680064 P 0
 *   free cuMemFree_v2 13631488 P 0
 *   free cuMemFree_v2 1228800 P 0
 *   free cuMemFree_v2 11534336 P 0
 *   import cuIpcOpenMemHandle_v2 0 P 0
 *   unimport cuIpcCloseMemHandle 0 P 0
 *   import cuMemImportFromShareableHandle 0 H 0
 *   free cuMemRelease 0 H 0
 *   import cuImportExternalMemory 22020096 H 0
 *   unimport cuDestroyExternalMemory 22020096 H 0
 *   [route_gpa --old-abi: alloc cuMemAlloc 20971520 P 0 / free cuMemFree 20971520 P 0]
 *   meminfo cuMemGetInfo_v2 T F 0                    (at the end: as at the start)
 *   # teardown notes
 * Exit status 0 when every call returned CUDA_SUCCESS, else 1.
 */
#ifndef ROUTE_SEQ_H
#define ROUTE_SEQ_H

#include "cudasim_api.h"

/* X(symbol, base name, cudaVersion that introduced this ABI, has a _ptsz twin, cudaVersion
 *   route_gpa asks by default: 13000, except where CUDA 13 brought a new ABI of the function
 *   (cuCtxGetDevice_v2 takes a context) and the program calls the older one) */
#define ROUTE_FUNCS(X)                                                        \
    X(cuInit, "cuInit", 2000, 0, 13000)                                              \
    X(cuDeviceGet, "cuDeviceGet", 2000, 0, 13000)                                    \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0, 13000)          \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0, 13000)    \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0, 13000)                            \
    X(cuCtxGetDevice, "cuCtxGetDevice", 2000, 0, 12000)                              \
    X(cuStreamCreate, "cuStreamCreate", 2000, 0, 13000)                              \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000, 0, 13000)                    \
    X(cuStreamDestroy_v2, "cuStreamDestroy", 4000, 0, 13000)                         \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0, 13000)                                   \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0, 13000)                         \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0, 13000)                        \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 1, 13000)                           \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 1, 13000)           \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 1, 13000)                             \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0, 13000)                           \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0, 13000)                         \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020, 0, 13000) \
    X(cuMemCreate, "cuMemCreate", 10020, 0, 13000)                                   \
    X(cuMemAddressReserve, "cuMemAddressReserve", 10020, 0, 13000)                   \
    X(cuMemMap, "cuMemMap", 10020, 0, 13000)                                         \
    X(cuMemSetAccess, "cuMemSetAccess", 10020, 0, 13000)                             \
    X(cuMemRelease, "cuMemRelease", 10020, 0, 13000)                                 \
    X(cuMemUnmap, "cuMemUnmap", 10020, 0, 13000)                                     \
    X(cuMemAddressFree, "cuMemAddressFree", 10020, 0, 13000)                         \
    X(cuMemHostAlloc, "cuMemHostAlloc", 2020, 0, 13000)                              \
    X(cuMemAllocHost_v2, "cuMemAllocHost", 3020, 0, 13000)                           \
    X(cuMemFreeHost, "cuMemFreeHost", 2000, 0, 13000)                                \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0, 13000)                             \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0, 13000)                         \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0, 13000)                              \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0, 13000)              \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0, 13000)            \
    X(cuGraphCreate, "cuGraphCreate", 10000, 0, 13000)                               \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, 0, 13000)             \
    X(cuGraphAddMemFreeNode, "cuGraphAddMemFreeNode", 11040, 0, 13000)               \
    X(cuGraphDestroy, "cuGraphDestroy", 10000, 0, 13000)                             \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0, 13000)                               \
    X(cuMemFree_v2, "cuMemFree", 3020, 0, 13000)                                     \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, 0, 13000)                  \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, 0, 13000)                    \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, 0, 13000) \
    X(cuImportExternalMemory, "cuImportExternalMemory", 10000, 0, 13000)             \
    X(cuDestroyExternalMemory, "cuDestroyExternalMemory", 10000, 0, 13000)

static int g_ptsz; /* stream-ordered calls use the per-thread-default-stream variants */

#ifdef ROUTE_LINK
#define F(sym) sym
#define STREAM_CALL(r, sym, args) \
    do {                          \
        if (g_ptsz)               \
            r = sym##_ptsz args;  \
        else                      \
            r = sym args;         \
    } while (0)
#else
#define X(sym, base, minver, ptsz, ask) static __typeof__(&sym) p_##sym;
ROUTE_FUNCS(X)
#undef X
#define F(sym) p_##sym
#define STREAM_CALL(r, sym, args) r = p_##sym args
#endif
#define STREAM_API(sym) (g_ptsz ? #sym "_ptsz" : #sym)

#define SZ_DEVICE (11ULL << 20)
#define PITCH_WIDTH 1000
#define PITCH_HEIGHT 1200
#define SZ_MANAGED (13ULL << 20)
#define SZ_ASYNC (14ULL << 20)
#define SZ_POOL (15ULL << 20)
#define SZ_VMM (16ULL << 20)
#define SZ_RESERVE (32ULL << 20)
#define SZ_HOSTALLOC (17ULL << 20)
#define SZ_ALLOCHOST (18ULL << 20)
#define SZ_GRAPH (19ULL << 20)
#define SZ_OLD (20ULL << 20)
#define SZ_EXTMEM (21ULL << 20)

static CUdevice g_dev;
static CUcontext g_ctx;
static CUstream g_stream;
static CUmemoryPool g_pool;
static CUgraph g_graph;

static CUdeviceptr g_p_device, g_p_pitch, g_p_managed, g_p_async, g_p_pool, g_p_graph, g_va, g_p_ipc;
static size_t g_pitch;
static CUmemGenericAllocationHandle g_vmm, g_imported;
static void *g_h_hostalloc, *g_h_allochost;
static CUarray g_arr2d, g_arr3d;
static CUmipmappedArray g_mip;
static CUexternalMemory g_ext;
static unsigned long long g_sz_arr2d, g_sz_arr3d, g_sz_mip;

static CUDA_ARRAY_DESCRIPTOR g_desc2d = {640, 480, CU_AD_FORMAT_FLOAT, 4};
static CUDA_ARRAY3D_DESCRIPTOR g_desc3d = {96, 64, 32, CU_AD_FORMAT_HALF, 2, 0};
static CUDA_ARRAY3D_DESCRIPTOR g_descmip = {256, 256, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
#define MIP_LEVELS 3

static unsigned long long seq_array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch, unsigned levels)
{
    unsigned long long t = 0;
    for (unsigned i = 0; i < levels; i++) {
        unsigned long long lw = w >> i, lh = h >> i, ld = d >> i;
        t += (lw ? lw : 1) * (lh ? lh : 1) * (ld ? ld : 1) * ch * ct_array_format_bytes(fmt);
    }
    return t;
}

NOINLINE void do_setup(void)
{
    note("cuInit", F(cuInit)(0));
    note("cuDeviceGet", F(cuDeviceGet)(&g_dev, 0));
    note("cuDevicePrimaryCtxRetain", F(cuDevicePrimaryCtxRetain)(&g_ctx, g_dev));
    note("cuCtxSetCurrent", F(cuCtxSetCurrent)(g_ctx));
    CUdevice d = -1;
    note("cuCtxGetDevice", F(cuCtxGetDevice)(&d));
    printf("# device %d\n", d);
    note("cuStreamCreate", F(cuStreamCreate)(&g_stream, 0));
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof(pp));
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = g_dev;
    note("cuMemPoolCreate", F(cuMemPoolCreate)(&g_pool, &pp));
    note("cuGraphCreate", F(cuGraphCreate)(&g_graph, 0));
}

NOINLINE void do_meminfo(void)
{
    size_t f = 0, t = 0;
    CUresult r = F(cuMemGetInfo_v2)(&f, &t);
    meminfo_line("cuMemGetInfo_v2", &t, &f, r);
}

NOINLINE void do_meminfo_null(void)
{
    size_t f = 0, t = 0;
    CUresult r = F(cuMemGetInfo_v2)(NULL, &t);
    meminfo_line("cuMemGetInfo_v2", &t, NULL, r);
    r = F(cuMemGetInfo_v2)(&f, NULL);
    meminfo_line("cuMemGetInfo_v2", NULL, &f, r);
    r = F(cuMemGetInfo_v2)(NULL, NULL);
    meminfo_line("cuMemGetInfo_v2", NULL, NULL, r);
}

NOINLINE void do_alloc_device(void)
{
    CUresult r = F(cuMemAlloc_v2)(&g_p_device, SZ_DEVICE);
    op_line("alloc", "cuMemAlloc_v2", SZ_DEVICE, g_p_device, r);
}

NOINLINE void do_alloc_pitch(void)
{
    CUresult r = F(cuMemAllocPitch_v2)(&g_p_pitch, &g_pitch, PITCH_WIDTH, PITCH_HEIGHT, 4);
    printf("# pitch %zu\n", g_pitch);
    op_line("alloc", "cuMemAllocPitch_v2", (unsigned long long)g_pitch * PITCH_HEIGHT, g_p_pitch, r);
}

NOINLINE void do_alloc_managed(void)
{
    CUresult r = F(cuMemAllocManaged)(&g_p_managed, SZ_MANAGED, CU_MEM_ATTACH_GLOBAL);
    op_line("alloc", "cuMemAllocManaged", SZ_MANAGED, g_p_managed, r);
}

NOINLINE void do_alloc_async(void)
{
    CUresult r;
    STREAM_CALL(r, cuMemAllocAsync, (&g_p_async, SZ_ASYNC, g_stream));
    op_line("alloc", STREAM_API(cuMemAllocAsync), SZ_ASYNC, g_p_async, r);
}

NOINLINE void do_alloc_pool(void)
{
    CUresult r;
    STREAM_CALL(r, cuMemAllocFromPoolAsync, (&g_p_pool, SZ_POOL, g_pool, g_stream));
    op_line("alloc", STREAM_API(cuMemAllocFromPoolAsync), SZ_POOL, g_p_pool, r);
}

NOINLINE void do_vmm_create(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g_dev;
    size_t gran = 0;
    note("cuMemGetAllocationGranularity", F(cuMemGetAllocationGranularity)(&gran, &prop, 0));
    printf("# granularity %zu\n", gran);
    CUresult r = F(cuMemCreate)(&g_vmm, SZ_VMM, &prop, 0);
    op_line("alloc", "cuMemCreate", SZ_VMM, g_vmm, r);
}

NOINLINE void do_vmm_map(void)
{
    CUresult r = F(cuMemAddressReserve)(&g_va, SZ_RESERVE, 0, 0, 0);
    printf("# reserve 0x%llx %llu\n", (unsigned long long)g_va, SZ_RESERVE);
    note("cuMemAddressReserve", r);
    r = F(cuMemMap)(g_va, SZ_VMM, 0, g_vmm, 0);
    op_line("map", "cuMemMap", SZ_VMM, g_va, r);
    CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, g_dev}, 3};
    note("cuMemSetAccess", F(cuMemSetAccess)(g_va, SZ_VMM, &ad, 1));
}

NOINLINE void do_vmm_release(void)
{
    CUresult r = F(cuMemRelease)(g_vmm);
    op_line("free", "cuMemRelease", SZ_VMM, g_vmm, r);
}

NOINLINE void do_alloc_hostalloc(void)
{
    CUresult r = F(cuMemHostAlloc)(&g_h_hostalloc, SZ_HOSTALLOC, 0);
    if (!r) { /* pinned host memory is real: write all of it */
        memset(g_h_hostalloc, 0xab, SZ_HOSTALLOC);
    }
    op_line("alloc", "cuMemHostAlloc", SZ_HOSTALLOC, (uintptr_t)g_h_hostalloc, r);
}

NOINLINE void do_alloc_allochost(void)
{
    CUresult r = F(cuMemAllocHost_v2)(&g_h_allochost, SZ_ALLOCHOST);
    if (!r)
        memset(g_h_allochost, 0xcd, SZ_ALLOCHOST);
    op_line("alloc", "cuMemAllocHost_v2", SZ_ALLOCHOST, (uintptr_t)g_h_allochost, r);
}

NOINLINE void do_alloc_array2d(void)
{
    g_sz_arr2d = seq_array_bytes(g_desc2d.Width, g_desc2d.Height, 0, g_desc2d.Format, g_desc2d.NumChannels, 1);
    CUresult r = F(cuArrayCreate_v2)(&g_arr2d, &g_desc2d);
    op_line("alloc", "cuArrayCreate_v2", g_sz_arr2d, (uintptr_t)g_arr2d, r);
}

NOINLINE void do_alloc_array3d(void)
{
    g_sz_arr3d = seq_array_bytes(g_desc3d.Width, g_desc3d.Height, g_desc3d.Depth, g_desc3d.Format,
                                 g_desc3d.NumChannels, 1);
    CUresult r = F(cuArray3DCreate_v2)(&g_arr3d, &g_desc3d);
    op_line("alloc", "cuArray3DCreate_v2", g_sz_arr3d, (uintptr_t)g_arr3d, r);
}

NOINLINE void do_alloc_mipmap(void)
{
    g_sz_mip = seq_array_bytes(g_descmip.Width, g_descmip.Height, g_descmip.Depth, g_descmip.Format,
                               g_descmip.NumChannels, MIP_LEVELS);
    CUresult r = F(cuMipmappedArrayCreate)(&g_mip, &g_descmip, MIP_LEVELS);
    op_line("alloc", "cuMipmappedArrayCreate", g_sz_mip, (uintptr_t)g_mip, r);
}

NOINLINE void do_alloc_graph(void)
{
    CUDA_MEM_ALLOC_NODE_PARAMS np;
    memset(&np, 0, sizeof(np));
    np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.poolProps.location.id = g_dev;
    np.bytesize = SZ_GRAPH;
    CUgraphNode node = NULL;
    CUresult r = F(cuGraphAddMemAllocNode)(&node, g_graph, NULL, 0, &np);
    g_p_graph = r ? 0 : np.dptr;
    op_line("alloc", "cuGraphAddMemAllocNode", SZ_GRAPH, g_p_graph, r);
}

NOINLINE void do_free_graph(void)
{
    CUgraphNode node = NULL;
    CUresult r = F(cuGraphAddMemFreeNode)(&node, g_graph, NULL, 0, g_p_graph);
    op_line("free", "cuGraphAddMemFreeNode", SZ_GRAPH, g_p_graph, r);
}

NOINLINE void do_free_mipmap(void)
{
    CUresult r = F(cuMipmappedArrayDestroy)(g_mip);
    op_line("free", "cuMipmappedArrayDestroy", g_sz_mip, (uintptr_t)g_mip, r);
}

NOINLINE void do_free_array3d(void)
{
    CUresult r = F(cuArrayDestroy)(g_arr3d);
    op_line("free", "cuArrayDestroy", g_sz_arr3d, (uintptr_t)g_arr3d, r);
}

NOINLINE void do_free_array2d(void)
{
    CUresult r = F(cuArrayDestroy)(g_arr2d);
    op_line("free", "cuArrayDestroy", g_sz_arr2d, (uintptr_t)g_arr2d, r);
}

NOINLINE void do_free_allochost(void)
{
    CUresult r = F(cuMemFreeHost)(g_h_allochost);
    op_line("free", "cuMemFreeHost", SZ_ALLOCHOST, (uintptr_t)g_h_allochost, r);
}

NOINLINE void do_free_hostalloc(void)
{
    CUresult r = F(cuMemFreeHost)(g_h_hostalloc);
    op_line("free", "cuMemFreeHost", SZ_HOSTALLOC, (uintptr_t)g_h_hostalloc, r);
}

NOINLINE void do_vmm_unmap(void)
{
    CUresult r = F(cuMemUnmap)(g_va, SZ_VMM);
    op_line("unmap", "cuMemUnmap", SZ_VMM, g_va, r);
    note("cuMemAddressFree", F(cuMemAddressFree)(g_va, SZ_RESERVE));
}

NOINLINE void do_free_pool(void)
{
    CUresult r;
    STREAM_CALL(r, cuMemFreeAsync, (g_p_pool, g_stream));
    op_line("free", STREAM_API(cuMemFreeAsync), SZ_POOL, g_p_pool, r);
}

NOINLINE void do_free_async(void)
{
    CUresult r;
    STREAM_CALL(r, cuMemFreeAsync, (g_p_async, g_stream));
    op_line("free", STREAM_API(cuMemFreeAsync), SZ_ASYNC, g_p_async, r);
    note("cuStreamSynchronize", F(cuStreamSynchronize)(g_stream));
}

NOINLINE void do_free_managed(void)
{
    CUresult r = F(cuMemFree_v2)(g_p_managed);
    op_line("free", "cuMemFree_v2", SZ_MANAGED, g_p_managed, r);
}

NOINLINE void do_free_pitch(void)
{
    CUresult r = F(cuMemFree_v2)(g_p_pitch);
    op_line("free", "cuMemFree_v2", (unsigned long long)g_pitch * PITCH_HEIGHT, g_p_pitch, r);
}

NOINLINE void do_free_device(void)
{
    CUresult r = F(cuMemFree_v2)(g_p_device);
    op_line("free", "cuMemFree_v2", SZ_DEVICE, g_p_device, r);
}

NOINLINE void do_imports(void)
{
    CUipcMemHandle ih;
    memset(&ih, 0x5a, sizeof(ih));
    CUresult r = F(cuIpcOpenMemHandle_v2)(&g_p_ipc, ih, 1);
    op_line("import", "cuIpcOpenMemHandle_v2", 0, g_p_ipc, r);
    r = F(cuIpcCloseMemHandle)(g_p_ipc);
    op_line("unimport", "cuIpcCloseMemHandle", 0, g_p_ipc, r);

    r = F(cuMemImportFromShareableHandle)(&g_imported, (void *)(uintptr_t)7, 1);
    op_line("import", "cuMemImportFromShareableHandle", 0, g_imported, r);
    r = F(cuMemRelease)(g_imported);
    op_line("free", "cuMemRelease", 0, g_imported, r);

    CUDA_EXTERNAL_MEMORY_HANDLE_DESC ed;
    memset(&ed, 0, sizeof(ed));
    ed.type = 1; /* CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD */
    ed.handle.fd = 7;
    ed.size = SZ_EXTMEM;
    r = F(cuImportExternalMemory)(&g_ext, &ed);
    op_line("import", "cuImportExternalMemory", SZ_EXTMEM, (uintptr_t)g_ext, r);
    r = F(cuDestroyExternalMemory)(g_ext);
    op_line("unimport", "cuDestroyExternalMemory", SZ_EXTMEM, (uintptr_t)g_ext, r);
}

NOINLINE void do_teardown(void)
{
    note("cuGraphDestroy", F(cuGraphDestroy)(g_graph));
    note("cuMemPoolDestroy", F(cuMemPoolDestroy)(g_pool));
    note("cuStreamDestroy_v2", F(cuStreamDestroy_v2)(g_stream));
    note("cuDevicePrimaryCtxRelease_v2", F(cuDevicePrimaryCtxRelease_v2)(g_dev));
}

/* The whole sequence; `extra` runs just before the final meminfo (route_gpa's --old-abi). */
static void run_sequence(void (*extra)(void))
{
    do_setup();
    do_meminfo();
    do_alloc_device();
    do_alloc_pitch();
    do_alloc_managed();
    do_alloc_async();
    do_alloc_pool();
    do_vmm_create();
    do_vmm_map();
    do_vmm_release();
    do_alloc_hostalloc();
    do_alloc_allochost();
    do_alloc_array2d();
    do_alloc_array3d();
    do_alloc_mipmap();
    do_alloc_graph();
    do_meminfo();
    do_meminfo_null();
    do_free_graph();
    do_free_mipmap();
    do_free_array3d();
    do_free_array2d();
    do_free_allochost();
    do_free_hostalloc();
    do_vmm_unmap();
    do_free_pool();
    do_free_async();
    do_free_managed();
    do_free_pitch();
    do_free_device();
    do_imports();
    if (extra)
        extra();
    do_meminfo();
    do_teardown();
}

#endif
