// Device discovery (host API of e8kv::cuda).
#pragma once

namespace e8kv::cuda {

/// Number of CUDA devices that can run kernels; 0 when the driver or device is missing
/// or any CUDA error occurs during the query.
int usable_device_count() noexcept;

}  // namespace e8kv::cuda
