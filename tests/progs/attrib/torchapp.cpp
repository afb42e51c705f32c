// torchapp.cpp - an application's own C++ classes over libmat.so / libmc10.so (a libtorch
// program; tests/integration/test_attrib_shapes.py): the KV cache from mat::zeros at start-up,
// weights from mat::empty when serving.   torchapp [--layers N] [--mib M] [--serve]
#include "cuda_min.h"
#include "mat.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace app {
class Model {
  public:
    void init_kv(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            kv.push_back(mat::zeros(mib * ATTRIB_MiB));
    }
    void load_weights(int n)
    {
        for (int i = 0; i < n; i++)
            weights.push_back(mat::empty(2 * ATTRIB_MiB));
    }
    std::vector<mat::Tensor> kv, weights;
};
} // namespace app

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
    app::Model m;
    if (serve)
        m.load_weights(10);
    m.init_kv(layers, mib);
    std::printf("ready\n");
    return 0;
}
