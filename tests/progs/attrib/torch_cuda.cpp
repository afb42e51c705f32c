// torch_cuda.cpp - libtorch_cuda.so: the CUDA factory kernels, registered with the dispatcher
// of libtorch_cpu.so at load (torchlike.h).
#include "torchlike.h"

namespace at {
namespace detail {
Tensor empty_cuda(size_t n)
{
    return empty_generic(n, c10::cuda::CUDACachingAllocator::get(), c10::DeviceType::CUDA);
}
Tensor empty_strided_cuda(size_t n, size_t stride)
{
    return empty_strided_generic(n, stride, c10::cuda::CUDACachingAllocator::get(),
                                 c10::DeviceType::CUDA);
}
} // namespace detail
namespace native {
Tensor empty_cuda(size_t n) { return detail::empty_cuda(n); }
Tensor empty_strided_cuda(size_t n, size_t stride) { return detail::empty_strided_cuda(n, stride); }
} // namespace native
namespace {
namespace {
Tensor wrapper_CUDA_memory_format_empty(size_t n) { return native::empty_cuda(n); }
Tensor wrapper_CUDA_empty_strided(size_t n, size_t stride)
{
    return native::empty_strided_cuda(n, stride);
}
const Kernels kernels = {
    c10::impl::wrap_kernel_functor_unboxed_<Tensor(size_t), wrapper_CUDA_memory_format_empty>::call,
    wrapper_CUDA_empty_strided};
struct Register {
    Register() { register_cuda_kernels(&kernels); }
} registered;
} // namespace
} // namespace
} // namespace at
