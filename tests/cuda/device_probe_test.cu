// Checks that a trivial kernel runs and its result comes back (skips without a device).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "cuda/gpu_test_main.hpp"

namespace {
__global__ void write_index(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 3 * i + 1;
}
}  // namespace

TEST(GpuDeviceProbe, KernelWritesEveryElement) {
  const int n = 1000;
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0xFF, n * sizeof(int)), cudaSuccess);
  write_index<<<(n + 255) / 256, 256>>>(d, n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int h[n];
  ASSERT_EQ(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  for (int i = 0; i < n; ++i) ASSERT_EQ(h[i], 3 * i + 1) << "i=" << i;
}

int main(int argc, char** argv) { return e8kv_gpu_test_main(argc, argv); }
