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
// Decoding and the dot product have an AVX2 twin of the scalar code, chosen at run time (ggml-base
// is compiled for the baseline ISA): FlashAttention decodes every K and V row once per query row,
// so decoding is this type's cost. The twin is equal bit for bit: decoding is exact lattice
// arithmetic followed by the same unfused multiplies (this file is compiled with
// -ffp-contract=off, and the twin enables AVX2 without FMA); the dot product accumulates lane i
// of every 8-value piece in lane i and reduces the 8 lanes in one fixed order in both.
//
// What this route cannot carry from e8kv's own pipeline: RoPE-residual or pre-RoPE keys, centring
// on a per-head mean, query-weighted key channels, 8-bit gain codes, eviction (llama.cpp's cache
// holds post-RoPE rows, rotated by a fixed Hadamard, and nothing per head). docs/accuracy.md
// measures what that costs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define E8KV_GGML_AVX2 1
#define E8KV_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define E8KV_GGML_AVX2 0
#endif

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/numeric/half.hpp"

namespace {

constexpr int kBlock = 64;         // values per ggml block
constexpr int kPieces = kBlock / 8;

// The 8 lanes of a piece's products summed in the AVX2 twin's order:
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float reduce_lanes(const float l[8]) {
  const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

#if E8KV_GGML_AVX2
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// E8P::decode_lattice in 8 lanes: |a_i| from the pattern entry, signs from the index, ±¼ shift.
E8KV_TARGET_AVX2 inline __m256 e8p_lattice8(uint32_t index) {
  namespace d = e8kv::codebook::e8p_detail;
  const uint32_t entry = d::tables().pattern[(index >> 8) & 0xFFu];
  const uint32_t signs = (index >> 1) & 0x7Fu;
  uint32_t parity = signs ^ (signs >> 4);
  parity ^= parity >> 2;
  parity ^= parity >> 1;
  const uint32_t negative = (signs << 1) | ((parity ^ (entry >> 16)) & 1u);
  const __m256i code_shift = _mm256_setr_epi32(14, 12, 10, 8, 6, 4, 2, 0);  // e8p_detail::code_shift(i)
  const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(entry)), code_shift),
                                         _mm256_set1_epi32(3));
  const __m256 magnitude = _mm256_add_ps(_mm256_cvtepi32_ps(codes), _mm256_set1_ps(0.5f));
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i is_negative =
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(negative)), lane_bit), lane_bit);
  const __m256 sign = _mm256_castsi256_ps(_mm256_and_si256(is_negative, _mm256_set1_epi32(INT32_MIN)));
  const float shift = (index & 1u) ? -0.25f : 0.25f;
  return _mm256_add_ps(_mm256_xor_ps(magnitude, sign), _mm256_set1_ps(shift));
}

// E81B::decode_lattice in 8 lanes: 4-bit fields of the point word, ·½ − 2.
E8KV_TARGET_AVX2 inline __m256 e81b_lattice8(uint32_t index) {
  const uint32_t word = e8kv::codebook::e81b_detail::tables().point[index & 0xFFu];
  const __m256i fields = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(15));
  return _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(fields), _mm256_set1_ps(0.5f)), _mm256_set1_ps(2.0f));
}

// Code::decode in 8 lanes, the scalar code's operations in the same order.
template <class Code>
E8KV_TARGET_AVX2 inline __m256 decode8(uint32_t index) {
  using namespace e8kv::codebook;
  if constexpr (std::is_same_v<Code, E8P>) {
    return _mm256_mul_ps(e8p_lattice8(index), _mm256_set1_ps(E8P::kInverseInputScale));
  } else {
    const __m256 c1 = e8p_lattice8(index & 0xFFFFu);
    __m256 c2;
    if constexpr (std::is_same_v<Code, Rvq4>) {
      c2 = e8p_lattice8(index >> 16);
    } else {
      static_assert(std::is_same_v<Code, Rvq3>, "E8 ggml types: E8P, Rvq3, Rvq4");
      c2 = e81b_lattice8(index >> 16);
    }
    const __m256 sum = _mm256_add_ps(c1, _mm256_mul_ps(c2, _mm256_set1_ps(Code::kInverseResidualScale)));
    return _mm256_mul_ps(sum, _mm256_set1_ps(Code::kInverseInputScale));
  }
}

E8KV_TARGET_AVX2 inline float reduce8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l0+l4, l1+l5, l2+l6, l3+l7
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));                                          // (a0+a2), (a1+a3)
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
#endif

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
#if E8KV_GGML_AVX2
    if (has_avx2()) return dequantize_avx2(vx, y, k);
#endif
    dequantize_scalar(vx, y, k);
  }
  static void dequantize_scalar(const void* vx, float* y, int64_t k) {
    const auto* x = static_cast<const uint8_t*>(vx);
    for (int64_t b = 0; b < k / kBlock; ++b, x += kBlockBytes, y += kBlock) {
      const float g = gain(x);
      for (int p = 0; p < kPieces; ++p) {
        Code::decode(index(x, p), y + 8 * p);
        for (int i = 0; i < 8; ++i) y[8 * p + i] *= g;
      }
    }
  }

  // s = Σ x̂·y over n values; x coded, y f32 (ggml_vec_dot_t, one row: nrc 1). Per block, lane i
  // sums ĉ_i·y_i over the 8 pieces, the lanes are reduced (reduce_lanes), then scaled by the gain.
  static void dot(int n, float* s, const void* vx, const void* vy) {
#if E8KV_GGML_AVX2
    if (has_avx2()) return dot_avx2(n, s, vx, vy);
#endif
    dot_scalar(n, s, vx, vy);
  }
  static void dot_scalar(int n, float* s, const void* vx, const void* vy) {
    const auto* x = static_cast<const uint8_t*>(vx);
    const auto* y = static_cast<const float*>(vy);
    float total = 0.f;
    for (int b = 0; b < n / kBlock; ++b, x += kBlockBytes, y += kBlock) {
      float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, code[8];
      for (int p = 0; p < kPieces; ++p) {
        Code::decode(index(x, p), code);
        for (int i = 0; i < 8; ++i) lane[i] += code[i] * y[8 * p + i];
      }
      total += gain(x) * reduce_lanes(lane);
    }
    *s = total;
  }

#if E8KV_GGML_AVX2
  E8KV_TARGET_AVX2 static void dequantize_avx2(const void* vx, float* y, int64_t k) {
    const auto* x = static_cast<const uint8_t*>(vx);
    for (int64_t b = 0; b < k / kBlock; ++b, x += kBlockBytes, y += kBlock) {
      const __m256 g = _mm256_set1_ps(gain(x));
      for (int p = 0; p < kPieces; ++p) _mm256_storeu_ps(y + 8 * p, _mm256_mul_ps(decode8<Code>(index(x, p)), g));
    }
  }
  E8KV_TARGET_AVX2 static void dot_avx2(int n, float* s, const void* vx, const void* vy) {
    const auto* x = static_cast<const uint8_t*>(vx);
    const auto* y = static_cast<const float*>(vy);
    float total = 0.f;
    for (int b = 0; b < n / kBlock; ++b, x += kBlockBytes, y += kBlock) {
      __m256 lane = _mm256_setzero_ps();
      for (int p = 0; p < kPieces; ++p)
        lane = _mm256_add_ps(lane, _mm256_mul_ps(decode8<Code>(index(x, p)), _mm256_loadu_ps(y + 8 * p)));
      total += gain(x) * reduce8(lane);
    }
    *s = total;
  }
#endif
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
