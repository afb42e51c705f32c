// llm_server.cpp - a C++ server over libtorch (torchlike.h: libc10_cuda, libtorch_cpu,
// libtorch_cuda): the KV cache from torch::empty at start-up; weights moved with .to(kCUDA),
// a sampler's buffer from torch::zeros and a rotary table from at::empty_strided when
// serving.   llm_server [--layers N] [--mib M] [--serve]
#include "cuda_min.h"
#include "torchlike.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace llm {
class KVCache {
  public:
    KVCache(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            blocks.push_back(torch::empty(mib * ATTRIB_MiB, torch::kCUDA));
    }
    std::vector<at::Tensor> blocks;
};
class Model {
  public:
    void load_weights(int n)
    {
        for (int i = 0; i < n; i++) {
            at::Tensor host = torch::empty(2 * ATTRIB_MiB, torch::kCPU);
            weights.push_back(host.to(torch::kCUDA));
        }
    }
    std::vector<at::Tensor> weights;
};
class Sampler {
  public:
    Sampler() : probs(torch::zeros(4 * ATTRIB_MiB, torch::kCUDA)) {}
    at::Tensor probs;
};
class RopeCache {
  public:
    RopeCache() : table(at::empty_strided(ATTRIB_MiB, 3, torch::kCUDA)) {}
    at::Tensor table;
};
} // namespace llm

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
    llm::Model model;
    if (serve)
        model.load_weights(10);
    llm::KVCache kv(layers, mib);
    if (serve) {
        llm::Sampler sampler;
        llm::RopeCache rope;
        std::printf("serving %p %p\n", sampler.probs.data, rope.table.data);
    }
    std::printf("ready\n");
    return 0;
}
