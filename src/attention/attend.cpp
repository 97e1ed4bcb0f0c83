// CPU decode attention over a compressed cache (include/e8kv/attention/attend.hpp).
//
// Plan of one call: every request (sequence × layer × query tokens) is cut into work items of
// kChunkTokens stored tokens (coded chunks first, then the code tier's, then the fp16 window),
// each item covering all KV heads so the cos/sin rows of the RoPE-residual mean term are
// computed once per position.
// An item scores its tokens for every query token and head, takes the chunk's softmax and sums
// the values, leaving a partial state (max, Σp, Σp over coded tokens, weighted value sum) per
// (query token, query head). States are merged in chunk order once every item has run, so the
// result does not depend on which thread ran what.
#include "e8kv/attention/attend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "attention/attend_kernels.hpp"
#include "detail/finite.hpp"
#include "detail/require.hpp"
#include "e8kv/numeric/fp.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/codebook/host_decode.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/quant/gain_code.hpp"

namespace e8kv {
namespace {

using quant::Codec;
using transform::KeyFrame;

/// Stored tokens per work item (per head). Fixed, so results never depend on the thread count.
constexpr int64_t kChunkTokens = 512;
/// Tokens whose cos/sin rows and decoded keys are held at once inside a chunk.
constexpr int64_t kSubTile = 64;
/// Query heads per kernel call (the kernels keep at most eight accumulators in registers).
constexpr int kMaxGroup = 8;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- what a layer's chunks read -----------------------------------------------------------------

enum class Rows : uint8_t { kE8p, kRvq3, kRvq4, kFp16, kFp32 };

Rows table_rows(Codec c) {
  switch (c) {
    case Codec::kE8P: return Rows::kE8p;
    case Codec::kRvq3: return Rows::kRvq3;
    case Codec::kRvq4: return Rows::kRvq4;
    case Codec::kFp16: return Rows::kFp16;
    default: return Rows::kFp32;  // decoded ahead into float rows
  }
}

struct LayerPlan {
  const CompressedKV* cache = nullptr;
  const CacheLayout* L = nullptr;
  int layer = 0, H = 0, G = 0, d = 0, blocks = 0;
  int pairs = 0, P = 0;  // rotary pairs, padded to a multiple of 8
  KeyFrame frame = KeyFrame::kPreRope;
  Codec key_codec = Codec::kFp16, value_codec = Codec::kFp16;
  Rows key_rows = Rows::kFp16, value_rows = Rows::kFp16;
  bool key_in_engine_basis = true;   // scored with the raw query (fp16 codec, pre-RoPE decoded ahead)
  bool value_in_engine_basis = true;  // fp16 codec: summed in the engine's basis
  bool residual_mean = false;        // q·R_t·μ per token from cos/sin rows
  float query_factor = 1.f;          // the key codebook's 1/input scale, folded into the query
  float value_factor = 1.f;          // the value codebook's 1/input scale, folded into the weights
  size_t key_code_bytes = 0, value_code_bytes = 0;
  float scale = 1.f;
  // The code tier (CacheLayout::tier_key_codec): keys post-RoPE, nothing centred or scaled, fp16
  // gains; read in the same rotated bases as the layer's codes with the tier codec's factors.
  Codec tier_key_codec = Codec::kFp16, tier_value_codec = Codec::kFp16;
  Rows tier_key_rows = Rows::kFp32, tier_value_rows = Rows::kFp32;
  float tier_query_factor = 1.f, tier_value_factor = 1.f;
  size_t tier_key_code_bytes = 0, tier_value_code_bytes = 0;
  std::vector<int64_t> coded, tier, window;  // per head
  int64_t coded_chunks = 0, tier_chunks = 0, window_chunks = 0;
};

/// What a chunk of a layer reads: the layer's codes, the code tier or the fp16 window.
enum class Segment : uint8_t { kCoded, kTier, kWindow };
Segment segment_of(const LayerPlan& p, int64_t chunk) {
  if (chunk < p.coded_chunks) return Segment::kCoded;
  return chunk < p.coded_chunks + p.tier_chunks ? Segment::kTier : Segment::kWindow;
}
/// The chunk's first token within its segment.
int64_t segment_begin(const LayerPlan& p, int64_t chunk) {
  switch (segment_of(p, chunk)) {
    case Segment::kCoded: return chunk * kChunkTokens;
    case Segment::kTier: return (chunk - p.coded_chunks) * kChunkTokens;
    case Segment::kWindow: break;
  }
  return (chunk - p.coded_chunks - p.tier_chunks) * kChunkTokens;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

LayerPlan plan_layer(const CompressedKV& cache, int layer) {
  require(cache.valid(), "attend: the cache is empty (default-constructed)");
  const CacheLayout& L = cache.layout();
  detail::require(layer >= 0 && layer < L.n_layers, "attend: layer {} out of range [0, {})", layer, L.n_layers);
  const auto& codecs = cache.codecs();
  LayerPlan p;
  p.cache = &cache;
  p.L = &L;
  p.layer = layer;
  p.H = L.n_kv_heads;
  p.G = L.n_q_heads / L.n_kv_heads;
  p.d = L.head_dim;
  p.blocks = L.head_dim / 8;
  // The value kernels hold two blocks at a time (every supported head_dim is a multiple of 16).
  detail::require(p.blocks % 2 == 0, "attend: head_dim {} is not a multiple of 16", p.d);
  p.pairs = codecs.rope().rotary_dim() / 2;
  p.P = (p.pairs + 7) / 8 * 8;
  p.frame = L.key_frame;
  p.key_codec = L.key_codec[static_cast<size_t>(layer)];
  p.value_codec = L.value_codec[static_cast<size_t>(layer)];
  p.key_code_bytes = codecs.key_quantizer(layer).code_bytes();
  p.value_code_bytes = codecs.value_quantizer(layer).code_bytes();
  p.scale = L.effective_softmax_scale();
  const bool key_coded = p.key_codec != Codec::kFp16;
  p.key_in_engine_basis = !key_coded || p.frame == KeyFrame::kPreRope;
  p.key_rows = p.key_in_engine_basis && key_coded ? Rows::kFp32 : table_rows(p.key_codec);
  p.residual_mean = key_coded && p.frame == KeyFrame::kRopeResidual;
  p.value_in_engine_basis = p.value_codec == Codec::kFp16;
  p.value_rows = table_rows(p.value_codec);
  auto input_factor = [](Codec c) {
    switch (c) {
      case Codec::kE8P: return codebook::E8P::kInverseInputScale;
      case Codec::kRvq3: return codebook::Rvq3::kInverseInputScale;
      case Codec::kRvq4: return codebook::Rvq4::kInverseInputScale;
      default: return 1.0f;  // decoded ahead with Code::decode: already in unit scale
    }
  };
  p.query_factor = input_factor(p.key_codec);
  p.value_factor = input_factor(p.value_codec);
  p.tier_key_codec = L.tier_key_codec;
  p.tier_value_codec = L.tier_value_codec;
  p.tier_key_rows = table_rows(p.tier_key_codec);
  p.tier_value_rows = table_rows(p.tier_value_codec);
  p.tier_query_factor = input_factor(p.tier_key_codec);
  p.tier_value_factor = input_factor(p.tier_value_codec);
  p.tier_key_code_bytes = codecs.tier_code_bytes(KvKind::kKey);
  p.tier_value_code_bytes = codecs.tier_code_bytes(KvKind::kValue);
  int64_t max_coded = 0, max_tier = 0, max_window = 0;
  for (int h = 0; h < p.H; ++h) {
    p.coded.push_back(cache.coded_tokens(layer, h));
    p.tier.push_back(cache.tier_tokens(layer, h));
    p.window.push_back(cache.window_tokens(layer, h));
    max_coded = std::max(max_coded, p.coded.back());
    max_tier = std::max(max_tier, p.tier.back());
    max_window = std::max(max_window, p.window.back());
  }
  detail::require(max_tier == 0 || L.layer_has_code_tier(layer), "attend: layer {} stores {} tier tokens without a code tier",
                  layer, max_tier);
  p.coded_chunks = ceil_div(max_coded, kChunkTokens);
  p.tier_chunks = ceil_div(max_tier, kChunkTokens);
  p.window_chunks = ceil_div(max_window, kChunkTokens);
  if (p.frame == KeyFrame::kPreRope && key_coded)
    for (int h = 0; h < p.H; ++h)
      for (int32_t pos : cache.positions(layer, h))
        detail::require(pos >= 0, "attend: RoPE position must be >= 0, got {}", pos);
  return p;
}

// ---- per (query token, KV head): the query in each basis the chunks need -------------------------

struct HeadQuery {
  const float* q = nullptr;  // G·d, engine basis
  std::vector<float> qt;     // G·d, rotated basis of the coded keys, times the input factor
  std::vector<float> qt_tier;  // G·d, rotated basis of the tier keys (no S⁻¹), times the tier's factor
  std::vector<float> mean_coeffs;  // G·2P: per query head A (P floats) then B (P floats), RoPE residual
  std::vector<float> base;   // G, constant part of q·k̂ (post-RoPE mean, non-rotary channels)
};

// Coded keys decode to k̂ = M_t + S⁻¹·Rᵀ·(g·ĉ), with R the randomized Hadamard, S the key
// channel scales and M_t the mean in the engine's frame (μ, or R_t·μ for RoPE residuals). So
// q·k̂ = q·M_t + g·(R·S⁻¹·q)·ĉ: the query is rotated once, the mean term is one dot (post-RoPE)
// or Σ_p A_p·cos(θ_p·t) + B_p·sin(θ_p·t) over the rotary pairs (RoPE residual): the dot product
// of the 2P-float row [A | B] with the position's cos/sin row [cos | sin], which the key kernel
// computes as it would with a row of float keys.
HeadQuery prepare_head_query(const LayerPlan& p, int h, const float* q_head) {
  HeadQuery hq;
  hq.q = q_head;
  hq.base.assign(static_cast<size_t>(p.G), 0.f);
  const int d = p.d, G = p.G;
  const auto& codecs = p.cache->codecs();
  if (p.tier_chunks > 0) {  // tier keys: k̂ = Rᵀ·(g·ĉ), post-RoPE, so q·k̂ = g·(R·q)·ĉ
    hq.qt_tier.resize(static_cast<size_t>(G * d));
    for (int g = 0; g < G; ++g) {
      float* qt = hq.qt_tier.data() + static_cast<size_t>(g) * d;
      codecs.rotation(p.layer, h, 0).forward(q_head + g * d, qt);
      for (int i = 0; i < d; ++i) qt[i] *= p.tier_query_factor;
    }
  }
  if (p.key_in_engine_basis) return hq;
  const auto& hd = p.cache->layer(p.layer).heads[static_cast<size_t>(h)];
  std::vector<float> mu(static_cast<size_t>(d), 0.f), inv_scale(static_cast<size_t>(d), 1.f), tmp(static_cast<size_t>(d));
  if (!hd.key_mean.empty()) fp16_bits_to_floats(hd.key_mean.data(), mu.data(), mu.size());
  for (int i = 0; i < d && !hd.key_channel_scale.empty(); ++i)
    inv_scale[static_cast<size_t>(i)] = 1.0f / fp16_bits_to_float(hd.key_channel_scale[static_cast<size_t>(i)]);
  hq.qt.resize(static_cast<size_t>(G * d));
  const auto& rotation = codecs.rotation(p.layer, h, 0);
  for (int g = 0; g < G; ++g) {
    const float* q = q_head + g * d;
    for (int i = 0; i < d; ++i) tmp[static_cast<size_t>(i)] = q[i] * inv_scale[static_cast<size_t>(i)];
    float* qt = hq.qt.data() + static_cast<size_t>(g) * d;
    rotation.forward(tmp.data(), qt);
    for (int i = 0; i < d; ++i) qt[i] *= p.query_factor;
  }
  if (hd.key_mean.empty()) return hq;
  if (p.frame == KeyFrame::kPostRope) {
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
      for (int i = 0; i < d; ++i) s += q_head[g * d + i] * mu[static_cast<size_t>(i)];
      hq.base[static_cast<size_t>(g)] = s;
    }
    return hq;
  }
  // RoPE residual: q·R_t·μ = Σ_p cos·(q_a·μ_a + q_b·μ_b) + sin·(q_b·μ_a − q_a·μ_b) over the
  // rotary pairs (a, b), plus q·μ over the channels RoPE leaves alone.
  const int rotary = 2 * p.pairs;
  const auto layout = codecs.rope().params().layout;
  hq.mean_coeffs.assign(static_cast<size_t>(G) * 2 * p.P, 0.f);  // padded pairs stay 0
  for (int g = 0; g < G; ++g) {
    const float* q = q_head + g * d;
    float* A = hq.mean_coeffs.data() + static_cast<size_t>(g) * 2 * p.P;
    float* B = A + p.P;
    for (int pr = 0; pr < p.pairs; ++pr) {
      int a = 0, b = 0;
      transform::rope_pair_indices(layout, rotary, pr, a, b);
      A[pr] = q[a] * mu[static_cast<size_t>(a)] + q[b] * mu[static_cast<size_t>(b)];
      B[pr] = q[b] * mu[static_cast<size_t>(a)] - q[a] * mu[static_cast<size_t>(b)];
    }
    float s = 0.f;
    for (int i = rotary; i < d; ++i) s += q[i] * mu[static_cast<size_t>(i)];
    hq.base[static_cast<size_t>(g)] = s;
  }
  return hq;
}

// ---- requests and their partial states ---------------------------------------------------------

/// Floats of one partial state: max logit, Σp, Σp over coded tokens, then the d-float value sum.
int state_floats(int d) { return 3 + d; }

struct ResolvedRequest {
  LayerPlan plan;
  int n_tokens = 0;
  const float* q = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  std::vector<HeadQuery> heads;  // [token][head]
  std::vector<float> states;     // [chunk][token][head][g][state_floats]
  int64_t chunks() const { return plan.coded_chunks + plan.tier_chunks + plan.window_chunks; }
  float* state(int64_t chunk, int token, int h, int g) {
    const auto& p = plan;
    const size_t idx = ((static_cast<size_t>(chunk) * n_tokens + token) * p.H + h) * p.G + g;
    return states.data() + idx * static_cast<size_t>(state_floats(p.d));
  }
};

/// Reusable buffers of one work item.
struct Scratch {
  std::vector<float> logits;   // [token][head][g][kChunkTokens]
  std::vector<float> dots, mean;  // [kMaxGroup][kSubTile]
  std::vector<float> cs;       // [kSubTile][2·P]: cos row, sin row per token
  std::vector<float> rows;     // [kSubTile][d]: keys or values decoded ahead
  std::vector<float> key_gains, value_gains;  // [kChunkTokens]
  std::vector<float> weights;  // [token][head][kChunkTokens] in the kernels' group layout
  std::vector<float> acc;      // [token][head][d]: value sums of the chunk
  std::vector<float> upper_cos, upper_sin;
  uint32_t upper = 0xFFFFFFFFu;
};

/// cos/sin rows of `m` positions (CacheCodecs::rope_table's three levels: the low level from the
/// planar copy, the product of the two upper levels cached per 1024 positions).
void fill_cos_sin(const LayerPlan& p, const int32_t* positions, int64_t m, Scratch& s) {
  const auto& codecs = p.cache->codecs();
  const float* planar = codecs.key_rope_low_planar();
  const float* table = codecs.rope_table().data();
  const int P = p.P, pairs = p.pairs;
  s.cs.resize(static_cast<size_t>(kSubTile) * 2 * P);
  s.upper_cos.resize(static_cast<size_t>(P));
  s.upper_sin.resize(static_cast<size_t>(P));
  for (int64_t t = 0; t < m; ++t) {
    const uint32_t pos = static_cast<uint32_t>(positions[t]);
    if ((pos >> 10) != s.upper) {
      s.upper = pos >> 10;
      const size_t stride = static_cast<size_t>(pairs) * 2;
      const float* mid = table + static_cast<size_t>(1024u + (s.upper & 1023u)) * stride;
      const float* high = table + static_cast<size_t>(2048u + (s.upper >> 10)) * stride;
      for (int i = 0; i < P; ++i) {
        const bool real = i < pairs;
        const float c1 = real ? mid[2 * i] : 1.f, s1 = real ? mid[2 * i + 1] : 0.f;
        const float c2 = real ? high[2 * i] : 1.f, s2 = real ? high[2 * i + 1] : 0.f;
        s.upper_cos[static_cast<size_t>(i)] = c1 * c2 - s1 * s2;
        s.upper_sin[static_cast<size_t>(i)] = c1 * s2 + s1 * c2;
      }
    }
    const float* lc = planar + static_cast<size_t>(pos & 1023u) * P;
    const float* ls = planar + static_cast<size_t>(1024u + (pos & 1023u)) * P;
    float* c = s.cs.data() + static_cast<size_t>(t) * 2 * P;
    float* sn = c + P;
    const float* uc = s.upper_cos.data();
    const float* us = s.upper_sin.data();
    for (int i = 0; i < P; ++i) {
      c[i] = lc[i] * uc[i] - ls[i] * us[i];
      sn[i] = lc[i] * us[i] + ls[i] * uc[i];
    }
  }
}

/// Keys of tokens [t0, t0 + m) of (layer, head) decoded into float rows: for pre-RoPE codes in
/// the engine's basis (block codes times gain, the inverse rotation for the whole tile at once,
/// S⁻¹ and the mean, then RoPE from the tile's cos/sin rows `cs`: what decompress_head gives, to
/// rounding); for codes without a register decoder, in the rotated basis at unit scale without
/// the gain.
template <class Code>
E8KV_FORCE_INLINE void decode_keys_ahead_body(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs,
                                              float* rows) {
  const auto& cache = *p.cache;
  const auto& codecs = cache.codecs();
  const auto& hd = cache.layer(p.layer).heads[static_cast<size_t>(h)];
  const size_t cb = p.key_code_bytes;
  const int d = p.d;
  const bool pre = p.frame == KeyFrame::kPreRope;
  const auto gain = hd.key_gains_reader();
  constexpr int kBytes = Code::kIndexBits / 8;
  const auto tables = codebook::host_decode::tables();
  for (int64_t t = 0; t < m; ++t) {
    const uint8_t* c = &hd.key_codes[static_cast<size_t>(t0 + t) * cb];
    const float g = pre ? gain(static_cast<size_t>(t0 + t)) : 1.f;
    for (int j = 0; j < d / 8; ++j) {
      const uint32_t index = attention::kernels::load_index(c + j * kBytes, kBytes);
      float* y = rows + t * d + 8 * j;
      if constexpr (codebook::host_decode::kHasTableDecode<Code>) {
        codebook::host_decode::decode_scaled_block<Code>(tables, index, g, y);
      } else {
        Code::decode(index, y);
        for (int i = 0; i < 8; ++i) y[i] *= g;
      }
    }
  }
  if (!pre) return;
  codecs.rotation(p.layer, h, KvKind::kKey).inverse_batch(rows, rows, static_cast<size_t>(m), static_cast<size_t>(d));
  float inv_scale[512], mu[512];
  for (int i = 0; i < d; ++i) {
    inv_scale[i] = hd.key_channel_scale.empty() ? 1.f : 1.0f / fp16_bits_to_float(hd.key_channel_scale[static_cast<size_t>(i)]);
    mu[i] = hd.key_mean.empty() ? 0.f : fp16_bits_to_float(hd.key_mean[static_cast<size_t>(i)]);
  }
  const auto layout = codecs.rope().params().layout;
  const int rotary = 2 * p.pairs, P = p.P;
  for (int64_t t = 0; t < m; ++t) {
    float* k = rows + t * d;
    for (int i = 0; i < d; ++i) k[i] = k[i] * inv_scale[i] + mu[i];  // pre-RoPE frame: S⁻¹·(...) + μ
    const float* c = cs + static_cast<size_t>(t) * 2 * P;
    transform::rope_rotate(k, c, c + P, rotary, layout, false);
  }
}

// The AVX2 twin (no FMA: the same floats) and the baseline build of the decode above.
template <class Code>
E8KV_TARGET_BASE_FLAT void decode_keys_ahead_base(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs,
                                                  float* rows) {
  decode_keys_ahead_body<Code>(p, h, t0, m, cs, rows);
}
#if E8KV_HOST_AVX2_DISPATCH
template <class Code>
E8KV_TARGET_AVX2_FLAT void decode_keys_ahead_avx2(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs,
                                                  float* rows) {
  decode_keys_ahead_body<Code>(p, h, t0, m, cs, rows);
}
#endif
void decode_keys_ahead(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs, float* rows) {
  quant::dispatch_block_code(p.key_codec, [&](auto code) {
    using Code = decltype(code);
#if E8KV_HOST_AVX2_DISPATCH
    if (cpu_has_avx2()) return decode_keys_ahead_avx2<Code>(p, h, t0, m, cs, rows), 0;
#endif
    return decode_keys_ahead_base<Code>(p, h, t0, m, cs, rows), 0;
  });
}

/// Vectors [t0, t0 + m) of `codes` (cb bytes each) of a code without a register decoder: rotated
/// basis, unit scale, no gain (values; post-RoPE tier keys).
void decode_codes_ahead(Codec codec, const std::vector<uint8_t>& codes, size_t cb, int d, int64_t t0, int64_t m,
                        float* rows) {
  quant::dispatch_block_code(codec, [&](auto code) {
    using Code = decltype(code);
    constexpr int kBytes = Code::kIndexBits / 8;
    for (int64_t t = 0; t < m; ++t)
      for (int j = 0; j < d / 8; ++j)
        Code::decode(attention::kernels::load_index(&codes[static_cast<size_t>(t0 + t) * cb + j * kBytes], kBytes),
                     rows + t * d + 8 * j);
    return 0;
  });
}

/// Calls f(std::integral_constant<int, NG>) with NG the kernel group size for `remaining` query
/// heads (8, 4, 3, 2 or 1) and returns NG.
template <class F>
E8KV_FORCE_INLINE int with_group(int remaining, F&& f) {
  if (remaining >= 8) return f(std::integral_constant<int, 8>{}), 8;
  if (remaining >= 4) return f(std::integral_constant<int, 4>{}), 4;
  if (remaining == 3) return f(std::integral_constant<int, 3>{}), 3;
  if (remaining == 2) return f(std::integral_constant<int, 2>{}), 2;
  return f(std::integral_constant<int, 1>{}), 1;
}

/// Calls f(decoder) with kernel set K's register decoder of `rows`.
template <class K, class F>
E8KV_FORCE_INLINE void with_rows(Rows rows, F&& f) {
  const auto& tables = attention::kernels::decode_rows();
  switch (rows) {
    case Rows::kE8p: f(typename K::E8pRowDecoder{&tables}); return;
    case Rows::kRvq3: f(typename K::Rvq3RowDecoder{&tables}); return;
    case Rows::kRvq4: f(typename K::Rvq4RowDecoder{&tables, codebook::Rvq4::kInverseResidualScale}); return;
    case Rows::kFp16: f(typename K::Fp16RowDecoder{}); return;
    case Rows::kFp32: f(typename K::Fp32RowDecoder{}); return;
  }
}

/// Rows [0, n) of register-decoded codes written out as float rows (8·blocks floats each), so
/// that several query tokens read one decode: Fp32RowDecoder yields exactly the decoder's floats,
/// so the sums are bit-identical to decoding per token.
template <class K>
void decode_tile(Rows kind, const uint8_t* rows, size_t stride, int blocks, int64_t n, float* out) {
  with_rows<K>(kind, [&](const auto& dec) { K::decode_rows(dec, rows, stride, blocks, n, out); });
}

// ---- one work item: a chunk of tokens of one request, every head -------------------------------

template <class K>
void run_chunk_body(ResolvedRequest& r, int64_t chunk, Scratch& s) {
  const LayerPlan& p = r.plan;
  const auto& cache = *p.cache;
  const auto& ld = cache.layer(p.layer);
  const int H = p.H, G = p.G, d = p.d, blocks = p.blocks;
  const Segment segment = segment_of(p, chunk);
  const bool window = segment == Segment::kWindow, tier = segment == Segment::kTier;
  s.upper = 0xFFFFFFFFu;  // the cached upper RoPE level belongs to the previous item's table
  const int64_t t_begin = segment_begin(p, chunk);
  const std::vector<int64_t>& stored = window ? p.window : tier ? p.tier : p.coded;
  std::vector<int64_t> count(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h)
    count[static_cast<size_t>(h)] = std::clamp<int64_t>(stored[static_cast<size_t>(h)] - t_begin, 0, kChunkTokens);
  s.logits.assign(static_cast<size_t>(r.n_tokens) * H * G * kChunkTokens, kNegInf);
  s.dots.resize(static_cast<size_t>(kMaxGroup) * kSubTile);
  s.mean.resize(static_cast<size_t>(kMaxGroup) * kSubTile);
  s.rows.resize(static_cast<size_t>(kSubTile) * d);
  s.key_gains.resize(static_cast<size_t>(kChunkTokens));
  s.value_gains.resize(static_cast<size_t>(kChunkTokens));
  auto logits_row = [&](int token, int h, int g) {
    return s.logits.data() + ((static_cast<size_t>(token) * H + h) * G + g) * kChunkTokens;
  };
  const bool key_engine = window || (!tier && p.key_in_engine_basis);
  const Rows key_rows = window ? Rows::kFp16 : tier ? p.tier_key_rows : p.key_rows;
  const bool key_ahead = !window && key_rows == Rows::kFp32;
  // Several query tokens: each sub-tile of codes is decoded once into float rows, then every
  // token reads those (a decode costs more than the multiply-adds one token spends on a row).
  const bool share_decode = r.n_tokens > 1;
  const size_t sets = ld.positions.size();

  // Scores, a sub-tile of tokens at a time: cos/sin rows once per position set, then every head.
  for (int64_t s0 = 0; s0 < kChunkTokens; s0 += kSubTile) {
    for (size_t set = 0; set < sets; ++set) {
      const int h_begin = sets == 1 ? 0 : static_cast<int>(set);
      const int h_end = sets == 1 ? H : static_cast<int>(set) + 1;
      const int64_t set_count = std::min<int64_t>(count[static_cast<size_t>(h_begin)] - s0, kSubTile);
      if (set_count <= 0) continue;
      if (segment == Segment::kCoded && (p.residual_mean || p.frame == KeyFrame::kPreRope))
        fill_cos_sin(p, ld.positions[set].data() + t_begin + s0, set_count, s);
      for (int h = h_begin; h < h_end; ++h) {
        const int64_t m = std::min<int64_t>(count[static_cast<size_t>(h)] - s0, kSubTile);
        if (m <= 0) continue;
        const auto& hd = ld.heads[static_cast<size_t>(h)];
        const uint8_t* rows = nullptr;
        size_t stride = 0;
        if (window) {
          rows = reinterpret_cast<const uint8_t*>(hd.window_keys.data() + static_cast<size_t>(t_begin + s0) * d);
          stride = static_cast<size_t>(d) * 2;
        } else if (tier && key_ahead) {
          decode_codes_ahead(p.tier_key_codec, hd.tier_key_codes, p.tier_key_code_bytes, d, t_begin + s0, m, s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
        } else if (tier) {
          rows = hd.tier_key_codes.data() + static_cast<size_t>(t_begin + s0) * p.tier_key_code_bytes;
          stride = p.tier_key_code_bytes;
        } else if (key_ahead) {
          decode_keys_ahead(p, h, t_begin + s0, m, s.cs.data(), s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
        } else {
          rows = hd.key_codes.data() + static_cast<size_t>(t_begin + s0) * p.key_code_bytes;
          stride = p.key_code_bytes;
        }
        Rows tile_rows = key_rows;
        if (share_decode && !window && !key_ahead) {
          decode_tile<K>(key_rows, rows, stride, blocks, m, s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
          tile_rows = Rows::kFp32;
        }
        const bool scaled_codes = !key_engine;
        if (tier) {
          fp16_bits_to_floats(hd.tier_key_gains.data() + t_begin + s0, s.key_gains.data() + s0, static_cast<size_t>(m));
        } else if (scaled_codes) {
          const auto gain = hd.key_gains_reader();
          for (int64_t t = 0; t < m; ++t) s.key_gains[static_cast<size_t>(s0 + t)] = gain(static_cast<size_t>(t_begin + s0 + t));
        }
        for (int token = 0; token < r.n_tokens; ++token) {
          const HeadQuery& hq = r.heads[static_cast<size_t>(token) * H + h];
          const float* q = tier ? hq.qt_tier.data() : scaled_codes ? hq.qt.data() : hq.q;
          for (int g0 = 0; g0 < G;) {
            g0 += with_group(G - g0, [&](auto ng) {
              constexpr int NG = decltype(ng)::value;
              with_rows<K>(tile_rows, [&](const auto& dec) {
                K::template dot_rows<NG>(dec, rows, stride, blocks, q + static_cast<size_t>(g0) * d, m, s.dots.data(), kSubTile);
              });
              // Heads without means and the tier (uncentred) skip the mean term.
              const bool mean_rows = !tier && scaled_codes && p.residual_mean && !hq.mean_coeffs.empty();
              if (mean_rows)
                K::template dot_rows<NG>(typename K::Fp32RowDecoder{}, reinterpret_cast<const uint8_t*>(s.cs.data()),
                                         static_cast<size_t>(2 * p.P) * sizeof(float), 2 * p.P / 8,
                                         hq.mean_coeffs.data() + static_cast<size_t>(g0) * 2 * p.P, m, s.mean.data(), kSubTile);
              for (int g = 0; g < NG; ++g) {
                float* out = logits_row(token, h, g0 + g) + s0;
                const float* dot = s.dots.data() + static_cast<size_t>(g) * kSubTile;
                if (!scaled_codes) {
                  for (int64_t t = 0; t < m; ++t) out[t] = dot[t] * p.scale;
                  continue;
                }
                K::code_logits(dot, s.key_gains.data() + s0,
                               mean_rows ? s.mean.data() + static_cast<size_t>(g) * kSubTile : nullptr,
                               tier ? 0.f : hq.base[static_cast<size_t>(g0 + g)], p.scale, m, out);
              }
            });
          }
        }
      }
    }
  }

  // Softmax of the chunk and the value sums, per head.
  const bool value_engine = window || (!tier && p.value_in_engine_basis);
  const Rows value_rows = window ? Rows::kFp16 : tier ? p.tier_value_rows : p.value_rows;
  const bool value_ahead = !window && value_rows == Rows::kFp32;
  for (int h = 0; h < H; ++h) {
    const int64_t m = count[static_cast<size_t>(h)];
    const int64_t padded = (m + 7) / 8 * 8;
    const auto& hd = ld.heads[static_cast<size_t>(h)];
    if (tier) {
      for (int64_t t = 0; t < m; ++t)
        s.value_gains[static_cast<size_t>(t)] =
            fp16_bits_to_float(hd.tier_value_gains[static_cast<size_t>(t_begin + t)]) * p.tier_value_factor;
    } else if (!value_engine) {
      const auto gain = hd.value_gains_reader();
      for (int64_t t = 0; t < m; ++t)
        s.value_gains[static_cast<size_t>(t)] = gain(static_cast<size_t>(t_begin + t)) * p.value_factor;
    }
    for (int token = 0; token < r.n_tokens; ++token) {
      for (int g = 0; g < G; ++g) {
        float* st = r.state(chunk, token, h, g);
        std::fill(st, st + state_floats(d), 0.f);
        st[0] = kNegInf;
        if (m == 0) continue;
        K::softmax_row(logits_row(token, h, g), padded, &st[0], &st[1]);
        st[2] = segment == Segment::kCoded ? st[1] : 0.f;  // the mass the value mean applies to
      }
    }
    if (m == 0) continue;
    // Weights of every (query token, head), in the kernels' group layout: the group of heads
    // g0..g0+NG−1 of a token holds w[t·NG + g] at offset (token·G + g0)·m.
    s.weights.resize(static_cast<size_t>(r.n_tokens) * G * m);
    for (int token = 0; token < r.n_tokens; ++token)
      for (int g0 = 0; g0 < G;) {
        g0 += with_group(G - g0, [&](auto ng) {
          constexpr int NG = decltype(ng)::value;
          float* w = s.weights.data() + (static_cast<size_t>(token) * G + g0) * m;
          for (int64_t t = 0; t < m; ++t)
            for (int g = 0; g < NG; ++g) {
              const float pr = logits_row(token, h, g0 + g)[t];
              w[t * NG + g] = value_engine ? pr : pr * s.value_gains[static_cast<size_t>(t)];
            }
        });
      }
    // Sums of every (token, head) into contiguous d-float rows, a sub-tile of stored tokens at a
    // time; each sub-tile's rows are decoded once for all query tokens.
    s.acc.assign(static_cast<size_t>(r.n_tokens) * G * d, 0.f);
    for (int64_t t0 = 0; t0 < m; t0 += kSubTile) {
      const int64_t mm = std::min<int64_t>(kSubTile, m - t0);
      const uint8_t* rows = nullptr;
      size_t stride = 0;
      Rows tile_rows = value_rows;
      if (window) {
        rows = reinterpret_cast<const uint8_t*>(hd.window_values.data() + static_cast<size_t>(t_begin + t0) * d);
        stride = static_cast<size_t>(d) * 2;
      } else if (value_ahead) {
        if (tier)
          decode_codes_ahead(p.tier_value_codec, hd.tier_value_codes, p.tier_value_code_bytes, d, t_begin + t0, mm, s.rows.data());
        else
          decode_codes_ahead(p.value_codec, hd.value_codes, p.value_code_bytes, d, t_begin + t0, mm, s.rows.data());
        rows = reinterpret_cast<const uint8_t*>(s.rows.data());
        stride = static_cast<size_t>(d) * 4;
      } else {
        const size_t cb = tier ? p.tier_value_code_bytes : p.value_code_bytes;
        rows = (tier ? hd.tier_value_codes : hd.value_codes).data() + static_cast<size_t>(t_begin + t0) * cb;
        stride = cb;
        if (share_decode) {
          decode_tile<K>(value_rows, rows, stride, blocks, mm, s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
          tile_rows = Rows::kFp32;
        }
      }
      for (int token = 0; token < r.n_tokens; ++token)
        for (int g0 = 0; g0 < G;) {
          g0 += with_group(G - g0, [&](auto ng) {
            constexpr int NG = decltype(ng)::value;
            const size_t group = static_cast<size_t>(token) * G + g0;
            with_rows<K>(tile_rows, [&](const auto& dec) {
              K::template accumulate_rows<NG>(dec, rows, stride, blocks, s.weights.data() + group * m + static_cast<size_t>(t0) * NG,
                                              mm, s.acc.data() + group * d);
            });
          });
        }
    }
    for (int token = 0; token < r.n_tokens; ++token)
      for (int g = 0; g < G; ++g) {
        const float* a = s.acc.data() + (static_cast<size_t>(token) * G + g) * d;
        std::copy(a, a + d, r.state(chunk, token, h, g) + 3);
      }
  }
}

void run_chunk(ResolvedRequest& r, int64_t chunk, Scratch& s) {
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma()) return run_chunk_body<attention::kernels::KernelsAvx2Fma>(r, chunk, s);
#endif
  run_chunk_body<attention::kernels::KernelsPortable>(r, chunk, s);
}

// ---- merge and finish ---------------------------------------------------------------------------

void finish_request(ResolvedRequest& r) {
  const LayerPlan& p = r.plan;
  const int H = p.H, G = p.G, d = p.d;
  const auto& codecs = p.cache->codecs();
  const auto& ld = p.cache->layer(p.layer);
  std::vector<float> acc_rot(static_cast<size_t>(d)), acc_eng(static_cast<size_t>(d)), rotated_back(static_cast<size_t>(d)),
      value_mean(static_cast<size_t>(d));
  for (int h = 0; h < H; ++h) {
    const auto& hd = ld.heads[static_cast<size_t>(h)];
    const bool value_mean_used = !hd.value_mean.empty();
    if (value_mean_used) fp16_bits_to_floats(hd.value_mean.data(), value_mean.data(), value_mean.size());
    for (int token = 0; token < r.n_tokens; ++token)
      for (int g = 0; g < G; ++g) {
        float M = kNegInf;
        double L = 0.0, mass = 0.0;
        std::fill(acc_rot.begin(), acc_rot.end(), 0.f);
        std::fill(acc_eng.begin(), acc_eng.end(), 0.f);
        bool any_rot = false;
        for (int64_t c = 0; c < r.chunks(); ++c) {
          const float* st = r.state(c, token, h, g);
          if (!(st[1] > 0.f)) continue;
          const Segment seg = segment_of(p, c);
          const bool rotated = seg == Segment::kTier || (seg == Segment::kCoded && !p.value_in_engine_basis);
          const float M2 = std::max(M, st[0]);
          const float a = M == kNegInf ? 0.f : std::exp(M - M2), b = std::exp(st[0] - M2);
          L = L * a + static_cast<double>(st[1]) * b;
          mass = mass * a + static_cast<double>(st[2]) * b;
          for (int i = 0; i < d; ++i) {
            acc_rot[static_cast<size_t>(i)] *= a;
            acc_eng[static_cast<size_t>(i)] *= a;
          }
          float* dst = rotated ? acc_rot.data() : acc_eng.data();
          any_rot = any_rot || rotated;
          for (int i = 0; i < d; ++i) dst[i] += b * st[3 + i];
          M = M2;
        }
        float* o = r.out + (static_cast<size_t>(token) * p.L->n_q_heads + static_cast<size_t>(h) * G + g) * d;
        float* lse = r.lse ? r.lse + static_cast<size_t>(token) * p.L->n_q_heads + static_cast<size_t>(h) * G + g : nullptr;
        if (!(L > 0.0)) {
          std::fill(o, o + d, 0.f);
          if (lse) *lse = kNegInf;
          continue;
        }
        if (any_rot)
          codecs.rotation(p.layer, h, 1).inverse(acc_rot.data(), rotated_back.data());
        else
          std::fill(rotated_back.begin(), rotated_back.end(), 0.f);
        const float inv_l = static_cast<float>(1.0 / L);
        const float m = value_mean_used ? static_cast<float>(mass) : 0.f;
        for (int i = 0; i < d; ++i) {
          const float mean_part = value_mean_used ? m * value_mean[static_cast<size_t>(i)] : 0.f;
          o[i] = (rotated_back[static_cast<size_t>(i)] + acc_eng[static_cast<size_t>(i)] + mean_part) * inv_l;
        }
        if (lse) *lse = M + static_cast<float>(std::log(L));
      }
  }
}

void check_query(const float* q, size_t n, int n_q_heads, int d) {
  const size_t i = detail::first_non_finite(q, n);
  if (i < n)
    detail::fail("attend: non-finite query value at token {}, query head {}, element {}",
                 i / (static_cast<size_t>(n_q_heads) * d), i / d % n_q_heads, i % d);
}


}  // namespace

void attend_batch(const std::vector<AttendRequest>& requests, const AttendOptions& options) {
  std::vector<ResolvedRequest> resolved(requests.size());
  std::vector<std::pair<size_t, int64_t>> items;  // (request, chunk)
  for (size_t i = 0; i < requests.size(); ++i) {
    const AttendRequest& a = requests[i];
    detail::require(a.cache != nullptr, "attend: request {} has no cache", i);
    detail::require(a.q != nullptr && a.out != nullptr, "attend: request {}: q and out must not be null", i);
    detail::require(a.n_tokens >= 1, "attend: request {}: n_tokens must be >= 1, got {}", i, a.n_tokens);
    ResolvedRequest& r = resolved[i];
    r.plan = plan_layer(*a.cache, a.layer);
    r.n_tokens = a.n_tokens;
    r.q = a.q;
    r.out = a.out;
    r.lse = a.lse;
    const LayerPlan& p = r.plan;
    const size_t per_token = static_cast<size_t>(p.L->n_q_heads) * p.d;
    check_query(a.q, per_token * static_cast<size_t>(a.n_tokens), p.L->n_q_heads, p.d);
    r.heads.reserve(static_cast<size_t>(a.n_tokens) * p.H);
    for (int t = 0; t < a.n_tokens; ++t)
      for (int h = 0; h < p.H; ++h)
        r.heads.push_back(prepare_head_query(p, h, a.q + t * per_token + static_cast<size_t>(h) * p.G * p.d));
    r.states.assign(static_cast<size_t>(r.chunks()) * a.n_tokens * p.H * p.G * state_floats(p.d), 0.f);
    for (int64_t c = 0; c < r.chunks(); ++c) items.emplace_back(i, c);
  }
  // One Scratch per concurrently running item: a pool indexed by a slot taken under a lock.
  std::mutex slots_mutex;
  std::vector<std::unique_ptr<Scratch>> free_slots;
  run_tasks(options.executor, static_cast<int64_t>(items.size()), [&](int64_t k) {
    std::unique_ptr<Scratch> s;
    {
      std::lock_guard<std::mutex> lock(slots_mutex);
      if (!free_slots.empty()) {
        s = std::move(free_slots.back());
        free_slots.pop_back();
      }
    }
    if (!s) s = std::make_unique<Scratch>();
    run_chunk(resolved[items[static_cast<size_t>(k)].first], items[static_cast<size_t>(k)].second, *s);
    std::lock_guard<std::mutex> lock(slots_mutex);
    free_slots.push_back(std::move(s));
  });
  // Requests finish independently (each merges its own states in chunk order): in parallel.
  run_tasks(options.executor, static_cast<int64_t>(resolved.size()),
            [&](int64_t i) { finish_request(resolved[static_cast<size_t>(i)]); });
}

void attend(const CompressedKV& cache, int layer, const float* q, float* out, float* lse, const AttendOptions& options) {
  AttendRequest r;
  r.cache = &cache;
  r.layer = layer;
  r.q = q;
  r.out = out;
  r.lse = lse;
  attend_batch({r}, options);
}

void merge_attention(const float* o_a, const float* lse_a, const float* o_b, const float* lse_b, int n_heads, int d,
                     float* out, float* lse_out) {
  require(o_a && lse_a && o_b && lse_b && out && lse_out, "merge_attention: null argument");
  require(n_heads >= 0 && d >= 0, "merge_attention: n_heads and d must be >= 0");
  for (int h = 0; h < n_heads; ++h) {
    const float la = lse_a[h], lb = lse_b[h];
    const float m = std::max(la, lb);
    float* o = out + static_cast<size_t>(h) * d;
    const float* a = o_a + static_cast<size_t>(h) * d;
    const float* b = o_b + static_cast<size_t>(h) * d;
    if (m == kNegInf) {
      std::fill(o, o + d, 0.f);
      lse_out[h] = kNegInf;
      continue;
    }
    const double wa = std::exp(static_cast<double>(la) - m), wb = std::exp(static_cast<double>(lb) - m);
    const double z = wa + wb;
    for (int i = 0; i < d; ++i) o[i] = static_cast<float>((wa * a[i] + wb * b[i]) / z);
    lse_out[h] = m + static_cast<float>(std::log(z));
  }
}

}  // namespace e8kv
