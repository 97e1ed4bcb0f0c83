// Inner loops of the CPU decode attention (CompressedKV::attend), compiled twice: for the
// baseline x86-64 ISA and with AVX2, chosen at run time. No FMA in either: each float is the
// result of the same multiplies and adds in the same order, so both builds give bit-identical
// outputs (tests/attend_cpu_test.cpp checks it); only the vector width differs.
//
// Each kernel is a force-inlined body plus two `flatten` wrappers, so everything it calls
// (block decoders, RoPE, dot products) is compiled into the wrapper with the wrapper's ISA.
// Host only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "e8kv/platform.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"
#include "e8kv/quant/vector_quantizer.hpp"

namespace e8kv::attend_cpu {

// Eight floats as one value: the kernels' unit of work (one E8 block, one AVX register, two
// SSE registers in the baseline build). Lane arithmetic only, so both builds round alike.
#if defined(__GNUC__) || defined(__clang__)
// f32x8 never crosses a call (every helper is force-inlined), so the ABI note is moot; it is
// emitted at instantiation, hence no push/pop.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f32x8 __attribute__((vector_size(32)));
#else
#error "e8kv/cache/attend_cpu.hpp needs GCC or Clang vector extensions"
#endif
E8KV_FORCE_INLINE f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
E8KV_FORCE_INLINE void store8(float* p, const f32x8& v) { std::memcpy(p, &v, sizeof v); }
E8KV_FORCE_INLINE f32x8 splat8(float x) { return f32x8{x, x, x, x, x, x, x, x}; }

/// out[g·out_stride] = scale·dot_product(q + g·d, k, d) for g < NG, with dot_product's exact
/// summation order (lane j sums elements j mod 8, then a fixed tree); the NG sums run side by
/// side in registers.
template <int NG>
E8KV_FORCE_INLINE void dot_group(const float* q, int d, const float* k, float scale, float* out, size_t out_stride) {
  f32x8 acc[NG];
  for (int g = 0; g < NG; ++g) acc[g] = splat8(0.f);
  int i = 0;
  for (; i + 8 <= d; i += 8) {
    const f32x8 kv = load8(k + i);
    for (int g = 0; g < NG; ++g) acc[g] += load8(q + static_cast<size_t>(g) * d + i) * kv;
  }
  for (int g = 0; g < NG; ++g)
    for (int j = 0; j < 8 && i + j < d; ++j) acc[g][j] += q[static_cast<size_t>(g) * d + i + j] * k[i + j];
  for (int g = 0; g < NG; ++g) {
    const f32x8 a = acc[g];
    out[static_cast<size_t>(g) * out_stride] = (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))) * scale;
  }
}

/// dot_group over any number of query heads G (groups of 4, then the rest).
E8KV_FORCE_INLINE void dot_heads(const float* q, int G, int d, const float* k, float scale, float* out,
                                 size_t out_stride) {
  int g = 0;
  for (; g + 4 <= G; g += 4) dot_group<4>(q + static_cast<size_t>(g) * d, d, k, scale, out + g * out_stride, out_stride);
  switch (G - g) {
    case 3: dot_group<3>(q + static_cast<size_t>(g) * d, d, k, scale, out + g * out_stride, out_stride); break;
    case 2: dot_group<2>(q + static_cast<size_t>(g) * d, d, k, scale, out + g * out_stride, out_stride); break;
    case 1: dot_group<1>(q + static_cast<size_t>(g) * d, d, k, scale, out + g * out_stride, out_stride); break;
    default: break;
  }
}

/// RoPE for the attention path, where positions mostly increase: the product of the table's two
/// upper levels (position bits 10-30) changes once per 1024 positions, so it is cached and a key
/// costs one complex product per pair to get cos/sin, then the rotation. The floats may differ
/// from rope_table_cos_sin's in the last bit (products associated differently), which attention
/// tolerates; codes never go through this path. Positions must be >= 0 (checked by the caller).
/// Floats per row of the planar low-level table: the pairs, padded to whole 8-float vectors.
inline int planar_rope_row_floats(int pairs) { return (pairs + 7) / 8 * 8; }

/// The RoPE table's low level (position bits 0-9) split into planar rows: 1024 cos rows, then
/// 1024 sin rows, each planar_rope_row_floats(pairs) floats (padding: cos 1, sin 0). Built once
/// per CacheCodecs, read by IncrementalRope.
inline std::vector<float> build_planar_rope_low(const float* table, int pairs) {
  const size_t row = static_cast<size_t>(planar_rope_row_floats(pairs));
  std::vector<float> out(2 * 1024 * row, 0.f);
  for (size_t p = 0; p < 1024; ++p)
    for (size_t i = 0; i < row; ++i) {
      const bool real = i < static_cast<size_t>(pairs);
      out[p * row + i] = real ? table[(p * static_cast<size_t>(pairs) + i) * 2] : 1.f;
      out[(1024 + p) * row + i] = real ? table[(p * static_cast<size_t>(pairs) + i) * 2 + 1] : 0.f;
    }
  return out;
}

class IncrementalRope {
 public:
  /// `planar_low`: build_planar_rope_low(view.table, view.rotary_dim / 2), kept alive by the caller.
  IncrementalRope(const quant::RopeTableView& view, const float* planar_low)
      : view_(view), pairs_(view.rotary_dim / 2), padded_(planar_rope_row_floats(pairs_)), planar_low_(planar_low) {
    if (view_.table == nullptr || pairs_ == 0) return;
    upper_cos_.assign(static_cast<size_t>(padded_), 1.f);
    upper_sin_.assign(static_cast<size_t>(padded_), 0.f);
    cos_.assign(static_cast<size_t>(padded_), 1.f);
    sin_.assign(static_cast<size_t>(padded_), 0.f);
  }

  E8KV_FORCE_INLINE void apply(float* x, int32_t position) {
    if (view_.table == nullptr || pairs_ == 0) return;
    const uint32_t p = static_cast<uint32_t>(position);
    if ((p >> 10) != upper_) refresh(p >> 10);
    const float* lc = planar_low_ + static_cast<size_t>(p & 1023u) * padded_;
    const float* ls = planar_low_ + static_cast<size_t>(1024u + (p & 1023u)) * padded_;
    float* c = cos_.data();
    float* s = sin_.data();
    for (int i = 0; i < padded_; i += 8) {
      const f32x8 c0 = load8(lc + i), s0 = load8(ls + i), uc = load8(upper_cos_.data() + i),
                  us = load8(upper_sin_.data() + i);
      store8(c + i, c0 * uc - s0 * us);
      store8(s + i, c0 * us + s0 * uc);
    }
    if (view_.layout == transform::RopeLayout::kSplitHalf) {
      float* a = x;
      float* b = x + pairs_;
      int i = 0;
      for (; i + 8 <= pairs_; i += 8) {
        const f32x8 a0 = load8(a + i), b0 = load8(b + i), ci = load8(c + i), si = load8(s + i);
        store8(a + i, a0 * ci - b0 * si);
        store8(b + i, a0 * si + b0 * ci);
      }
      for (; i < pairs_; ++i) {
        const float a0 = a[i], b0 = b[i];
        a[i] = a0 * c[i] - b0 * s[i];
        b[i] = a0 * s[i] + b0 * c[i];
      }
    } else {
      for (int i = 0; i < pairs_; ++i) {
        const float a0 = x[2 * i], b0 = x[2 * i + 1];
        x[2 * i] = a0 * c[i] - b0 * s[i];
        x[2 * i + 1] = a0 * s[i] + b0 * c[i];
      }
    }
  }

 private:
  void refresh(uint32_t upper) {
    upper_ = upper;
    const size_t stride = static_cast<size_t>(pairs_) * 2u;
    const float* mid = view_.table + static_cast<size_t>(1024u + (upper & 1023u)) * stride;
    const float* high = view_.table + static_cast<size_t>(2048u + (upper >> 10)) * stride;
    for (int i = 0; i < pairs_; ++i) {
      const float c1 = mid[2 * i], s1 = mid[2 * i + 1], c2 = high[2 * i], s2 = high[2 * i + 1];
      upper_cos_[static_cast<size_t>(i)] = c1 * c2 - s1 * s2;
      upper_sin_[static_cast<size_t>(i)] = c1 * s2 + s1 * c2;
    }
  }

  quant::RopeTableView view_;
  int pairs_, padded_;
  const float* planar_low_;
  uint32_t upper_ = 0xFFFFFFFFu;
  std::vector<float> upper_cos_, upper_sin_, cos_, sin_;
};

// ---- kernel bodies --------------------------------------------------------------------------

/// rows[k·d ..] = decode_vector_with_gain(codes + k·code_bytes, gains[k]) for k < m.
template <class Code>
E8KV_FORCE_INLINE void decode_rows_body(const uint8_t* codes, size_t code_bytes, const float* gains, int64_t m, int d,
                                        float* rows) {
  for (int64_t k = 0; k < m; ++k)
    quant::decode_vector_with_gain<Code>(codes + static_cast<size_t>(k) * code_bytes, gains[k], d,
                                         rows + static_cast<size_t>(k) * d);
}

/// What the pre-RoPE key path needs besides the decoded, un-rotated rows of a tile.
struct KeyTileArgs {
  int d = 0, G = 0;
  const float* q = nullptr;          ///< G·d query heads of this KV head
  const float* inv_scale = nullptr;  ///< d inverse key channel scales, or null
  const float* mean = nullptr;       ///< d key mean (pre-RoPE), or null
  float softmax_scale = 1.f;
  float* logits = nullptr;           ///< G rows of `n` logits
  size_t n = 0;
};

/// For the m keys of a tile starting at token t0: k = S⁻¹·row + μ, RoPE at its position, then
/// the G scaled dot products into logits[g·n + t0 + k].
E8KV_FORCE_INLINE void finish_key_tile_body(const KeyTileArgs& a, float* rows, int64_t t0, int64_t m,
                                            const int32_t* positions, IncrementalRope& rope) {
  const int d = a.d;
  for (int64_t k = 0; k < m; ++k) {
    float* kt = rows + static_cast<size_t>(k) * d;  // d is a multiple of 8
    if (a.inv_scale != nullptr)
      for (int i = 0; i < d; i += 8) store8(kt + i, load8(kt + i) * load8(a.inv_scale + i));
    if (a.mean != nullptr)
      for (int i = 0; i < d; i += 8) store8(kt + i, load8(kt + i) + load8(a.mean + i));
    rope.apply(kt, positions[t0 + k]);
    dot_heads(a.q, a.G, d, kt, a.softmax_scale, a.logits + t0 + k, a.n);
  }
}

/// logits[g·n + t0 + k] = (q_g·row_k + q_dot_mu[g])·scale for the m rows of a tile, or
/// (q_g·row_k)·scale when q_dot_mu is null. Used for rotated-basis keys (post-RoPE storage, q
/// rotated, q_dot_mu = q·μ) and for rows already in the engine's basis (fp16 window or codec).
E8KV_FORCE_INLINE void score_rows_body(const float* q, const float* q_dot_mu, int G, int d, float scale,
                                       const float* rows, int64_t t0, int64_t m, float* logits, size_t n) {
  float dots[64];
  for (int64_t k = 0; k < m; ++k) {
    for (int g0 = 0; g0 < G; g0 += 64) {
      const int gn = G - g0 < 64 ? G - g0 : 64;
      dot_heads(q + static_cast<size_t>(g0) * d, gn, d, rows + static_cast<size_t>(k) * d, 1.f, dots, 1);
      for (int g = 0; g < gn; ++g)
        logits[static_cast<size_t>(g0 + g) * n + static_cast<size_t>(t0 + k)] =
            q_dot_mu != nullptr ? (dots[g] + q_dot_mu[g0 + g]) * scale : dots[g] * scale;
    }
  }
}

/// acc[g·d + i] += p[g·n + t]·v[i] for the G query heads: one token's share of the output.
E8KV_FORCE_INLINE void accumulate_token(const float* v, const float* p, size_t n, int64_t t, int G, int d,
                                        float* acc) {
  for (int g = 0; g < G; ++g) {
    const f32x8 w = splat8(p[static_cast<size_t>(g) * n + static_cast<size_t>(t)]);
    float* a = acc + static_cast<size_t>(g) * d;
    for (int i = 0; i < d; i += 8) store8(a + i, load8(a + i) + w * load8(v + i));
  }
}

/// acc[g·d + i] += p[g·n + t]·v_t[i] over the coded tokens t < nc, v_t decoded from its codes and
/// gain (rotated basis), for each of the G query heads.
template <class Code>
E8KV_FORCE_INLINE void accumulate_values_body(const uint8_t* codes, size_t code_bytes, const float* gains,
                                              const float* p, size_t n, int64_t nc, int G, int d, float* acc) {
  alignas(32) float v[512];
  for (int64_t t = 0; t < nc; ++t) {
    quant::decode_vector_with_gain<Code>(codes + static_cast<size_t>(t) * code_bytes, gains[t], d, v);
    accumulate_token(v, p, n, t, G, d, acc);
  }
}

/// acc[g·d + i] += p[g·n + t0 + k]·rows[k·d + i] for m rows given as floats (fp16 window or codec).
E8KV_FORCE_INLINE void accumulate_rows_body(const float* rows, const float* p, size_t n, int64_t t0, int64_t m, int G,
                                            int d, float* acc) {
  for (int64_t k = 0; k < m; ++k) accumulate_token(rows + static_cast<size_t>(k) * d, p, n, t0 + k, G, d, acc);
}

// ---- the two builds of each kernel, and the run-time choice ---------------------------------

template <class Code>
E8KV_TARGET_BASE_FLAT inline void decode_rows_base(const uint8_t* c, size_t cb, const float* g, int64_t m, int d, float* r) {
  decode_rows_body<Code>(c, cb, g, m, d, r);
}
template <class Code>
E8KV_TARGET_AVX2_FLAT inline void decode_rows_avx2(const uint8_t* c, size_t cb, const float* g, int64_t m, int d, float* r) {
  decode_rows_body<Code>(c, cb, g, m, d, r);
}
template <class Code>
inline void decode_rows(const uint8_t* c, size_t cb, const float* g, int64_t m, int d, float* r) {
  if (cpu_has_avx2()) return decode_rows_avx2<Code>(c, cb, g, m, d, r);
  decode_rows_base<Code>(c, cb, g, m, d, r);
}

E8KV_TARGET_BASE_FLAT inline void finish_key_tile_base(const KeyTileArgs& a, float* rows, int64_t t0, int64_t m,
                                                  const int32_t* pos, IncrementalRope& rope) {
  finish_key_tile_body(a, rows, t0, m, pos, rope);
}
E8KV_TARGET_AVX2_FLAT inline void finish_key_tile_avx2(const KeyTileArgs& a, float* rows, int64_t t0, int64_t m,
                                                  const int32_t* pos, IncrementalRope& rope) {
  finish_key_tile_body(a, rows, t0, m, pos, rope);
}
inline void finish_key_tile(const KeyTileArgs& a, float* rows, int64_t t0, int64_t m, const int32_t* pos,
                            IncrementalRope& rope) {
  if (cpu_has_avx2()) return finish_key_tile_avx2(a, rows, t0, m, pos, rope);
  finish_key_tile_base(a, rows, t0, m, pos, rope);
}

E8KV_TARGET_BASE_FLAT inline void score_rows_base(const float* q, const float* mu, int G, int d, float s,
                                                     const float* rows, int64_t t0, int64_t m, float* l, size_t n) {
  score_rows_body(q, mu, G, d, s, rows, t0, m, l, n);
}
E8KV_TARGET_AVX2_FLAT inline void score_rows_avx2(const float* q, const float* mu, int G, int d, float s,
                                                     const float* rows, int64_t t0, int64_t m, float* l, size_t n) {
  score_rows_body(q, mu, G, d, s, rows, t0, m, l, n);
}
inline void score_rows(const float* q, const float* mu, int G, int d, float s, const float* rows, int64_t t0,
                               int64_t m, float* l, size_t n) {
  if (cpu_has_avx2()) return score_rows_avx2(q, mu, G, d, s, rows, t0, m, l, n);
  score_rows_base(q, mu, G, d, s, rows, t0, m, l, n);
}

template <class Code>
E8KV_TARGET_BASE_FLAT inline void accumulate_values_base(const uint8_t* c, size_t cb, const float* gains, const float* p,
                                                    size_t n, int64_t nc, int G, int d, float* acc) {
  accumulate_values_body<Code>(c, cb, gains, p, n, nc, G, d, acc);
}
template <class Code>
E8KV_TARGET_AVX2_FLAT inline void accumulate_values_avx2(const uint8_t* c, size_t cb, const float* gains, const float* p,
                                                    size_t n, int64_t nc, int G, int d, float* acc) {
  accumulate_values_body<Code>(c, cb, gains, p, n, nc, G, d, acc);
}
template <class Code>
inline void accumulate_values(const uint8_t* c, size_t cb, const float* gains, const float* p, size_t n, int64_t nc,
                              int G, int d, float* acc) {
  if (cpu_has_avx2()) return accumulate_values_avx2<Code>(c, cb, gains, p, n, nc, G, d, acc);
  accumulate_values_base<Code>(c, cb, gains, p, n, nc, G, d, acc);
}

E8KV_TARGET_BASE_FLAT inline void accumulate_rows_base(const float* rows, const float* p, size_t n, int64_t t0, int64_t m,
                                                   int G, int d, float* acc) {
  accumulate_rows_body(rows, p, n, t0, m, G, d, acc);
}
E8KV_TARGET_AVX2_FLAT inline void accumulate_rows_avx2(const float* rows, const float* p, size_t n, int64_t t0, int64_t m,
                                                   int G, int d, float* acc) {
  accumulate_rows_body(rows, p, n, t0, m, G, d, acc);
}
inline void accumulate_rows(const float* rows, const float* p, size_t n, int64_t t0, int64_t m, int G, int d,
                            float* acc) {
  if (cpu_has_avx2()) return accumulate_rows_avx2(rows, p, n, t0, m, G, d, acc);
  accumulate_rows_base(rows, p, n, t0, m, G, d, acc);
}

}  // namespace e8kv::attend_cpu
