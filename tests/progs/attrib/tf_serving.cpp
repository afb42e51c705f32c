// tf_serving.cpp - a server over TensorFlow's C++ libraries (tflike.h): the KV store's tensors at
// start-up, the embedding table when serving.   tf_serving [--layers N] [--mib M] [--serve]
#include "cuda_min.h"
#include "tflike.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace serving {
class KVStore {
  public:
    KVStore(int layers, size_t mib)
    {
        tsl::Allocator *gpu = tensorflow::GPUProcessState::singleton()->GetGPUAllocator(0);
        for (int i = 0; i < layers; i++)
            keys.emplace_back(gpu, tensorflow::DT_FLOAT,
                              tensorflow::TensorShape(mib * ATTRIB_MiB / 4, 1));
    }
    std::vector<tensorflow::Tensor> keys;
};
class Embedding {
  public:
    Embedding()
        : table(tensorflow::GPUProcessState::singleton()->GetGPUAllocator(0), tensorflow::DT_HALF,
                tensorflow::TensorShape(ATTRIB_MiB, 3))
    {
    }
    tensorflow::Tensor table;
};
} // namespace serving

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
    serving::KVStore kv(layers, mib);
    if (serve) {
        serving::Embedding emb;
        std::printf("serving %p\n", emb.table.buf_);
    }
    std::printf("ready\n");
    return 0;
}
