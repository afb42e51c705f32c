// ort_runtime.cpp - libonnxruntime.so: the BFC arena (growing through a lambda), tensors and the
// C API table (ortlike.h).
#include "ortlike.h"

namespace onnxruntime {
class BFCArena {
  public:
    explicit BFCArena(IAllocator *a) : device_allocator_(a) {}
    void *Alloc(size_t size) { return AllocateRawInternal(size); }

  private:
    __attribute__((noinline)) void *AllocateRawInternal(size_t size)
    {
        size_t rounded = (size + 255) & ~(size_t)255;
        return Extend(rounded);
    }
    __attribute__((noinline)) void *Extend(size_t rounded_bytes)
    {
        auto safe_alloc = [this](size_t alloc_bytes) {
            void *new_mem = device_allocator_->Alloc(alloc_bytes);
            return new_mem;
        };
        return safe_alloc(rounded_bytes);
    }
    IAllocator *device_allocator_;
};

class Tensor {
  public:
    Tensor(size_t bytes, BFCArena &arena) : p_data_(arena.Alloc(bytes)), bytes_(bytes) {}
    void *p_data_;
    size_t bytes_;
};

static BFCArena &CudaArena()
{
    static BFCArena arena(CreateCUDAAllocator());
    return arena;
}
} // namespace onnxruntime

struct OrtValue {
    onnxruntime::Tensor *tensor;
};

namespace OrtApis {
OrtValue *CreateTensorAsOrtValue(size_t bytes)
{
    return new OrtValue{new onnxruntime::Tensor(bytes, onnxruntime::CudaArena())};
}
} // namespace OrtApis

static const OrtApi ort_api = {OrtApis::CreateTensorAsOrtValue};
extern "C" const OrtApi *OrtGetApi(void) { return &ort_api; }
