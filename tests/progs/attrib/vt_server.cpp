// vt_server.cpp - an engine linked as one binary (tests/integration/test_attrib_shapes.py):
// its allocator helper vt::cuda::(anonymous namespace)::AllocOnDevice sits in another namespace
// and is reached through a function-pointer table (vt::Alloc: a tail call at -O2), and through
// a virtual vt::cuda::CudaBackend::Alloc for the weights. At start-up only the KV cache
// allocates (one vllm::v1::GPUModelRunner::CacheBuffer per layer): the helper has one client.
//   vt_server [--layers N] [--mib M] [--serve]   (--serve: weights and a workspace too)
// An allocation that fails prints "fatal: cudaMalloc: out of memory" and exits 1.
#include "cuda_min.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace vt {
struct Device {
    int kind;
    int ordinal;
};
struct AllocOps {
    CUdeviceptr (*alloc)(Device, unsigned long);
};
const AllocOps *g_ops[2];

namespace cuda {
namespace {
__attribute__((noinline)) CUdeviceptr AllocOnDevice(Device d, unsigned long bytes)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, bytes) != 0) {
        std::fprintf(stderr, "fatal: cudaMalloc: out of memory (%lu bytes on %d)\n", bytes,
                     d.ordinal);
        std::exit(1);
    }
    return p;
}
const AllocOps ops = {AllocOnDevice};
} // namespace
void register_ops() { g_ops[1] = &ops; }
} // namespace cuda

inline CUdeviceptr Alloc(Device d, unsigned long bytes) { return g_ops[d.kind]->alloc(d, bytes); }

class Backend {
  public:
    virtual ~Backend() {}
    virtual CUdeviceptr Alloc(unsigned long bytes) = 0;
};

namespace cuda {
class CudaBackend : public Backend {
  public:
    CUdeviceptr Alloc(unsigned long bytes) override { return vt::Alloc(Device{1, 0}, bytes); }
};
} // namespace cuda
} // namespace vt

namespace vllm {
namespace v1 {
class GPUModelRunner {
  public:
    struct CacheBuffer {
        CacheBuffer(vt::Device d, size_t bytes) : ptr(vt::Alloc(d, bytes)), size(bytes) {}
        CUdeviceptr ptr;
        size_t size;
    };
    void initialize_kv_cache(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            kv_.emplace_back(new CacheBuffer(vt::Device{1, 0}, mib * ATTRIB_MiB));
    }
    void load_weights(vt::Backend &b, int n)
    {
        for (int i = 0; i < n; i++)
            weights_.push_back(b.Alloc(2 * ATTRIB_MiB));
    }
    std::vector<std::unique_ptr<CacheBuffer>> kv_;
    std::vector<CUdeviceptr> weights_;
};
} // namespace v1

namespace entrypoints {
CUdeviceptr g_workspace;
__attribute__((noinline)) void profile_run(vt::Backend &b)
{
    g_workspace = b.Alloc(8 * ATTRIB_MiB);
    std::printf("workspace at %llx\n", g_workspace);
}
} // namespace entrypoints
} // namespace vllm

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
    vt::cuda::register_ops();
    vllm::v1::GPUModelRunner runner;
    vt::cuda::CudaBackend backend;
    if (serve)
        runner.load_weights(backend, 10);
    runner.initialize_kv_cache(layers, mib);
    if (serve)
        vllm::entrypoints::profile_run(backend);
    std::printf("ready\n");
    return 0;
}
