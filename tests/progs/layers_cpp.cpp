// layers_cpp.cpp - the allocator-layer program of layers.c in C++, shaped like an inference
// engine's: namespaces, a class template, an anonymous namespace, constructors
// (tests/integration/test_layers.py). Every device allocation goes
//   eng::Tensor<float>::Tensor -> eng::Backend::acquire<float> ->
//   eng::dev::(anonymous namespace)::obtain_on_device -> cuMemAlloc_v2
// from the weights loader, the KV cache (one eng::v1::CacheBuffer per layer, built by
// eng::v1::GPUModelRunner::initialize_kv_cache), a table builder and a per-step workspace.
//   layers_cpp [--kv-layers N] [--kv-mib M]
// Build: g++ -O0 -g -fno-omit-frame-pointer -rdynamic layers_cpp.cpp -lcuda
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

extern "C" {
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
}

#define NOINLINE __attribute__((noinline, used))
static const size_t MiB = 1 << 20;

namespace eng {
struct Device {
    int ordinal;
};

namespace dev {
namespace {
NOINLINE CUdeviceptr obtain_on_device(Device d, unsigned long bytes)
{
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc_v2(&p, bytes);
    if (r != 0) {
        std::fprintf(stderr, "layers_cpp: obtain_on_device(%d, %lu) failed: CUresult %d\n",
                     d.ordinal, bytes, r);
        std::exit(1);
    }
    return p;
}
} // namespace
} // namespace dev

class Backend {
  public:
    template <typename T> NOINLINE CUdeviceptr acquire(size_t count, const std::string &tag)
    {
        (void)tag;
        return dev::obtain_on_device(Device{0}, count * sizeof(T));
    }
};

Backend &backend()
{
    static Backend b;
    return b;
}

template <typename T> class Tensor {
  public:
    NOINLINE explicit Tensor(size_t count, const std::string &tag = "")
        : ptr_(backend().acquire<T>(count, tag)), count_(count)
    {
    }
    CUdeviceptr ptr_;
    size_t count_;
};

namespace v1 {
class CacheBuffer {
  public:
    NOINLINE explicit CacheBuffer(size_t bytes) : t_(bytes / sizeof(float), "kv") {}
    Tensor<float> t_;
};

class GPUModelRunner {
  public:
    NOINLINE void initialize_kv_cache(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            kv_.emplace_back(new CacheBuffer(mib * MiB));
    }
    NOINLINE void load_weights(const std::vector<std::string> &names)
    {
        weights_.emplace_back(new Tensor<float>(64 * MiB / sizeof(float), "embed"));
        for (const auto &n : names)
            weights_.emplace_back(new Tensor<float>(MiB / sizeof(float), n));
    }
    std::vector<std::unique_ptr<CacheBuffer>> kv_;
    std::vector<std::unique_ptr<Tensor<float>>> weights_;
};
} // namespace v1
} // namespace eng

namespace {
NOINLINE void build_table(std::vector<std::unique_ptr<eng::Tensor<float>>> &out)
{
    out.emplace_back(new eng::Tensor<float>(3 * MiB / sizeof(float), "table"));
}

NOINLINE eng::Tensor<float> *step_workspace(int step)
{
    (void)step;
    return new eng::Tensor<float>(8 * MiB / sizeof(float), "ws");
}
} // namespace

int main(int argc, char **argv)
{
    int layers = 28;
    size_t mib = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--kv-layers"))
            layers = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--kv-mib"))
            mib = (size_t)std::atoi(argv[i + 1]);
    }
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) {
        std::fprintf(stderr, "layers_cpp: no CUDA device\n");
        return 1;
    }
    eng::v1::GPUModelRunner runner;
    std::vector<std::string> names;
    for (int i = 0; i < 20; i++)
        names.push_back("w" + std::to_string(i));
    runner.load_weights(names);
    runner.initialize_kv_cache(layers, mib);
    std::vector<std::unique_ptr<eng::Tensor<float>>> tables;
    build_table(tables);
    std::unique_ptr<eng::Tensor<float>> ws;
    for (int s = 0; s < 3; s++)
        ws.reset(step_workspace(s)); // never freed on the device: the point is the sites
    std::printf("ready\n");
    return 0;
}
