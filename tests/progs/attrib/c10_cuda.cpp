// c10_cuda.cpp - libc10_cuda.so: the CUDA caching allocator (torchlike.h).
#include "cuda_min.h"
#include "torchlike.h"
#include <cstdio>
#include <cstdlib>

namespace c10 {
namespace cuda {
namespace CUDACachingAllocator {
namespace Native {
class DeviceCachingAllocator {
  public:
    void *malloc(size_t n) { return alloc_block((n + 511) & ~(size_t)511); }

  private:
    __attribute__((noinline)) void *alloc_block(size_t n)
    {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, n) != 0) {
            std::fprintf(stderr, "CUDA out of memory. Tried to allocate %zu bytes\n", n);
            std::exit(1);
        }
        return (void *)p;
    }
};
class NativeCachingAllocator : public Allocator {
  public:
    void *allocate(size_t n) override { return device_allocator.malloc(n); }
    DeviceCachingAllocator device_allocator;
};
} // namespace Native
Allocator *get()
{
    static Native::NativeCachingAllocator a;
    return &a;
}
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10
