// ort_providers_cuda.cpp - libonnxruntime_providers_cuda.so: the CUDA allocator (ortlike.h).
#include "cuda_min.h"
#include "ortlike.h"
#include <cstdio>
#include <cstdlib>

namespace onnxruntime {
class CUDAAllocator : public IAllocator {
  public:
    void *Alloc(size_t size) override
    {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, size) != 0) {
            std::fprintf(stderr, "onnxruntime: CUDA failure 2: out of memory (%zu bytes)\n", size);
            std::exit(1);
        }
        return (void *)p;
    }
};
IAllocator *CreateCUDAAllocator() { return new CUDAAllocator(); }
} // namespace onnxruntime
