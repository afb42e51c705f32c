// mat.h - the ATen-like library's interface (mat.cpp).
#ifndef ATTRIB_MAT_H
#define ATTRIB_MAT_H
#include <stddef.h>
namespace mat {
struct Tensor {
    void *data;
    size_t bytes;
    bool zeroed = false;
};
Tensor empty(size_t n);
Tensor zeros(size_t n);
} // namespace mat
#endif
