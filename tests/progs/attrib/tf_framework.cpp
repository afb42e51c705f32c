// tf_framework.cpp - libtensorflow_framework.so.2: the BFC allocator and tensors (tflike.h).
#include "tflike.h"

namespace tsl {
class BFCAllocator : public Allocator {
  public:
    explicit BFCAllocator(SubAllocator *sub) : sub_allocator_(sub) {}
    void *AllocateRaw(size_t alignment, size_t num_bytes) override
    {
        return AllocateRawInternal(alignment, num_bytes);
    }

  private:
    __attribute__((noinline)) void *AllocateRawInternal(size_t alignment, size_t num_bytes)
    {
        return Extend(alignment, (num_bytes + 255) & ~(size_t)255);
    }
    __attribute__((noinline)) void *Extend(size_t alignment, size_t rounded_bytes)
    {
        size_t got = 0;
        return sub_allocator_->Alloc(alignment, rounded_bytes, &got);
    }
    SubAllocator *sub_allocator_;
};
Allocator *NewBFCAllocator(SubAllocator *sub) { return new BFCAllocator(sub); }
} // namespace tsl

namespace tensorflow {
namespace {
template <typename T> class Buffer {
  public:
    Buffer(tsl::Allocator *a, size_t n) : data_(a->AllocateRaw(64, n * sizeof(T))) {}
    void *data_;
};
} // namespace
Tensor::Tensor(tsl::Allocator *a, DataType type, const TensorShape &shape)
{
    buf_ = type == DT_HALF ? (new Buffer<short>(a, shape.n))->data_
                           : (new Buffer<float>(a, shape.n))->data_;
}
} // namespace tensorflow
