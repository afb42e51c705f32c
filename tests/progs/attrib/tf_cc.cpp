// tf_cc.cpp - libtensorflow_cc.so.2: StreamExecutor's device allocator and the GPU process
// state (tflike.h).
#include "cuda_min.h"
#include "tflike.h"
#include <cstdio>
#include <cstdlib>

namespace stream_executor {
namespace gpu {
struct GpuDriver {
    __attribute__((noinline)) static void *DeviceAllocate(size_t bytes)
    {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, bytes) != 0) {
            std::fprintf(stderr, "tensorflow: failed to allocate %zu bytes\n", bytes);
            std::exit(1);
        }
        return (void *)p;
    }
};
class GpuExecutor {
  public:
    __attribute__((noinline)) void *Allocate(size_t size) { return GpuDriver::DeviceAllocate(size); }
};
} // namespace gpu
class DeviceMemAllocator : public tsl::SubAllocator {
  public:
    void *Alloc(size_t alignment, size_t num_bytes, size_t *bytes_received) override
    {
        (void)alignment;
        *bytes_received = num_bytes;
        return executor_.Allocate(num_bytes);
    }
    gpu::GpuExecutor executor_;
};
} // namespace stream_executor

namespace tensorflow {
GPUProcessState *GPUProcessState::singleton()
{
    static GPUProcessState s;
    return &s;
}
tsl::Allocator *GPUProcessState::GetGPUAllocator(int tf_device_id)
{
    (void)tf_device_id;
    if (!gpu_allocator_)
        gpu_allocator_ = tsl::NewBFCAllocator(new stream_executor::DeviceMemAllocator());
    return gpu_allocator_;
}
} // namespace tensorflow
