// mc10.cpp - libmc10.so, a c10-like caching allocator (tests/integration/test_attrib_shapes.py).
#include "mc10.h"
#include "cuda_min.h"
#include <cstdio>
#include <cstdlib>

namespace mc10 {
namespace cuda {
void *CachingAllocator::malloc(size_t n) { return alloc_block((n + 511) & ~(size_t)511); }

__attribute__((noinline)) void *CachingAllocator::alloc_block(size_t n)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, n) != 0) {
        std::fprintf(stderr, "mc10: CUDA out of memory. Tried to allocate %zu bytes\n", n);
        std::exit(1);
    }
    return (void *)p;
}

CachingAllocator &get()
{
    static CachingAllocator a;
    return a;
}
} // namespace cuda
} // namespace mc10
