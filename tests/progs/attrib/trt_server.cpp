// trt_server.cpp - an application in the same namespace and binary as its allocator
// (tests/integration/test_attrib_shapes.py): templated buffer classes and a CRTP allocator in
// trt::runtime, a KV function whose own name says "allocate" in trt::batch_manager.
//   trt_server [--layers N] [--mib M] [--serve]   (--serve: decoder buffers too)
#include "cuda_min.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace trt {
namespace runtime {
template <typename Derived> class BaseAllocator {
  public:
    CUdeviceptr allocate(size_t n) { return static_cast<Derived *>(this)->allocateImpl(n); }
};
class CudaAllocator : public BaseAllocator<CudaAllocator> {
  public:
    __attribute__((noinline)) CUdeviceptr allocateImpl(size_t n)
    {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, n) != 0) {
            std::fprintf(stderr, "fatal: out of memory allocating %zu bytes\n", n);
            std::exit(1);
        }
        return p;
    }
};
template <typename TAllocator> class GenericBuffer {
  public:
    explicit GenericBuffer(size_t n) : size_(n) { ptr_ = TAllocator().allocate(n); }
    CUdeviceptr ptr_;
    size_t size_;
};
using DeviceBuffer = GenericBuffer<CudaAllocator>;
class BufferManager {
  public:
    __attribute__((noinline)) static std::unique_ptr<DeviceBuffer> gpu(size_t n)
    {
        return std::unique_ptr<DeviceBuffer>(new DeviceBuffer(n));
    }
};
} // namespace runtime

namespace batch_manager {
namespace kv_cache_manager {
class KVCacheManager {
  public:
    void allocatePools(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            pools_.push_back(runtime::BufferManager::gpu(mib * ATTRIB_MiB));
    }
    std::vector<std::unique_ptr<runtime::DeviceBuffer>> pools_;
};
} // namespace kv_cache_manager
class DecoderBuffers {
  public:
    DecoderBuffers() : logits(runtime::BufferManager::gpu(4 * ATTRIB_MiB)) {}
    std::unique_ptr<runtime::DeviceBuffer> logits;
};
} // namespace batch_manager
} // namespace trt

int main(int argc, char **argv)
{
    int layers = 28, serve = 0;
    size_t mib = 16;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--serve"))
            serve = 1;
    }
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 2;
    trt::batch_manager::kv_cache_manager::KVCacheManager kv;
    kv.allocatePools(layers, mib);
    std::unique_ptr<trt::batch_manager::DecoderBuffers> dec;
    if (serve)
        dec.reset(new trt::batch_manager::DecoderBuffers());
    std::printf("ready\n");
    return 0;
}
