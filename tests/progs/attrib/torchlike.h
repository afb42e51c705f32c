// torchlike.h - libtorch's shape over three libraries (tests/integration/test_attrib_shapes.py):
// libc10_cuda.so (c10::cuda::CUDACachingAllocator), libtorch_cpu.so (the dispatcher's
// at::_ops::*::call, at::detail::empty_generic, at::native::zeros and _to_copy), libtorch_cuda.so
// (at::native::empty_cuda, empty_strided_cuda behind the dispatcher's CUDA kernels); the
// functions of its headers (torch::empty, at::empty, at::Tensor::to) compile into the caller.
// torch::empty's way down is libtorch 2.11's: empty_memory_format::call, the backend selection's
// c10::impl::wrap_kernel_functor_unboxed_<...>::call, ::redispatch, the CUDA kernel's wrapper.
#ifndef ATTRIB_TORCHLIKE_H
#define ATTRIB_TORCHLIKE_H
#include <stddef.h>

namespace c10 {
enum class DeviceType { CPU, CUDA };
struct Allocator {
    virtual void *allocate(size_t n) = 0;
};
Allocator *GetCPUAllocator();
namespace cuda {
namespace CUDACachingAllocator {
Allocator *get();
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

namespace at {
struct Tensor {
    void *data = nullptr;
    size_t nbytes = 0;
    c10::DeviceType device = c10::DeviceType::CPU;
    Tensor to(c10::DeviceType d) const;
};
namespace detail {
Tensor empty_generic(size_t n, c10::Allocator *a, c10::DeviceType d);
Tensor empty_strided_generic(size_t n, size_t stride, c10::Allocator *a, c10::DeviceType d);
} // namespace detail
namespace _ops {
struct empty_memory_format {
    static Tensor call(size_t n, c10::DeviceType d);
    static Tensor redispatch(size_t n); // past the backend's selection: the CUDA kernel
};
struct empty_strided {
    static Tensor call(size_t n, size_t stride, c10::DeviceType d);
};
struct zeros {
    static Tensor call(size_t n, c10::DeviceType d);
};
struct to_dtype_layout {
    static Tensor call(const Tensor &self, c10::DeviceType d);
};
} // namespace _ops
// the dispatcher's kernel table: the CUDA kernels register at load (libtorch_cuda.so)
struct Kernels {
    Tensor (*empty)(size_t n);
    Tensor (*empty_strided)(size_t n, size_t stride);
};
void register_cuda_kernels(const Kernels *k);
} // namespace at

namespace c10 {
namespace impl {
// the dispatcher's unboxed wrapper around a kernel function, instantiated in the library that
// registers the kernel (libtorch_cpu's backend selection, libtorch_cuda's CUDA kernels)
template <class Sig, Sig *F> struct wrap_kernel_functor_unboxed_;
template <class R, class... A, R (*F)(A...)> struct wrap_kernel_functor_unboxed_<R(A...), F> {
    static R call(A... a) { return F(a...); }
};
} // namespace impl
} // namespace c10

namespace at {

inline Tensor empty(size_t n, c10::DeviceType d) { return _ops::empty_memory_format::call(n, d); }
inline Tensor empty_strided(size_t n, size_t stride, c10::DeviceType d)
{
    return _ops::empty_strided::call(n, stride, d);
}
inline Tensor zeros(size_t n, c10::DeviceType d) { return _ops::zeros::call(n, d); }
inline Tensor Tensor::to(c10::DeviceType d) const { return _ops::to_dtype_layout::call(*this, d); }
} // namespace at

namespace torch {
constexpr c10::DeviceType kCUDA = c10::DeviceType::CUDA;
constexpr c10::DeviceType kCPU = c10::DeviceType::CPU;
inline at::Tensor empty(size_t n, c10::DeviceType d) { return at::empty(n, d); }
inline at::Tensor zeros(size_t n, c10::DeviceType d) { return at::zeros(n, d); }
} // namespace torch
#endif
