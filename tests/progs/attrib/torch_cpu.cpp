// torch_cpu.cpp - libtorch_cpu.so: the dispatcher's entries, the generic empty, zeros and
// _to_copy (torchlike.h).
#include "torchlike.h"
#include <cstdlib>
#include <cstring>

namespace c10 {
namespace {
struct DefaultCPUAllocator : Allocator {
    void *allocate(size_t n) override { return std::malloc(n); }
};
} // namespace
Allocator *GetCPUAllocator()
{
    static DefaultCPUAllocator a;
    return &a;
}
} // namespace c10

namespace at {
static const Kernels *cuda_kernels;
void register_cuda_kernels(const Kernels *k) { cuda_kernels = k; }

namespace detail {
Tensor empty_generic(size_t n, c10::Allocator *a, c10::DeviceType d)
{
    Tensor t;
    t.data = a->allocate(n);
    t.nbytes = n;
    t.device = d;
    return t;
}
Tensor empty_strided_generic(size_t n, size_t stride, c10::Allocator *a, c10::DeviceType d)
{
    return empty_generic(n * (stride ? stride : 1), a, d);
}
} // namespace detail

namespace native {
Tensor zeros(size_t n, c10::DeviceType d)
{
    Tensor t = at::empty(n, d);
    if (d == c10::DeviceType::CPU)
        std::memset(t.data, 0, n);
    return t;
}
Tensor _to_copy(const Tensor &self, c10::DeviceType d)
{
    Tensor t = at::empty_strided(self.nbytes, 1, d);
    return t;
}
Tensor to(const Tensor &self, c10::DeviceType d) { return self.device == d ? self : _to_copy(self, d); }
} // namespace native

namespace {
// BackendSelect's kernel for a factory: picks the backend, then redispatches
Tensor empty_memory_format_backend_select(size_t n) { return _ops::empty_memory_format::redispatch(n); }
} // namespace

namespace _ops {
Tensor empty_memory_format::call(size_t n, c10::DeviceType d)
{
    if (d == c10::DeviceType::CUDA)
        return c10::impl::wrap_kernel_functor_unboxed_<Tensor(size_t),
                                                       empty_memory_format_backend_select>::call(n);
    return detail::empty_generic(n, c10::GetCPUAllocator(), d);
}
Tensor empty_memory_format::redispatch(size_t n) { return cuda_kernels->empty(n); }
Tensor empty_strided::call(size_t n, size_t stride, c10::DeviceType d)
{
    if (d == c10::DeviceType::CUDA)
        return cuda_kernels->empty_strided(n, stride);
    return detail::empty_strided_generic(n, stride, c10::GetCPUAllocator(), d);
}
Tensor zeros::call(size_t n, c10::DeviceType d) { return native::zeros(n, d); }
Tensor to_dtype_layout::call(const Tensor &self, c10::DeviceType d) { return native::to(self, d); }
} // namespace _ops
} // namespace at
