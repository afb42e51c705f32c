// mat.cpp - libmat.so, an ATen-like `empty` family over libmc10.so's caching allocator.
#include "mat.h"
#include "mc10.h"
#include <cstring>

namespace mat {
namespace detail {
Tensor empty_generic(size_t n) { return Tensor{mc10::cuda::get().malloc(n), n}; }
} // namespace detail
Tensor empty(size_t n) { return detail::empty_generic(n); }
Tensor zeros(size_t n)
{
    Tensor t = empty(n);
    t.zeroed = true;
    return t;
}
} // namespace mat
