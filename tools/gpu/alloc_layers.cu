/* alloc_layers.cu - an inference engine's allocator shape on a real GPU (GPU suite).
 *
 * Every device allocation goes through a class hierarchy like an engine's:
 *   eng::Tensor<float>::Tensor -> eng::Backend::acquire<float> ->
 *   eng::dev::(anonymous namespace)::obtain_on_device -> cudaMalloc (static runtime)
 * from the weights loader (1 x 64 MiB + 20 x 1 MiB, eng::v1::GPUModelRunner::load_weights),
 * the KV cache (N x M MiB, one eng::v1::CacheBuffer per layer, built by
 * eng::v1::GPUModelRunner::initialize_kv_cache), a table builder (3 MiB) and a per-step
 * workspace (8 MiB, one live at a time). cudatrace must name the KV code, not the allocator:
 * tests/gpu/test_gpu.py test_alloc_layers.
 *
 * Usage: alloc_layers [--kv-layers N] [--kv-mib M]     (default 28 x 64 MiB)
 * Prints "info kv_layers N", "info kv_bytes B", "done"; exit 2 when an allocation fails
 * (under a cudatrace budget: the KV cache is refused).
 */
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_common.h"

static const size_t MiB = 1 << 20;

namespace eng {
struct Device {
    int ordinal;
};

namespace dev {
namespace {
NOINLINE void *obtain_on_device(Device d, unsigned long bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "alloc_layers: obtain_on_device(%d, %lu): %s\n", d.ordinal, bytes,
                cudaGetErrorName(e));
        exit(2);
    }
    gc_alloc("cudaMalloc", bytes, p);
    return p;
}
} // namespace
} // namespace dev

class Backend {
  public:
    template <typename T> NOINLINE void *acquire(size_t count, const std::string &tag)
    {
        (void)tag;
        return dev::obtain_on_device(Device{0}, count * sizeof(T));
    }
};

static Backend &backend()
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
    NOINLINE ~Tensor()
    {
        cudaFree(ptr_);
        gc_free("cudaFree", ptr_);
    }
    void *ptr_;
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
    NOINLINE void load_weights(int small)
    {
        weights_.emplace_back(new Tensor<float>(64 * MiB / sizeof(float), "embed"));
        for (int i = 0; i < small; i++)
            weights_.emplace_back(new Tensor<float>(MiB / sizeof(float), "w" + std::to_string(i)));
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
    size_t mib = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kv-layers"))
            layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-mib"))
            mib = (size_t)atoi(argv[i + 1]);
    }
    gc_line_buffered();
    cudaError_t e0 = cudaFree(0);
    if (e0 != cudaSuccess) {
        fprintf(stderr, "alloc_layers: CUDA init failed: %s\n", cudaGetErrorName(e0));
        return 2;
    }
    printf("info kv_layers %d\ninfo kv_bytes %llu\n", layers,
           (unsigned long long)layers * mib * MiB);
    {
        eng::v1::GPUModelRunner runner;
        runner.load_weights(20);
        runner.initialize_kv_cache(layers, mib);
        std::vector<std::unique_ptr<eng::Tensor<float>>> tables;
        build_table(tables);
        std::unique_ptr<eng::Tensor<float>> ws;
        for (int s = 0; s < 3; s++)
            ws.reset(step_workspace(s));
        cudaDeviceSynchronize();
    }
    printf("done\n");
    return 0;
}
