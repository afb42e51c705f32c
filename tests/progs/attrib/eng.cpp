// eng.cpp - an engine that keeps all its code in one namespace (issue 44, item 1;
// tests/integration/test_attrib_shapes.py): a templated eng::mem::DeviceBuffer<T> used by
// eng::Attention::reserve (1.5 GiB of KV cache), eng::Model::load (400 MiB of weights) and a
// lambda in eng::Server::start (32 MiB of scratch). The boundary rule reads eng:: as the
// enclosing namespace of the allocator's eng::mem, so every caller was folded into main.
//   eng [--scale D]   (every size divided by D)
// An allocation that fails prints "eng: out of device memory" and the engine goes on, as a
// server that logs its out-of-memory does. Built with -DENG_CUDART against the CUDA runtime
// (cudaMalloc) by tools/gpu/eng_attrib.sh; else through the driver API (the simulated one).
#ifdef ENG_CUDART
#include <cuda_runtime.h>
typedef void *eng_ptr;
#define ENG_ALLOC(p, n) cudaMalloc((p), (n))
#else
#include "cuda_min.h"
typedef CUdeviceptr eng_ptr;
#define ENG_ALLOC(p, n) cuMemAlloc_v2((p), (n))
#endif
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

static size_t g_scale = 1;

namespace eng {
namespace mem {
template <typename T> class DeviceBuffer {
  public:
    explicit DeviceBuffer(size_t n) : n_(n)
    {
        if (ENG_ALLOC(&ptr_, n * sizeof(T)) != 0) {
            std::fprintf(stderr, "eng: out of device memory (%zu bytes)\n", n * sizeof(T));
            ptr_ = 0;
        }
    }
    eng_ptr ptr_ = 0;
    size_t n_;
};
} // namespace mem

class Attention {
  public:
    void reserve(size_t tokens) { kv_ = std::make_unique<mem::DeviceBuffer<float>>(tokens * 1024); }
    std::unique_ptr<mem::DeviceBuffer<float>> kv_;
};

class Model {
  public:
    void load(size_t mib) { weights_.reset(new mem::DeviceBuffer<unsigned short>(mib << 19)); }
    std::unique_ptr<mem::DeviceBuffer<unsigned short>> weights_;
};

class Server {
  public:
    void start()
    {
        auto scratch = [this](size_t bytes) {
            scratch_.emplace_back(new mem::DeviceBuffer<unsigned char>(bytes));
        };
        scratch((32u << 20) / g_scale);
    }
    std::vector<std::unique_ptr<mem::DeviceBuffer<unsigned char>>> scratch_;
};
} // namespace eng

int main(int argc, char **argv)
{
    if (argc > 2 && !std::strcmp(argv[1], "--scale"))
        g_scale = (size_t)std::atoi(argv[2]) > 0 ? (size_t)std::atoi(argv[2]) : 1;
#ifndef ENG_CUDART
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 2;
#endif
    eng::Attention attention;
    eng::Model model;
    eng::Server server;
    attention.reserve((384u << 10) / g_scale); // 1.5 GiB of float
    model.load(400 / g_scale);                 // 400 MiB of half
    server.start();                            // 32 MiB of bytes
    std::printf("ready\n");
    return 0;
}
