// ortlike.h - ONNX Runtime's shape (tests/integration/test_attrib_shapes.py): a CUDA allocator in
// libonnxruntime_providers_cuda.so under the BFC arena of libonnxruntime.so, which grows through a
// lambda in onnxruntime::BFCArena::Extend; its C API (OrtApis::*) reached through a function
// table by onnxruntime-genai (libonnxruntime-genai.so: Generators::DefaultKeyValueCache), whose
// C++ API wrapper (Ort::Value::CreateTensor) is inline.
#ifndef ATTRIB_ORTLIKE_H
#define ATTRIB_ORTLIKE_H
#include <stddef.h>

namespace onnxruntime {
class IAllocator {
  public:
    virtual ~IAllocator() {}
    virtual void *Alloc(size_t size) = 0;
};
IAllocator *CreateCUDAAllocator(); // libonnxruntime_providers_cuda.so
} // namespace onnxruntime

struct OrtValue;
struct OrtApi {
    OrtValue *(*CreateTensorAsOrtValue)(size_t bytes);
};
extern "C" const OrtApi *OrtGetApi(void);

namespace Ort {
struct Value {
    OrtValue *p;
    static Value CreateTensor(size_t bytes) { return Value{OrtGetApi()->CreateTensorAsOrtValue(bytes)}; }
};
} // namespace Ort

extern "C" void *OgaCreateGenerator(int layers, size_t mib, int serve); // libonnxruntime-genai.so
#endif
