// ort_genai.cpp - libonnxruntime-genai.so: the KV cache over ONNX Runtime's C API (ortlike.h).
#include "ortlike.h"
#include <vector>

namespace Generators {
struct DefaultKeyValueCache {
    DefaultKeyValueCache(int layers, size_t mib)
    {
        for (int i = 0; i < layers; i++)
            presents_.push_back(Ort::Value::CreateTensor(mib * ((size_t)1 << 20)));
    }
    std::vector<Ort::Value> presents_;
};
struct Logits {
    Logits() : output_(Ort::Value::CreateTensor((size_t)4 << 20)) {}
    Ort::Value output_;
};
} // namespace Generators

extern "C" void *OgaCreateGenerator(int layers, size_t mib, int serve)
{
    if (serve)
        new Generators::Logits();
    return new Generators::DefaultKeyValueCache(layers, mib);
}
