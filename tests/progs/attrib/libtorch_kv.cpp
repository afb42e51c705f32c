// libtorch_kv.cpp - tools/gpu/libtorch_kv.cpp's shape over torchlike.h (libc10_cuda,
// libtorch_cpu, libtorch_cuda): a KV cache from torch::empty in a loop in llm::KVCache's
// constructor, weights moved with .to(kCUDA) in llm::load_weights. The executable's own file
// name starts like a framework's library (libtorch_kv, as libtorch_cuda): it is the program,
// not a part of libtorch.   libtorch_kv [--layers N] [--mib M] [--serve]
#include "cuda_min.h"
#include "torchlike.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace llm {
class KVCache {
  public:
    KVCache(int layers, size_t mib, c10::DeviceType device)
    {
        for (int i = 0; i < layers; i++)
            blocks_.push_back(torch::empty(mib * ATTRIB_MiB, device));
    }
    std::vector<at::Tensor> blocks_;
};

__attribute__((noinline)) std::vector<at::Tensor> load_weights(int n, size_t mib,
                                                               c10::DeviceType device)
{
    std::vector<at::Tensor> weights;
    for (int i = 0; i < n; i++) {
        at::Tensor host = torch::empty(mib * ATTRIB_MiB, torch::kCPU);
        weights.push_back(host.to(device));
    }
    return weights;
}
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
    llm::KVCache kv(layers, mib, torch::kCUDA);
    std::vector<at::Tensor> weights;
    if (serve)
        weights = llm::load_weights(8, mib / 2 > 0 ? mib / 2 : 1, torch::kCUDA);
    std::printf("ready: %d KV blocks, %zu weights\n", layers, weights.size());
    return 0;
}
