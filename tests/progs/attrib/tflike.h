// tflike.h - TensorFlow's shape (tests/integration/test_attrib_shapes.py): tsl::BFCAllocator and
// tensorflow::Tensor in libtensorflow_framework.so.2; the GPU process state and StreamExecutor's
// device allocator (stream_executor::) in libtensorflow_cc.so.2, under the BFC arena.
#ifndef ATTRIB_TFLIKE_H
#define ATTRIB_TFLIKE_H
#include <stddef.h>

namespace tsl {
class Allocator {
  public:
    virtual ~Allocator() {}
    virtual void *AllocateRaw(size_t alignment, size_t num_bytes) = 0;
};
class SubAllocator {
  public:
    virtual ~SubAllocator() {}
    virtual void *Alloc(size_t alignment, size_t num_bytes, size_t *bytes_received) = 0;
};
Allocator *NewBFCAllocator(SubAllocator *sub); // libtensorflow_framework.so.2
} // namespace tsl

namespace tensorflow {
enum DataType { DT_FLOAT = 1, DT_HALF = 19 };
class TensorShape {
  public:
    TensorShape(size_t a, size_t b) : n(a * b) {}
    size_t n;
};
class Tensor {
  public:
    Tensor(tsl::Allocator *a, DataType type, const TensorShape &shape); // framework
    void *buf_;
};
class GPUProcessState {
  public:
    static GPUProcessState *singleton(); // libtensorflow_cc.so.2
    tsl::Allocator *GetGPUAllocator(int tf_device_id);

  private:
    tsl::Allocator *gpu_allocator_ = nullptr;
};
} // namespace tensorflow
#endif
