// mc10.h - the c10-like caching allocator's interface (mc10.cpp).
#ifndef ATTRIB_MC10_H
#define ATTRIB_MC10_H
#include <stddef.h>
namespace mc10 {
namespace cuda {
class CachingAllocator {
  public:
    void *malloc(size_t n);

  private:
    void *alloc_block(size_t n);
};
CachingAllocator &get();
} // namespace cuda
} // namespace mc10
#endif
