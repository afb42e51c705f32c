/* runtime_basic.cu - every CUDA-runtime allocation path, each from a named function.
 *
 * Built three ways by build.sh: static runtime (nvcc's default), shared runtime
 * (--cudart shared) and static with --default-stream per-thread (the _ptsz driver variants).
 * Prints what it did (gpu_common.h) so tests/gpu/test_gpu.py can check that every allocation and
 * free appears in the trace exactly once, with the right driver API, size and pointer.
 *
 * Usage: runtime_basic [--threads N] [--pairs N]     (defaults 8 threads x 200 pairs of 1 MiB)
 *
 * Sizes are all distinct, and none is 1 MiB except the thread section's, so the test can count.
 * Memory used at once stays under 300 MiB; managed memory is 4 MiB.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>

#include "gpu_common.h"

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t err_ = (call);                                                          \
        if (err_ != cudaSuccess) {                                                          \
            fprintf(stderr, "runtime_basic: %s failed at %s:%d: %s (%s)\n", #call, __FILE__,  \
                    __LINE__, cudaGetErrorName(err_), cudaGetErrorString(err_));           \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

static const size_t MiB = 1 << 20;

/* ---- plain device memory ------------------------------------------------------------ */
extern "C" NOINLINE void *alloc_big_device(size_t size)
{
    void *p = NULL;
    CK(cudaMalloc(&p, size));
    gc_alloc("cudaMalloc", size, p);
    return p;
}

extern "C" NOINLINE void *alloc_device_small(size_t size)
{
    void *p = NULL;
    CK(cudaMalloc(&p, size));
    gc_alloc("cudaMalloc", size, p);
    return p;
}

extern "C" NOINLINE void *alloc_device_medium(size_t size)
{
    void *p = NULL;
    CK(cudaMalloc(&p, size));
    gc_alloc("cudaMalloc", size, p);
    return p;
}

extern "C" NOINLINE void free_device(void *p)
{
    CK(cudaFree(p));
    gc_free("cudaFree", p);
}

extern "C" NOINLINE void query_meminfo(void)
{
    size_t f = 0, t = 0;
    CK(cudaMemGetInfo(&f, &t));
    gc_meminfo(f, t);
}

/* ---- stream-ordered ------------------------------------------------------------------ */
extern "C" NOINLINE void *alloc_async_default_pool(size_t size, cudaStream_t s)
{
    void *p = NULL;
    CK(cudaMallocAsync(&p, size, s));
    gc_alloc("cudaMallocAsync", size, p);
    return p;
}

extern "C" NOINLINE void *alloc_from_created_pool(size_t size, cudaMemPool_t pool, cudaStream_t s)
{
    void *p = NULL;
    CK(cudaMallocFromPoolAsync(&p, size, pool, s));
    gc_alloc("cudaMallocFromPoolAsync", size, p);
    return p;
}

extern "C" NOINLINE void free_async(void *p, cudaStream_t s)
{
    CK(cudaFreeAsync(p, s));
    gc_free("cudaFreeAsync", p);
}

/* stream-ordered allocation inside a stream capture: it becomes the graph's allocation node.
 * The shim asks the stream's context (cuStreamGetCtx) for the allocation's device: the capture
 * must survive it (a query the driver refuses during capture would invalidate it). */
extern "C" NOINLINE void capture_async(size_t size, cudaStream_t s)
{
    cudaGraph_t g;
    cudaGraphExec_t ex;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void *p = alloc_async_default_pool(size, s);
    free_async(p, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ex, g, 0));
    CK(cudaGraphLaunch(ex, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaGraphExecDestroy(ex));
    CK(cudaGraphDestroy(g));
    printf("info capture_ok 1\n");
}

/* ---- managed, pinned host, pitched, arrays ------------------------------------------- */
extern "C" NOINLINE void *alloc_managed(size_t size)
{
    void *p = NULL;
    CK(cudaMallocManaged(&p, size, cudaMemAttachGlobal));
    gc_alloc("cudaMallocManaged", size, p);
    return p;
}

extern "C" NOINLINE void *alloc_pinned_host(size_t size)
{
    void *p = NULL;
    CK(cudaMallocHost(&p, size));
    gc_alloc("cudaMallocHost", size, p);
    return p;
}

extern "C" NOINLINE void *alloc_host_alloc(size_t size)
{
    void *p = NULL;
    CK(cudaHostAlloc(&p, size, cudaHostAllocPortable));
    gc_alloc("cudaHostAlloc", size, p);
    return p;
}

extern "C" NOINLINE void free_host(void *p)
{
    CK(cudaFreeHost(p));
    gc_free("cudaFreeHost", p);
}

extern "C" NOINLINE void *alloc_pitched(size_t width, size_t height)
{
    void *p = NULL;
    size_t pitch = 0;
    CK(cudaMallocPitch(&p, &pitch, width, height));
    printf("info pitch2d %zu\n", pitch);
    gc_alloc("cudaMallocPitch", (unsigned long long)pitch * height, p);
    return p;
}

extern "C" NOINLINE void *alloc_3d(size_t width, size_t height, size_t depth)
{
    cudaPitchedPtr pp;
    memset(&pp, 0, sizeof pp);
    CK(cudaMalloc3D(&pp, make_cudaExtent(width, height, depth)));
    printf("info pitch3d %zu\n", pp.pitch);
    gc_alloc("cudaMalloc3D", (unsigned long long)pp.pitch * height * depth, pp.ptr);
    return pp.ptr;
}

extern "C" NOINLINE cudaArray_t alloc_array_2d(size_t w, size_t h)
{
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
    cudaArray_t a = NULL;
    CK(cudaMallocArray(&a, &d, w, h, 0));
    gc_alloc("cudaMallocArray", (unsigned long long)w * h * sizeof(float), (void *)a);
    return a;
}

extern "C" NOINLINE cudaArray_t alloc_array_3d(size_t w, size_t h, size_t z)
{
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
    cudaArray_t a = NULL;
    CK(cudaMalloc3DArray(&a, &d, make_cudaExtent(w, h, z), 0));
    gc_alloc("cudaMalloc3DArray", (unsigned long long)w * h * z * sizeof(float), (void *)a);
    return a;
}

extern "C" NOINLINE void free_array(cudaArray_t a)
{
    CK(cudaFreeArray(a));
    gc_free("cudaFreeArray", (void *)a);
}

/* ---- a graph with a memory alloc node and a free node -------------------------------- */
extern "C" NOINLINE void graph_with_mem_nodes(size_t size, cudaStream_t s)
{
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams prm;
    memset(&prm, 0, sizeof prm);
    prm.poolProps.allocType = cudaMemAllocationTypePinned;
    prm.poolProps.handleTypes = cudaMemHandleTypeNone;
    prm.poolProps.location.type = cudaMemLocationTypeDevice;
    CK(cudaGetDevice(&prm.poolProps.location.id));
    prm.bytesize = size;
    cudaGraphNode_t an, fn;
    CK(cudaGraphAddMemAllocNode(&an, g, NULL, 0, &prm));
    gc_alloc("cudaGraphAddMemAllocNode", size, prm.dptr);
    CK(cudaGraphAddMemFreeNode(&fn, g, &an, 1, prm.dptr));
    gc_free("cudaGraphAddMemFreeNode", prm.dptr);
    cudaGraphExec_t ex;
    CK(cudaGraphInstantiate(&ex, g, 0));
    CK(cudaGraphLaunch(ex, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaGraphExecDestroy(ex));
    CK(cudaGraphDestroy(g));
    CK(cudaDeviceGraphMemTrim(prm.poolProps.location.id));
    printf("info graph_launched 1\n");
}

/* ---- threads ------------------------------------------------------------------------- */
struct worker {
    pthread_t th;
    int pairs;
    size_t size;
    unsigned long tid;
    int failed;
};

extern "C" NOINLINE int thread_alloc_loop(int pairs, size_t size)
{
    for (int i = 0; i < pairs; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, size) != cudaSuccess)
            return 1;
        if (cudaFree(p) != cudaSuccess)
            return 1;
    }
    return 0;
}

static void *worker_main(void *arg)
{
    struct worker *w = (struct worker *)arg;
    w->tid = gc_tid();
    if (cudaSetDevice(0) != cudaSuccess) {
        w->failed = 1;
        return NULL;
    }
    w->failed = thread_alloc_loop(w->pairs, w->size);
    return NULL;
}

extern "C" NOINLINE void run_threads(int n, int pairs, size_t size)
{
    struct worker *ws = (struct worker *)calloc((size_t)n, sizeof *ws);
    for (int i = 0; i < n; i++) {
        ws[i].pairs = pairs;
        ws[i].size = size;
        if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0) {
            fprintf(stderr, "runtime_basic: pthread_create failed\n");
            exit(2);
        }
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(ws[i].th, NULL);
        if (ws[i].failed)
            bad = 1;
        printf("thread %lu %d %zu\n", ws[i].tid, pairs, size);
    }
    free(ws);
    if (bad) {
        fprintf(stderr, "runtime_basic: a worker thread's cudaMalloc/cudaFree failed\n");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    int nthreads = 8, pairs = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads"))
            nthreads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--pairs"))
            pairs = atoi(argv[i + 1]);
    }
    gc_line_buffered();
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    int rv = 0, dv = 0;
    CK(cudaRuntimeGetVersion(&rv));
    CK(cudaDriverGetVersion(&dv));
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
    const int ptsz = 1;
#else
    const int ptsz = 0;
#endif
    printf("info runtime_version %d\ninfo driver_version %d\ninfo ptsz %d\ninfo main_tid %lu\n", rv,
           dv, ptsz, gc_tid());

    query_meminfo();

    /* held across everything below: the largest site at the peak */
    void *big = alloc_big_device(192 * MiB);

    void *a = alloc_device_small(3 * MiB + 4096);
    void *b = alloc_device_medium(17 * MiB);
    free_device(a);
    free_device(b);

    /* stream-ordered, default pool, on the default stream (per-thread in the ptsz build) */
    cudaStream_t s0 = 0;
    void *x = alloc_async_default_pool(5 * MiB, s0);
    free_async(x, s0);
    CK(cudaStreamSynchronize(s0));

    /* an explicit pool */
    cudaMemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = cudaMemAllocationTypePinned;
    pp.handleTypes = cudaMemHandleTypeNone;
    pp.location.type = cudaMemLocationTypeDevice;
    pp.location.id = 0;
    cudaMemPool_t pool;
    CK(cudaMemPoolCreate(&pool, &pp));
    void *y = alloc_from_created_pool(7 * MiB, pool, s0);
    free_async(y, s0);
    CK(cudaStreamSynchronize(s0));
    CK(cudaMemPoolDestroy(pool));

    /* the device's default pool by name, and a pool at the host (pinned host memory: the
     * shim notes each pool's location where it is made or named; a driver without host pools
     * says so and the step is skipped) */
    cudaMemPool_t dpool;
    CK(cudaDeviceGetDefaultMemPool(&dpool, 0));
    void *yd = alloc_from_created_pool(6 * MiB, dpool, s0);
    free_async(yd, s0);
    pp.location.type = cudaMemLocationTypeHost;
    pp.location.id = 0;
    cudaMemPool_t hpool;
    cudaError_t hr = cudaMemPoolCreate(&hpool, &pp);
    printf("info host_pool %d\n", hr == cudaSuccess);
    if (hr == cudaSuccess) {
        void *yh = alloc_from_created_pool(5 * MiB + 4096, hpool, s0);
        free_async(yh, s0);
        CK(cudaStreamSynchronize(s0));
        CK(cudaMemPoolDestroy(hpool));
    } else {
        printf("info host_pool_error %s\n", cudaGetErrorName(hr));
        (void)cudaGetLastError();
    }
    CK(cudaStreamSynchronize(s0));

    /* a created stream (its context's device: shim.c stream_device), and a capture on it */
    cudaStream_t sc;
    CK(cudaStreamCreateWithFlags(&sc, cudaStreamNonBlocking));
    void *z = alloc_async_default_pool(9 * MiB, sc);
    free_async(z, sc);
    CK(cudaStreamSynchronize(sc));
    capture_async(11 * MiB, sc);
    CK(cudaStreamDestroy(sc));

    void *m = alloc_managed(4 * MiB);
    CK(cudaMemset(m, 0, 4 * MiB));
    CK(cudaDeviceSynchronize());
    free_device(m);

    void *h1 = alloc_pinned_host(2 * MiB + 8192);
    void *h2 = alloc_host_alloc(3 * MiB);
    free_host(h1);
    free_host(h2);

    void *pt = alloc_pitched(1000, 300);
    free_device(pt);
    void *p3 = alloc_3d(1000, 30, 20);
    free_device(p3);

    cudaArray_t a2 = alloc_array_2d(1024, 512);
    cudaArray_t a3 = alloc_array_3d(64, 64, 32);
    free_array(a2);
    free_array(a3);

    graph_with_mem_nodes(32 * MiB, s0);

    query_meminfo();
    free_device(big);

    run_threads(nthreads, pairs, 1 * MiB);

    CK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
