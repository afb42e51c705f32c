/* cuda_api_memory.c - the simulated driver's exported API, part 2: every way to allocate and
 * free (device, stream-ordered, VMM, pinned host, arrays, graphs, imports), meminfo and the
 * test-only entry points (sim_driver.h). */
#include "sim_driver.h"

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
    SIM_ENTER(cuMemAlloc_v2, SIM_MAY_FAIL);
    return alloc_dev(dptr, bytesize, K_DEVICE, -1);
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    SIM_ENTER(cuMemAlloc, SIM_MAY_FAIL);
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
    SIM_ENTER(cuMemAllocPitch_v2, SIM_MAY_FAIL);
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
    SIM_ENTER(cuMemAllocPitch, SIM_MAY_FAIL);
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
    SIM_ENTER(cuMemAllocManaged, SIM_MAY_FAIL);
    if (flags != 1 && flags != 2) /* CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST */
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_dev(dptr, bytesize, K_MANAGED, -1);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    SIM_ENTER(cuMemFree_v2, 0);
    if (!dptr)
        return CUDA_SUCCESS; /* like the real driver: freeing NULL is a no-op */
    return do_free(SP_DEV, dptr, accept_freeable, NULL);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    SIM_ENTER(cuMemFree, 0);
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
    /* from the pool of the stream's device (the driver's documented rule), the current
     * context's for the NULL, legacy and per-thread streams */
    int dev = (uintptr_t)hStream > 2 ? object_dev(SP_STREAM, (uintptr_t)hStream) : -1;
    return alloc_dev(dptr, bytesize, K_ASYNC, dev);
}

/* A pool object's "device" says what its allocations are: a device's ordinal (pinned device
 * memory), POOL_HOST (pinned host memory: charged to the current device only when it is
 * integrated, as cuMemHostAlloc's), or POOL_MANAGED + the preferred device (-1: none) */
#define POOL_HOST (-2)
#define POOL_MANAGED (1 << 16)

static CUresult alloc_pool_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    if (inject_failure())
        return CUDA_ERROR_OUT_OF_MEMORY;
    int what = object_dev(SP_POOL, (uintptr_t)pool);
    if (what == -1)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_stream(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    if (dptr && !bytesize) {
        *dptr = 0;
        return CUDA_SUCCESS;
    }
    if (what >= POOL_MANAGED - 1)
        return alloc_dev(dptr, bytesize, K_MANAGED, what - POOL_MANAGED);
    if (what != POOL_HOST)
        return alloc_dev(dptr, bytesize, K_ASYNC, what);
    int dev;
    CUresult r = current_dev(&dev);
    if (r || !dptr)
        return r ? r : CUDA_ERROR_INVALID_VALUE;
    uint64_t p;
    r = do_alloc(SP_DEV, K_HOST, dev, bytesize, g_integrated ? bytesize : 0, 0, 0, 0, &p);
    if (!r)
        *dptr = p;
    return r;
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
    SIM_ENTER(cuMemAllocAsync, 0);
    return alloc_async(dptr, bytesize, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    SIM_ENTER(cuMemAllocAsync_ptsz, 0);
    return alloc_async(dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    SIM_ENTER(cuMemAllocFromPoolAsync, 0);
    return alloc_pool_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    SIM_ENTER(cuMemAllocFromPoolAsync_ptsz, 0);
    return alloc_pool_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    SIM_ENTER(cuMemFreeAsync, 0);
    return free_async(dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    SIM_ENTER(cuMemFreeAsync_ptsz, 0);
    return free_async(dptr, hStream);
}

/* what a pool of this location and allocation type allocates (POOL_*); -1: not supported */
static int pool_what(const CUmemLocation *loc, int type)
{
    int device = loc->type == CU_MEM_LOCATION_TYPE_DEVICE && valid_dev(loc->id);
    if (type == CU_MEM_ALLOCATION_TYPE_PINNED)
        return device ? loc->id : loc->type == CU_MEM_LOCATION_TYPE_HOST ? POOL_HOST : -1;
    if (type == CU_MEM_ALLOCATION_TYPE_MANAGED)
        return device                                                     ? POOL_MANAGED + loc->id
               : loc->type == 0 || loc->type == CU_MEM_LOCATION_TYPE_HOST ? POOL_MANAGED - 1
                                                                          : -1;
    return -1;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    SIM_ENTER(cuMemPoolCreate, 0);
    int what = poolProps ? pool_what(&poolProps->location, poolProps->allocType) : -1;
    if (!pool || what == -1)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    CUresult r = new_object(SP_POOL, what, &h);
    if (!r)
        *pool = (CUmemoryPool)(uintptr_t)h;
    return r;
}

/* each location's default pool, made at its first request (a device's pinned, the host's
 * pinned, the managed pools of each device and of none) */
#define DEFAULT_POOLS (2 * CUDASIM_MAX_DEVICES + 2)
static uint64_t default_pools[DEFAULT_POOLS];
static pthread_mutex_t default_pools_mu = PTHREAD_MUTEX_INITIALIZER;

static CUresult default_pool(int what, CUmemoryPool *out)
{
    int i = what == POOL_HOST          ? 0
            : what >= POOL_MANAGED - 1 ? 1 + CUDASIM_MAX_DEVICES + (what - POOL_MANAGED + 1)
                                       : 1 + what;
    if (!out || what == -1 || i < 0 || i >= DEFAULT_POOLS)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&default_pools_mu);
    if (!default_pools[i])
        r = new_object(SP_POOL, what, &default_pools[i]);
    if (!r)
        *out = (CUmemoryPool)(uintptr_t)default_pools[i];
    pthread_mutex_unlock(&default_pools_mu);
    return r;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    SIM_ENTER(cuDeviceGetDefaultMemPool, 0);
    return valid_dev(dev) ? default_pool(dev, pool_out) : CUDA_ERROR_INVALID_VALUE;
}

/* the sim has no cuDeviceSetMemPool: a device's current pool is its default pool */
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    SIM_ENTER(cuDeviceGetMemPool, 0);
    return valid_dev(dev) ? default_pool(dev, pool) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, int type)
{
    SIM_ENTER(cuMemGetDefaultMemPool, 0);
    return location ? default_pool(pool_what(location, type), pool_out) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, int type)
{
    SIM_ENTER(cuMemGetMemPool, 0);
    return location ? default_pool(pool_what(location, type), pool) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    SIM_ENTER(cuMemPoolDestroy, 0);
    return do_free(SP_POOL, (uintptr_t)pool, NULL, NULL);
}

/* ---- virtual memory management ------------------------------------------------------------ */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       int option)
{
    SIM_ENTER(cuMemGetAllocationGranularity, 0);
    if (!granularity || !prop || (option != 0 && option != 1))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    SIM_ENTER(cuMemCreate, SIM_MAY_FAIL);
    if (!handle || !prop || !size || size % GRANULARITY || flags != 0 || prop->type != 1)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    CUresult r;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) { /* pinned host memory */
        int dev;
        if ((r = current_dev(&dev)) != CUDA_SUCCESS)
            return r;
        r = do_alloc(SP_VMM, K_HOST, dev, size, g_integrated ? size : 0, new_handle(), 0, 0, &h);
    } else if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_dev(prop->location.id)) {
        r = do_alloc(SP_VMM, K_VMM, prop->location.id, size, size, new_handle(), 0, 0, &h);
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
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
    SIM_ENTER(cuMemRelease, 0);
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
    SIM_ENTER(cuMemAddressReserve, 0);
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
    SIM_ENTER(cuMemAddressFree, 0);
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
    SIM_ENTER(cuMemMap, 0);
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
    SIM_ENTER(cuMemUnmap, 0);
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
    SIM_ENTER(cuMemSetAccess, 0);
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
    SIM_ENTER(cuMemHostAlloc, SIM_MAY_FAIL);
    return host_alloc(pp, bytesize, Flags);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    SIM_ENTER(cuMemAllocHost_v2, SIM_MAY_FAIL);
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    SIM_ENTER(cuMemAllocHost, SIM_MAY_FAIL);
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemFreeHost(void *p)
{
    SIM_ENTER(cuMemFreeHost, 0);
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
    SIM_ENTER(cuArrayCreate_v2, SIM_MAY_FAIL);
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 1));
}

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    SIM_ENTER(cuArrayCreate, SIM_MAY_FAIL);
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 1));
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    SIM_ENTER(cuArray3DCreate_v2, SIM_MAY_FAIL);
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1));
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    SIM_ENTER(cuArray3DCreate, SIM_MAY_FAIL);
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels))
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(SP_ARRAY, pHandle,
                        array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1));
}

CUresult cuArrayDestroy(CUarray hArray)
{
    SIM_ENTER(cuArrayDestroy, 0);
    return do_free(SP_ARRAY, (uintptr_t)hArray, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE
                                                            : CUDA_SUCCESS;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels)
{
    SIM_ENTER(cuMipmappedArrayCreate, SIM_MAY_FAIL);
    if (!pHandle || !d || !d->Width || !valid_channels(d->NumChannels) || numMipmapLevels > 64)
        return CUDA_ERROR_INVALID_VALUE;
    /* the real driver accepts 0 levels: counted as 1 */
    return array_create(SP_MIPMAP, pHandle,
                        array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                                    numMipmapLevels ? numMipmapLevels : 1));
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    SIM_ENTER(cuMipmappedArrayDestroy, 0);
    return do_free(SP_MIPMAP, (uintptr_t)h, NULL, NULL) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

/* ---- graphs ------------------------------------------------------------------------------- */
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    SIM_ENTER(cuGraphCreate, 0);
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
    SIM_ENTER(cuGraphDestroy, 0);
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
    SIM_ENTER(cuGraphAddMemAllocNode, SIM_MAY_FAIL);
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
    SIM_ENTER(cuGraphAddMemFreeNode, 0);
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
    SIM_ENTER(cuIpcOpenMemHandle_v2, 0);
    return ipc_open(pdptr, Flags);
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    SIM_ENTER(cuIpcOpenMemHandle, 0);
    return ipc_open(pdptr, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    SIM_ENTER(cuIpcCloseMemHandle, 0);
    return do_free(SP_DEV, dptr, accept_import, NULL);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    SIM_ENTER(cuMemImportFromShareableHandle, 0);
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
    SIM_ENTER(cuImportExternalMemory, 0);
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
    SIM_ENTER(cuDestroyExternalMemory, 0);
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
    SIM_ENTER(cuMemGetInfo_v2, 0);
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
    SIM_ENTER(cuMemGetInfo, 0);
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
