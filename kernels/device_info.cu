// Device discovery for the CUDA build. Any CUDA error at query time means "no usable device"
// (a build host without a driver returns cudaErrorInsufficientDriver, not cudaErrorNoDevice).
#include <cuda_runtime.h>

#include "e8kv/cuda/device_info.cuh"

namespace e8kv::cuda {

int usable_device_count() noexcept {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls are not confused
    return 0;
  }
  return count < 0 ? 0 : count;
}

}  // namespace e8kv::cuda
