// Batch fp16 conversions of the host hot paths (the rounding of every prefill token to the
// cache's fp16, the flush's read-back), with an F16C twin: vcvtps2ph with round-to-nearest-even
// and vcvtph2ps are the IEEE conversions that numeric/half.hpp writes out in integer arithmetic,
// so both give the same bits (subnormals, overflow to infinity, NaN payloads), except that
// vcvtph2ps quiets a signalling fp16 NaN, which the callers never pass: they convert rows already
// checked finite. tests/numeric/fp16_batch_test.cpp checks every fp16 pattern and a dense sweep
// of floats.
// Internal (not installed).
#pragma once

#include <cstddef>
#include <cstdint>

namespace e8kv::detail {

/// floats_to_fp16_bits (numeric/half.hpp), F16C where the CPU has it (cpu_has_avx2_fma()).
void floats_to_fp16_bits_batch(const float* in, uint16_t* out, size_t n);
/// fp16_bits_to_floats (numeric/half.hpp), F16C where the CPU has it.
void fp16_bits_to_floats_batch(const uint16_t* in, float* out, size_t n);

}  // namespace e8kv::detail
