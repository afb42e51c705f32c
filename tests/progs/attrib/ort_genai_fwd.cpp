// ort_genai_fwd.cpp - libonnxruntime-genai.so as onnxruntime-genai writes it
// (tests/integration/test_attrib_shapes.py, the ort_fwd shape): its KV cache reaches ONNX
// Runtime's C API (ortlike.h) through a static helper of its own that only forwards, as genai's
// CreateTensor over OrtApi::CreateTensorAsOrtValue does. The helper is a layer: the KV cache's
// constructor is the code that asked, though at start-up it is the helper's one client.
#include "ortlike.h"
#include <vector>

namespace Generators {
static OrtValue *CreateTensor(size_t bytes) { return OrtGetApi()->CreateTensorAsOrtValue(bytes); }

struct DefaultKeyValueCache {
    DefaultKeyValueCache(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            presents_.push_back(CreateTensor(mib * ((size_t)1 << 20)));
    }
    std::vector<OrtValue *> presents_;
};
struct Logits {
    Logits() : output_(CreateTensor((size_t)4 << 20)) {}
    OrtValue *output_;
};
} // namespace Generators

extern "C" void *OgaCreateGenerator(int layers, size_t mib, int serve)
{
    if (serve)
        new Generators::Logits();
    return new Generators::DefaultKeyValueCache(layers, mib);
}
