// startup_server.cu - an engine-like server for tools/gpu/startup_attrib.sh (issue 20): one
// binary, its allocator helper vt::cuda::(anonymous namespace)::AllocOnDevice reached through a
// function-pointer table (vt::Alloc, a tail call at -O2) and through a virtual
// vt::cuda::CudaBackend::Alloc; at start-up only the KV cache allocates (one
// vllm::v1::GPUModelRunner::CacheBuffer per layer, zero-filled), so the helper has one client.
// Built with nvcc, the C++ runtime linked statically (as vllm-server is).
//   startup_server [--layers N] [--mib M] [--serve]
// --serve: weights through the virtual backend and a workspace too. An allocation that fails
// prints "fatal: cudaMalloc: out of memory" and exits 1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <memory>
#include <vector>

namespace vt {
struct Device {
    int kind;
    int ordinal;
};
struct AllocOps {
    void *(*alloc)(Device, unsigned long);
};
const AllocOps *g_ops[2];

namespace cuda {
namespace {
__attribute__((noinline)) void *AllocOnDevice(Device d, unsigned long bytes)
{
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        std::fprintf(stderr, "fatal: cudaMalloc: out of memory (%lu bytes on device %d: %s)\n",
                     bytes, d.ordinal, cudaGetErrorString(e));
        std::exit(1);
    }
    cudaMemset(p, 0, bytes);
    return p;
}
const AllocOps ops = {AllocOnDevice};
} // namespace
void register_ops() { g_ops[1] = &ops; }
} // namespace cuda

inline void *Alloc(Device d, unsigned long bytes) { return g_ops[d.kind]->alloc(d, bytes); }

class Backend {
  public:
    virtual ~Backend() {}
    virtual void *Alloc(unsigned long bytes) = 0;
};

namespace cuda {
class CudaBackend : public Backend {
  public:
    void *Alloc(unsigned long bytes) override { return vt::Alloc(Device{1, 0}, bytes); }
};
} // namespace cuda
} // namespace vt

namespace vllm {
namespace v1 {
class GPUModelRunner {
  public:
    struct CacheBuffer {
        CacheBuffer(vt::Device d, size_t bytes) : ptr(vt::Alloc(d, bytes)), size(bytes) {}
        void *ptr;
        size_t size;
    };
    void initialize_kv_cache(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            kv_.emplace_back(new CacheBuffer(vt::Device{1, 0}, mib << 20));
    }
    void load_weights(vt::Backend &b, int n)
    {
        for (int i = 0; i < n; i++)
            weights_.push_back(b.Alloc(32 << 20));
    }
    std::vector<std::unique_ptr<CacheBuffer>> kv_;
    std::vector<void *> weights_;
};
} // namespace v1
namespace entrypoints {
void *g_workspace;
__attribute__((noinline)) void profile_run(vt::Backend &b)
{
    g_workspace = b.Alloc(64 << 20);
    std::printf("workspace at %p\n", g_workspace);
}
} // namespace entrypoints
} // namespace vllm

int main(int argc, char **argv)
{
    int layers = 28, serve = 0;
    size_t mib = 64;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--serve"))
            serve = 1;
    }
    vt::cuda::register_ops();
    vllm::v1::GPUModelRunner runner;
    vt::cuda::CudaBackend backend;
    if (serve)
        runner.load_weights(backend, 8);
    runner.initialize_kv_cache(layers, mib);
    if (serve)
        vllm::entrypoints::profile_run(backend);
    cudaDeviceSynchronize();
    std::printf("ready\n");
    return 0;
}
