// e8kv's E8-lattice types for ggml's KV cache (GGML_TYPE_E8P / E8R3 / E8R4), compiled into
// ggml-base of a llama.cpp tree patched by scripts/fetch-llama-cpp.sh
// (integrations/llama.cpp/patches/ggml-e8kv-types.patch adds the type ids and trait entries).
//
// A ggml block is 64 values: llama.cpp has already rotated quantized K/V rows with its 64-wide
// Hadamard, so the values are near-Gaussian and go straight to e8kv's block codes. Layout:
//   fp16 gain | 8 indices of 8 values each (E8P: 2 bytes, Rvq3: 3 bytes, Rvq4: 4 bytes, little endian)
// = 18 / 26 / 34 bytes = 2.25 / 3.25 / 4.25 bits per value. Encoding scales the block to unit RMS,
// codes each 8-value piece to its nearest codeword (the codebooks' own input scale), and stores
// the norm-preserving gain ‖x‖ / ‖ĉ‖ (e8kv's default gain policy); decoding is gain · ĉ.
// The attention dot product (vec_dot, FlashAttention's K·q on the CPU) decodes in registers and
// takes q in f32 (vec_dot_type GGML_TYPE_F32).
//
// What this route cannot carry from e8kv's own pipeline: RoPE-residual or pre-RoPE keys, centring
// on a per-head mean, query-weighted key channels, 8-bit gain codes, eviction (llama.cpp's cache
// holds post-RoPE rows, rotated by a fixed Hadamard, and nothing per head). docs/accuracy.md
// measures what that costs.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/numeric/half.hpp"

namespace {

constexpr int kBlock = 64;         // values per ggml block
constexpr int kPieces = kBlock / 8;

template <class Code, int IndexBytes>
struct E8Type {
  static constexpr size_t kBlockBytes = 2 + kPieces * IndexBytes;

  static void quantize(const float* x, void* vy, int64_t k) {
    auto* y = static_cast<uint8_t*>(vy);
    for (int64_t b = 0; b < k / kBlock; ++b, x += kBlock, y += kBlockBytes) {
      double norm2 = 0.0;
      for (int i = 0; i < kBlock; ++i) norm2 += static_cast<double>(x[i]) * x[i];
      // Unit RMS for the codebook; an all-zero block codes zeros with gain 0. Non-finite input
      // gives a non-finite gain (the block decodes to NaN, as ggml's own types do).
      const double rms = std::sqrt(norm2 / kBlock);
      const float inv = rms > 0.0 ? static_cast<float>(1.0 / rms) : 0.f;
      float unit[8], code[8];
      double code2 = 0.0;
      for (int p = 0; p < kPieces; ++p) {
        for (int i = 0; i < 8; ++i) unit[i] = x[8 * p + i] * inv;
        const uint32_t index = Code::encode(unit);
        Code::decode(index, code);
        for (int i = 0; i < 8; ++i) code2 += static_cast<double>(code[i]) * code[i];
        for (int j = 0; j < IndexBytes; ++j) y[2 + IndexBytes * p + j] = static_cast<uint8_t>(index >> (8 * j));
      }
      const float gain = code2 > 0.0 ? static_cast<float>(std::sqrt(norm2 / code2)) : 0.f;
      const uint16_t g = e8kv::float_to_fp16_bits(gain);
      std::memcpy(y, &g, 2);
    }
  }

  static uint32_t index(const uint8_t* block, int p) {
    uint32_t v = 0;
    for (int j = 0; j < IndexBytes; ++j) v |= static_cast<uint32_t>(block[2 + IndexBytes * p + j]) << (8 * j);
    return v;
  }
  static float gain(const uint8_t* block) {
    uint16_t g;
    std::memcpy(&g, block, 2);
    return e8kv::fp16_bits_to_float(g);
  }

  static void dequantize(const void* vx, float* y, int64_t k) {
    const auto* x = static_cast<const uint8_t*>(vx);
    for (int64_t b = 0; b < k / kBlock; ++b, x += kBlockBytes, y += kBlock) {
      const float g = gain(x);
      for (int p = 0; p < kPieces; ++p) {
        Code::decode(index(x, p), y + 8 * p);
        for (int i = 0; i < 8; ++i) y[8 * p + i] *= g;
      }
    }
  }

  // s = Σ x̂·y over n values; x coded, y f32 (ggml_vec_dot_t, one row: nrc 1).
  static void dot(int n, float* s, const void* vx, const void* vy) {
    const auto* x = static_cast<const uint8_t*>(vx);
    const auto* y = static_cast<const float*>(vy);
    float total = 0.f;
    for (int b = 0; b < n / kBlock; ++b, x += kBlockBytes, y += kBlock) {
      float sum = 0.f, code[8];
      for (int p = 0; p < kPieces; ++p) {
        Code::decode(index(x, p), code);
        for (int i = 0; i < 8; ++i) sum += code[i] * y[8 * p + i];
      }
      total += gain(x) * sum;
    }
    *s = total;
  }
};

using E8PType = E8Type<e8kv::codebook::E8P, 2>;
using E8R3Type = E8Type<e8kv::codebook::Rvq3, 3>;
using E8R4Type = E8Type<e8kv::codebook::Rvq4, 4>;

}  // namespace

extern "C" {

// The prototypes ggml's patched headers declare (ggml-quants.h, ggml-cpu.c), with C linkage and
// exported (GGML_API): ggml-cpu calls them across shared libraries, ggml builds with hidden symbols.
#if defined(__GNUC__) || defined(__clang__)
#define E8KV_GGML_API __attribute__((visibility("default")))
#else
#define E8KV_GGML_API
#endif
E8KV_GGML_API void quantize_row_e8p_ref(const float* x, void* y, int64_t k);
E8KV_GGML_API void quantize_row_e8r3_ref(const float* x, void* y, int64_t k);
E8KV_GGML_API void quantize_row_e8r4_ref(const float* x, void* y, int64_t k);
E8KV_GGML_API void dequantize_row_e8p(const void* x, float* y, int64_t k);
E8KV_GGML_API void dequantize_row_e8r3(const void* x, float* y, int64_t k);
E8KV_GGML_API void dequantize_row_e8r4(const void* x, float* y, int64_t k);
E8KV_GGML_API void ggml_vec_dot_e8p_f32(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy, size_t by,
                                        int nrc);
E8KV_GGML_API void ggml_vec_dot_e8r3_f32(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy,
                                         size_t by, int nrc);
E8KV_GGML_API void ggml_vec_dot_e8r4_f32(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy,
                                         size_t by, int nrc);

void quantize_row_e8p_ref(const float* x, void* y, int64_t k) { E8PType::quantize(x, y, k); }
void quantize_row_e8r3_ref(const float* x, void* y, int64_t k) { E8R3Type::quantize(x, y, k); }
void quantize_row_e8r4_ref(const float* x, void* y, int64_t k) { E8R4Type::quantize(x, y, k); }
void dequantize_row_e8p(const void* x, float* y, int64_t k) { E8PType::dequantize(x, y, k); }
void dequantize_row_e8r3(const void* x, float* y, int64_t k) { E8R3Type::dequantize(x, y, k); }
void dequantize_row_e8r4(const void* x, float* y, int64_t k) { E8R4Type::dequantize(x, y, k); }
void ggml_vec_dot_e8p_f32(int n, float* s, size_t, const void* vx, size_t, const void* vy, size_t, int) {
  E8PType::dot(n, s, vx, vy);
}
void ggml_vec_dot_e8r3_f32(int n, float* s, size_t, const void* vx, size_t, const void* vy, size_t, int) {
  E8R3Type::dot(n, s, vx, vy);
}
void ggml_vec_dot_e8r4_f32(int n, float* s, size_t, const void* vx, size_t, const void* vy, size_t, int) {
  E8R4Type::dot(n, s, vx, vy);
}

}  // extern "C"
