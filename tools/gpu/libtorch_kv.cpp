// libtorch_kv.cpp - a C++ server's start-up over the libtorch of a PyTorch install
// (tools/gpu/libtorch_attrib.sh): a KV cache made with torch::empty in its own class, weights
// moved to the GPU with .to(torch::kCUDA) in their own function. The attribution must name
// these functions (llm::KVCache::KVCache, llm::load_weights), not c10's caching allocator nor
// ATen's factories, in the report and in the denial lines under a budget.
// Its file name starts like one of libtorch's libraries (libtorch_cuda.so): it is still the
// program, not a part of the framework.
//   libtorch_kv [--layers N] [--mib M] [--serve] [--cpu] [--hold-ms MS]
// --serve: the weights too (after the KV cache); --cpu: the same calls on the CPU (a check of
// the build and of the report's structure on a machine without CUDA); --hold-ms: keep the
// memory that long before exiting (so that NVML's samples see it). A denied allocation prints
// "libtorch_kv: out of memory" and exits 1.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace llm {
class KVCache {
  public:
    KVCache(int layers, int64_t mib, torch::Device device)
    {
        auto opts = torch::TensorOptions().dtype(torch::kHalf).device(device);
        for (int i = 0; i < layers; i++)
            blocks_.push_back(torch::empty({mib << 19}, opts)); // mib MiB of halves
    }
    std::vector<torch::Tensor> blocks_;
};

__attribute__((noinline)) std::vector<torch::Tensor> load_weights(int n, int64_t mib,
                                                                    torch::Device device)
{
    std::vector<torch::Tensor> weights;
    for (int i = 0; i < n; i++) {
        torch::Tensor host = torch::ones({mib << 19}, torch::kHalf);
        weights.push_back(host.to(device));
    }
    return weights;
}
} // namespace llm

int main(int argc, char **argv)
{
    int layers = 28, serve = 0, cpu = 0, hold_ms = 0;
    int64_t mib = 64;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = std::atoll(argv[++i]);
        else if (!std::strcmp(argv[i], "--serve"))
            serve = 1;
        else if (!std::strcmp(argv[i], "--cpu"))
            cpu = 1;
        else if (!std::strcmp(argv[i], "--hold-ms") && i + 1 < argc)
            hold_ms = std::atoi(argv[++i]);
    }
    if (!cpu && !torch::cuda::is_available()) {
        std::fprintf(stderr, "libtorch_kv: no CUDA device (use --cpu to check the build)\n");
        return 2;
    }
    torch::Device device = cpu ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA, 0);
    try {
        llm::KVCache kv(layers, mib, device);
        std::vector<torch::Tensor> weights;
        if (serve)
            weights = llm::load_weights(8, mib / 2 > 0 ? mib / 2 : 1, device);
        std::printf("ready: %d KV blocks of %lld MiB, %zu weights\n", layers, (long long)mib,
                    weights.size());
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    } catch (const c10::Error &e) {
        std::fprintf(stderr, "libtorch_kv: out of memory: %s\n", e.what_without_backtrace());
        return 1;
    }
    return 0;
}
