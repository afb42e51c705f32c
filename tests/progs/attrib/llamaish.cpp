// llamaish.cpp - libllamaish.so, the engine over ggmlish (ggmlish.h): a KV cache class whose
// constructor allocates one buffer per layer, and a model loader (llamaish_load_model).
#include "ggmlish.h"
#include <vector>

struct llamaish_kv_cache {
    llamaish_kv_cache(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            bufs.push_back(ggmlish_alloc_ctx_tensors(ggmlish_cuda_buffer_type(), 2,
                                                     mib * ((size_t)1 << 19)));
    }
    std::vector<ggmlish_buffer *> bufs;
};

struct llamaish_model {
    void load_tensors(int n)
    {
        for (int i = 0; i < n; i++)
            weights.push_back(ggmlish_alloc_ctx_tensors(ggmlish_cuda_buffer_type(), 4,
                                                        (size_t)1 << 19));
    }
    std::vector<ggmlish_buffer *> weights;
};

extern "C" void *llamaish_init(int layers, size_t mib, int serve)
{
    static llamaish_model model;
    if (serve)
        model.load_tensors(10);
    return new llamaish_kv_cache(layers, mib);
}
