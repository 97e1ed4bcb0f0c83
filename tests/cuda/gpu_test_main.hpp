// main() for GPU test binaries: skips (exit 77) when no usable device exists.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

#include "e8kv/cuda/device_info.cuh"

inline int e8kv_gpu_test_main(int argc, char** argv) {
  if (e8kv::cuda::usable_device_count() == 0) {
    std::printf("no usable CUDA device: skipping\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
