// CompressedKV and CacheCodecs: encoding of single vectors, flushing, byte accounting, the CPU
// reference decode attention and decompression.
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cache/compressed_kv.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "detail/finite.hpp"
#include "detail/fp16_batch.hpp"
#include "detail/require.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/dot.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/numeric/random.hpp"
#include "e8kv/quant/gain_code.hpp"

namespace e8kv {

float CacheLayout::effective_softmax_scale() const {
  return softmax_scale > 0.f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

namespace {
// The RoPE table's low level (position bits 0-9) as planar rows for attention: 1024 cos rows,
// then 1024 sin rows, each padded to whole 8-float vectors (padding: cos 1, sin 0).
std::vector<float> build_planar_rope_low(const std::vector<float>& table, int pairs) {
  const size_t row = static_cast<size_t>((pairs + 7) / 8 * 8);
  std::vector<float> out(2 * 1024 * row, 0.f);
  for (size_t p = 0; p < 1024; ++p)
    for (size_t i = 0; i < row; ++i) {
      const bool real = i < static_cast<size_t>(pairs);
      out[p * row + i] = real ? table[(p * static_cast<size_t>(pairs) + i) * 2] : 1.f;
      out[(1024 + p) * row + i] = real ? table[(p * static_cast<size_t>(pairs) + i) * 2 + 1] : 0.f;
    }
  return out;
}
}  // namespace

CacheCodecs::CacheCodecs(CacheLayout layout) : CacheCodecs(std::move(layout), nullptr) {}

CacheCodecs::CacheCodecs(CacheLayout layout, const CacheCodecs& rope_source)
    : CacheCodecs(std::move(layout), &rope_source) {}

CacheCodecs::CacheCodecs(CacheLayout layout, const CacheCodecs* rope_source) : layout_(std::move(layout)) {
  const auto& L = layout_;
  require(L.n_layers >= 0 && static_cast<int>(L.key_codec.size()) == L.n_layers &&
              static_cast<int>(L.value_codec.size()) == L.n_layers,
          "CacheLayout: one key and one value codec per layer are required");
  for (int l = 0; l < L.n_layers; ++l) {
    key_q_.emplace_back(L.head_dim, L.key_codec[static_cast<size_t>(l)], L.key_gain, L.key_scale);
    value_q_.emplace_back(L.head_dim, L.value_codec[static_cast<size_t>(l)], L.value_gain, L.value_scale);
  }
  tier_q_.emplace_back(L.head_dim, L.tier_key_codec, L.key_gain, L.key_scale);
  tier_q_.emplace_back(L.head_dim, L.tier_value_codec, L.value_gain, L.value_scale);
  rotations_.reserve(static_cast<size_t>(L.n_layers) * L.n_kv_heads * 2);
  for (int l = 0; l < L.n_layers; ++l)
    for (int h = 0; h < L.n_kv_heads; ++h)
      for (int kind = 0; kind < 2; ++kind)
        rotations_.emplace_back(L.head_dim, e8kv::derive_seed(L.rotation_seed, static_cast<uint64_t>(l),
                                                                static_cast<uint64_t>(2 * h + kind)));
  transform::RopeParams rp = L.rope;
  rp.head_dim = L.head_dim;
  rope_ = std::make_unique<transform::Rope>(rp);
  const auto& inv = rope_->inv_freq();
  n_pairs_ = static_cast<int>(inv.size());
  // The tables are a function of the inverse frequencies alone: equal ones, equal tables.
  const bool same_rope = rope_source != nullptr && rope_source->rope_->inv_freq() == inv;
  rope_tables_ = same_rope ? rope_source->rope_tables_ : quant::build_rope_table(inv.data(), n_pairs_);
  if (layout_.key_frame != transform::KeyFrame::kPostRope)
    rope_low_planar_ = same_rope && !rope_source->rope_low_planar_.empty()
                           ? rope_source->rope_low_planar_
                           : build_planar_rope_low(rope_tables_, n_pairs_);
}

const transform::RandomizedHadamard& CacheCodecs::rotation(int layer, int head, int kind) const {
  return rotations_[(static_cast<size_t>(layer) * layout_.n_kv_heads + head) * 2 + kind];
}

quant::RopeTableView CacheCodecs::key_rope_view() const {
  quant::RopeTableView v;
  if (layout_.key_frame != transform::KeyFrame::kPreRope) return v;  // RoPE residuals: no RoPE step in the codec
  v.table = rope_tables_.data();
  v.rotary_dim = rope_->rotary_dim();
  v.layout = rope_->params().layout;
  return v;
}

quant::VectorCodecArgs CacheCodecs::codec_args(int layer, int head, int kind) const {
  detail::require(
      layer >= 0 && layer < layout_.n_layers && head >= 0 && head < layout_.n_kv_heads && (kind == 0 || kind == 1),
      "CacheCodecs::codec_args: (layer {}, head {}, kind {}) out of range", layer, head, kind);
  quant::VectorCodecArgs a;
  a.head_dim = layout_.head_dim;
  a.scale = kind == 0 ? layout_.key_scale : layout_.value_scale;
  a.gain = kind == 0 ? layout_.key_gain : layout_.value_gain;
  a.sign_bits = rotation(layer, head, kind).sign_bits();
  return a;
}

namespace {
void require_finite(const float* x, int d, const char* what) {
  const size_t i = detail::first_non_finite(x, static_cast<size_t>(d));
  if (i < static_cast<size_t>(d)) detail::fail("{}: non-finite input at element {}", what, i);
}
}  // namespace

void CacheCodecs::encode_key(int layer, int head, const float* k, int32_t position, uint8_t* codes,
                             uint16_t* gain) const {
  const auto& q = key_quantizer(layer);
  if (q.codec() == quant::Codec::kFp16) {
    q.encode(k, codes, gain);
    return;
  }
  require_finite(k, layout_.head_dim, "CacheCodecs::encode_key");
  if (layout_.key_frame == transform::KeyFrame::kPreRope && position < 0)
    detail::fail("CacheCodecs::encode_key: position must be >= 0 for pre-RoPE keys, got {}", position);
  const quant::VectorCodecArgs args = codec_args(layer, head, 0);
  const quant::RopeTableView rope = key_rope_view();
  quant::dispatch_block_code(q.codec(), [&](auto code) {
    return quant::encode_key_vector<decltype(code)>(k, args, rope, position, codes, gain);
  });
}

void CacheCodecs::encode_value(int layer, int head, const float* v, uint8_t* codes, uint16_t* gain) const {
  const auto& q = value_quantizer(layer);
  if (q.codec() == quant::Codec::kFp16) {
    q.encode(v, codes, gain);
    return;
  }
  require_finite(v, layout_.head_dim, "CacheCodecs::encode_value");
  const quant::VectorCodecArgs args = codec_args(layer, head, 1);
  quant::dispatch_block_code(q.codec(), [&](auto code) {
    return quant::encode_value_vector<decltype(code)>(v, args, codes, gain);
  });
}

void CacheCodecs::decode_key(int layer, int head, const uint8_t* codes, uint16_t gain, int32_t position,
                             float* k) const {
  decode_key_with_gain(layer, head, codes, fp16_bits_to_float(gain), position, k);
}

void CacheCodecs::decode_value(int layer, int head, const uint8_t* codes, uint16_t gain, float* v) const {
  decode_value_with_gain(layer, head, codes, fp16_bits_to_float(gain), v);
}

void CacheCodecs::decode_key_with_gain(int layer, int head, const uint8_t* codes, float gain, int32_t position,
                                       float* k) const {
  const auto& q = key_quantizer(layer);
  if (q.codec() == quant::Codec::kFp16) {
    q.decode(codes, 0, k);
    return;
  }
  if (layout_.key_frame == transform::KeyFrame::kPreRope && position < 0)
    detail::fail("CacheCodecs::decode_key: position must be >= 0 for pre-RoPE keys, got {}", position);
  const quant::VectorCodecArgs args = codec_args(layer, head, 0);
  const quant::RopeTableView rope = key_rope_view();
  quant::dispatch_block_code(q.codec(), [&](auto code) {
    return quant::decode_key_vector_with_gain<decltype(code)>(codes, gain, args, rope, position, k);
  });
}

void CacheCodecs::decode_value_with_gain(int layer, int head, const uint8_t* codes, float gain, float* v) const {
  const auto& q = value_quantizer(layer);
  if (q.codec() == quant::Codec::kFp16) {
    q.decode(codes, 0, v);
    return;
  }
  const quant::VectorCodecArgs args = codec_args(layer, head, 1);
  quant::dispatch_block_code(q.codec(), [&](auto code) {
    return quant::decode_value_vector_with_gain<decltype(code)>(codes, gain, args, v);
  });
}

size_t CacheCodecs::code_bytes(int layer, KvKind kind) const {
  return (kind == KvKind::kKey ? key_quantizer(layer) : value_quantizer(layer)).code_bytes();
}

void CacheCodecs::encode(int layer, int head, KvKind kind, size_t n, const uint16_t* rows, const int32_t* positions,
                         const HeadState& state, uint8_t* codes, float* gains) const {
  const int d = layout_.head_dim;
  const auto& q = kind == KvKind::kKey ? key_quantizer(layer) : value_quantizer(layer);
  const size_t cb = q.code_bytes();
  if (q.codec() == quant::Codec::kFp16) {  // the rows themselves, as they are stored
    std::memcpy(codes, rows, n * cb);
    return;
  }
  const quant::VectorCodecArgs args = codec_args(layer, head, static_cast<int>(kind));
  const auto frame = layout_.key_frame;
  const bool keys = kind == KvKind::kKey;
  quant::RopeTableView mean_rope;  // every rotary pair, to turn the mean to a key's position
  mean_rope.table = rope_tables_.data();
  mean_rope.rotary_dim = rope_->rotary_dim();
  mean_rope.layout = rope_->params().layout;
  const quant::RopeTableView removal = key_rope_view();  // table only for pre-RoPE codes
  quant::dispatch_block_code(q.codec(), [&](auto code) {
    using Code = decltype(code);
    float x[quant::kMaxCodecHeadDim];
    for (size_t t = 0; t < n; ++t) {
      detail::fp16_bits_to_floats_batch(rows + t * d, x, static_cast<size_t>(d));
      uint8_t* c = codes + t * cb;
      if (keys) {
        if (frame != transform::KeyFrame::kPostRope && positions[t] < 0)
          detail::fail("CacheCodecs::encode: RoPE position must be >= 0, got {}", positions[t]);
        quant::prepare_key(x, d, state.mean, state.channel_scale, mean_rope, frame, positions[t]);
        gains[t] = quant::encode_key_vector_gain<Code>(x, args, removal, positions[t], c);
      } else {
        quant::prepare_value(x, d, state.mean);
        gains[t] = quant::encode_value_vector_gain<Code>(x, args, c);
      }
    }
    return 0;
  });
}

// The tier's centring term of one vector: the key mean turned to the key's position (RoPE-residual
// frame) or as it is (post-RoPE frame), the value mean as it is.
void CacheCodecs::tier_mean(KvKind kind, const float* mean, int32_t position, float* out) const {
  const int d = layout_.head_dim;
  std::copy(mean, mean + d, out);
  if (kind == KvKind::kKey && layout_.key_frame == transform::KeyFrame::kRopeResidual) apply_rope_fast(out, position);
}

void CacheCodecs::encode_tier(int layer, int head, KvKind kind, size_t n, const uint16_t* rows, const int32_t* positions,
                              const float* mean, uint8_t* codes, uint16_t* gains) const {
  detail::require(layout_.layer_has_code_tier(layer), "CacheCodecs::encode_tier: layer {} has no code tier", layer);
  const bool centred = layout_.tier_centered;
  detail::require(!centred || n == 0 || (mean != nullptr && positions != nullptr),
                  "CacheCodecs::encode_tier: the centred tier of layer {} needs the head's mean and the positions", layer);
  const int d = layout_.head_dim;
  const auto& q = tier_quantizer(kind);
  const size_t cb = q.code_bytes();
  const quant::VectorCodecArgs args = codec_args(layer, head, static_cast<int>(kind));
  quant::dispatch_block_code(q.codec(), [&](auto code) {
    float x[quant::kMaxCodecHeadDim], mu[quant::kMaxCodecHeadDim];
    for (size_t t = 0; t < n; ++t) {
      detail::fp16_bits_to_floats_batch(rows + t * d, x, static_cast<size_t>(d));
      if (centred) {
        tier_mean(kind, mean, positions[t], mu);
        for (int i = 0; i < d; ++i) x[i] -= mu[i];
      }
      quant::encode_value_vector<decltype(code)>(x, args, codes + t * cb, gains + t);  // keys post-RoPE: as a value
    }
    return 0;
  });
}

void CacheCodecs::decode_tier(int layer, int head, KvKind kind, size_t n, const uint8_t* codes, const uint16_t* gains,
                              const int32_t* positions, const float* mean, float* out) const {
  detail::require(layout_.layer_has_code_tier(layer), "CacheCodecs::decode_tier: layer {} has no code tier", layer);
  const bool centred = layout_.tier_centered;
  detail::require(!centred || n == 0 || (mean != nullptr && positions != nullptr),
                  "CacheCodecs::decode_tier: the centred tier of layer {} needs the head's mean and the positions", layer);
  const int d = layout_.head_dim;
  const auto& q = tier_quantizer(kind);
  const size_t cb = q.code_bytes();
  const quant::VectorCodecArgs args = codec_args(layer, head, static_cast<int>(kind));
  quant::dispatch_block_code(q.codec(), [&](auto code) {
    float mu[quant::kMaxCodecHeadDim];
    for (size_t t = 0; t < n; ++t) {
      float* y = out + t * d;
      quant::decode_value_vector<decltype(code)>(codes + t * cb, gains[t], args, y);
      if (!centred) continue;
      tier_mean(kind, mean, positions[t], mu);
      for (int i = 0; i < d; ++i) y[i] += mu[i];
    }
    return 0;
  });
}

void CacheCodecs::decode(int layer, int head, KvKind kind, size_t n, const uint8_t* codes, const float* gains,
                         const int32_t* positions, const HeadState& state, float* out) const {
  const int d = layout_.head_dim;
  const auto& q = kind == KvKind::kKey ? key_quantizer(layer) : value_quantizer(layer);
  const size_t cb = q.code_bytes();
  if (q.codec() == quant::Codec::kFp16) {
    for (size_t t = 0; t < n; ++t) q.decode(codes + t * cb, 0, out + t * d);
    return;
  }
  float inv_scale[quant::kMaxCodecHeadDim], mu[quant::kMaxCodecHeadDim];
  for (int i = 0; i < d && state.channel_scale; ++i) inv_scale[i] = 1.0f / state.channel_scale[i];
  for (size_t t = 0; t < n; ++t) {
    float* y = out + t * d;
    if (kind == KvKind::kValue) {
      decode_value_with_gain(layer, head, codes + t * cb, gains[t], y);
      for (int i = 0; i < d && state.mean; ++i) y[i] += state.mean[i];
      continue;
    }
    decode_key_with_gain(layer, head, codes + t * cb, gains[t], positions[t], y);
    if (state.channel_scale)  // S is constant on each RoPE pair, so it commutes with RoPE
      for (int i = 0; i < d; ++i) y[i] *= inv_scale[i];
    if (state.mean) {
      std::copy(state.mean, state.mean + d, mu);
      if (layout_.key_frame != transform::KeyFrame::kPostRope) apply_rope_fast(mu, positions[t]);
      for (int i = 0; i < d; ++i) y[i] += mu[i];
    }
  }
}

void CacheCodecs::rope_cos_sin(int32_t position, float* cos_out, float* sin_out) const {
  if (position < 0) detail::fail("RoPE position must be >= 0, got {}", position);
  for (int i = 0; i < n_pairs_; ++i) quant::rope_table_cos_sin(rope_tables_.data(), n_pairs_, position, i, cos_out[i], sin_out[i]);
}

void CacheCodecs::apply_rope_fast(float* x, int32_t position) const {
  if (position < 0) detail::fail("RoPE position must be >= 0, got {}", position);
  quant::RopeTableView v;
  v.table = rope_tables_.data();
  v.rotary_dim = rope_->rotary_dim();
  v.layout = rope_->params().layout;
  quant::rope_table_rotate(x, v, position, /*inverse=*/false);
}

void CacheCodecs::remove_rope_fast(float* x, int32_t position) const {
  if (position < 0) detail::fail("RoPE position must be >= 0, got {}", position);
  quant::RopeTableView v;
  v.table = rope_tables_.data();
  v.rotary_dim = rope_->rotary_dim();
  v.layout = rope_->params().layout;
  quant::rope_table_rotate(x, v, position, /*inverse=*/true);
}

void CacheCodecs::average_rope_pairs(float* x) const {
  const int rotary = rope_->rotary_dim();
  for (int i = 0; i < rotary / 2; ++i) {
    int a = 0, b = 0;
    transform::rope_pair_indices(rope_->params().layout, rotary, i, a, b);
    x[a] = x[b] = 0.5f * (x[a] + x[b]);
  }
}

// ---------------------------------------------------------------------------------------------

CompressedKV::CompressedKV(std::shared_ptr<const CacheCodecs> codecs) : codecs_(std::move(codecs)) {
  require(codecs_ != nullptr, "CompressedKV: null codecs");
  const auto& L = codecs_->layout();
  layers_.resize(static_cast<size_t>(L.n_layers));
  const size_t sets = L.per_head_positions ? static_cast<size_t>(L.n_kv_heads) : 1;
  for (auto& layer : layers_) {
    layer.positions.assign(sets, {});
    layer.window_positions.assign(sets, {});
    layer.tier_positions.assign(sets, {});
    layer.heads.assign(static_cast<size_t>(L.n_kv_heads), {});
  }
}

const CacheLayout& CompressedKV::layout() const {
  require(codecs_ != nullptr, "CompressedKV: empty cache (default-constructed)");
  return codecs_->layout();
}

const CompressedKV::LayerData& CompressedKV::layer(int l) const {
  detail::require(l >= 0 && l < n_layers(), "CompressedKV: layer {} out of range [0, {})", l, n_layers());
  return layers_[static_cast<size_t>(l)];
}
CompressedKV::LayerData& CompressedKV::mutable_layer(int l) {
  detail::require(l >= 0 && l < n_layers(), "CompressedKV: layer {} out of range [0, {})", l, n_layers());
  return layers_[static_cast<size_t>(l)];
}

const std::vector<int32_t>& CompressedKV::positions(int l, int h) const {
  const auto& ld = layer(l);
  require(h >= 0 && h < static_cast<int>(ld.heads.size()), "CompressedKV: head out of range");
  return ld.positions[ld.positions.size() == 1 ? 0 : static_cast<size_t>(h)];
}
const std::vector<int32_t>& CompressedKV::window_positions(int l, int h) const {
  const auto& ld = layer(l);
  require(h >= 0 && h < static_cast<int>(ld.heads.size()), "CompressedKV: head out of range");
  return ld.window_positions[ld.window_positions.size() == 1 ? 0 : static_cast<size_t>(h)];
}

const std::vector<int32_t>& CompressedKV::tier_positions(int l, int h) const {
  const auto& ld = layer(l);
  require(h >= 0 && h < static_cast<int>(ld.heads.size()), "CompressedKV: head out of range");
  return ld.tier_positions[ld.tier_positions.size() == 1 ? 0 : static_cast<size_t>(h)];
}

int64_t CompressedKV::original_tokens() const {
  int64_t n = 0;
  for (const auto& l : layers_) n = std::max(n, l.original_tokens);
  return n;
}

CompressedKV::ByteBreakdown CompressedKV::byte_breakdown() const {
  ByteBreakdown b;
  if (!valid()) return b;
  b.descriptor = layout().descriptor_bytes();
  std::vector<int32_t> all;
  for (const auto& l : layers_) {
    for (const auto& h : l.heads) {
      b.codes += h.key_codes.size() + h.value_codes.size() + h.tier_key_codes.size() + h.tier_value_codes.size();
      b.gains += 2 * (h.key_gains.size() + h.value_gains.size() + h.tier_key_gains.size() + h.tier_value_gains.size()) +
                 h.key_gain_codes.size() + h.value_gain_codes.size() + (h.key_gain_ref != 0 ? 2 : 0) +
                 (h.value_gain_ref != 0 ? 2 : 0);
      b.window += 2 * (h.window_keys.size() + h.window_values.size());
      b.means += 2 * (h.key_mean.size() + h.value_mean.size() + h.key_channel_scale.size());
    }
    for (const auto& e : l.query_energy) b.pending_energy += 4 * e.size();
    for (size_t s = 0; s < l.positions.size(); ++s) {
      // A set whose positions (coded, tier and window) form one contiguous run is stored as
      // (start, count); otherwise 4 bytes per position.
      all = l.positions[s];
      all.insert(all.end(), l.window_positions[s].begin(), l.window_positions[s].end());
      all.insert(all.end(), l.tier_positions[s].begin(), l.tier_positions[s].end());
      std::sort(all.begin(), all.end());
      bool contiguous = true;
      for (size_t i = 1; i < all.size(); ++i) contiguous = contiguous && all[i] == all[i - 1] + 1;
      b.positions += contiguous ? 8 : 4 * all.size();
    }
  }
  return b;
}

double CompressedKV::bytes_per_token() const {
  const int64_t n = original_tokens();
  return n > 0 ? static_cast<double>(bytes()) / static_cast<double>(n) : 0.0;
}

double CompressedKV::compression_ratio() const {
  if (!valid()) return 0.0;
  const auto& L = layout();
  double fp16 = 0;
  for (const auto& l : layers_) fp16 += static_cast<double>(l.original_tokens) * L.n_kv_heads * L.head_dim * 2 * 2;
  const size_t b = bytes();
  return b > 0 ? fp16 / static_cast<double>(b) : 0.0;
}

double CompressedKV::bits_per_element() const {
  if (!valid()) return 0.0;
  const auto& L = layout();
  double elements = 0;
  for (const auto& l : layers_) elements += static_cast<double>(l.original_tokens) * L.n_kv_heads * L.head_dim * 2;
  return elements > 0 ? 8.0 * static_cast<double>(bytes()) / elements : 0.0;
}

size_t CompressedKV::resident_bytes() const {
  size_t b = layers_.capacity() * sizeof(LayerData);
  auto cap = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
  for (const auto& l : layers_) {
    b += cap(l.positions) + cap(l.window_positions) + cap(l.tier_positions) + cap(l.heads) + cap(l.query_energy);
    for (const auto& p : l.positions) b += cap(p);
    for (const auto& p : l.window_positions) b += cap(p);
    for (const auto& p : l.tier_positions) b += cap(p);
    for (const auto& e : l.query_energy) b += cap(e);
    for (const auto& h : l.heads)
      b += cap(h.key_codes) + cap(h.value_codes) + cap(h.key_gains) + cap(h.value_gains) + cap(h.window_keys) +
           cap(h.window_values) + cap(h.key_mean) + cap(h.value_mean) + cap(h.key_channel_scale) +
           cap(h.key_gain_codes) + cap(h.value_gain_codes) + cap(h.tier_key_codes) + cap(h.tier_value_codes) +
           cap(h.tier_key_gains) + cap(h.tier_value_gains);
  }
  return b;
}

CompactHead CompressedKV::decompress_head(int l, int h) const {
  const auto& L = layout();
  const auto& ld = layer(l);
  require(h >= 0 && h < L.n_kv_heads, "decompress_head: head out of range");
  const auto& hd = ld.heads[static_cast<size_t>(h)];
  const auto& pos = positions(l, h);
  const auto& wpos = window_positions(l, h);
  const auto& tpos = tier_positions(l, h);
  const int d = L.head_dim;
  CompactHead out;
  out.positions = pos;
  out.positions.insert(out.positions.end(), tpos.begin(), tpos.end());
  out.positions.insert(out.positions.end(), wpos.begin(), wpos.end());
  const size_t n = out.positions.size(), nc = pos.size(), nt = tpos.size();
  out.keys.resize(n * d);
  out.values.resize(n * d);
  // Coded tokens, through the codec's inverse.
  std::vector<float> kg(nc, 0.f), vg(nc, 0.f), kmu, vmu, kscale;
  const auto key_gain = hd.key_gains_reader(), value_gain = hd.value_gains_reader();
  for (size_t t = 0; t < nc; ++t) {
    kg[t] = key_gain(t);
    vg[t] = value_gain(t);
  }
  auto floats = [](const std::vector<uint16_t>& h16, std::vector<float>& f) {
    f.resize(h16.size());
    fp16_bits_to_floats(h16.data(), f.data(), h16.size());
    return f.empty() ? nullptr : f.data();
  };
  CacheCodecs::HeadState ks, vs;
  ks.mean = floats(hd.key_mean, kmu);
  ks.channel_scale = floats(hd.key_channel_scale, kscale);
  vs.mean = floats(hd.value_mean, vmu);
  codecs_->decode(l, h, KvKind::kKey, nc, hd.key_codes.data(), kg.data(), pos.data(), ks, out.keys.data());
  codecs_->decode(l, h, KvKind::kValue, nc, hd.value_codes.data(), vg.data(), pos.data(), vs, out.values.data());
  // The code tier, then the fp16 window.
  if (nt > 0) {
    codecs_->decode_tier(l, h, KvKind::kKey, nt, hd.tier_key_codes.data(), hd.tier_key_gains.data(), tpos.data(), ks.mean,
                         out.keys.data() + nc * d);
    codecs_->decode_tier(l, h, KvKind::kValue, nt, hd.tier_value_codes.data(), hd.tier_value_gains.data(), tpos.data(),
                         vs.mean, out.values.data() + nc * d);
  }
  fp16_bits_to_floats(hd.window_keys.data(), out.keys.data() + (nc + nt) * d, wpos.size() * d);
  fp16_bits_to_floats(hd.window_values.data(), out.values.data() + (nc + nt) * d, wpos.size() * d);
  // Tier tokens and pinned ones (sinks, fp16 tier) sit at any position: order everything by position.
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return out.positions[a] < out.positions[b]; });
  CompactHead sorted;
  sorted.positions.resize(n);
  sorted.keys.resize(n * d);
  sorted.values.resize(n * d);
  for (size_t i = 0; i < n; ++i) {
    sorted.positions[i] = out.positions[order[i]];
    std::copy(&out.keys[order[i] * d], &out.keys[order[i] * d] + d, &sorted.keys[i * d]);
    std::copy(&out.values[order[i] * d], &out.values[order[i] * d] + d, &sorted.values[i * d]);
  }
  return sorted;
}

// The pinned tokens (sinks, fp16 tier) lead the window, ascending, and the unpinned ones follow,
// ascending; tier tokens are ascending: the latest token is the last coded one, the last tier
// one, the last pinned one or the window's last.
int64_t CompressedKV::LayerData::last_position(size_t set) const {
  int64_t last = -1;
  const auto& w = window_positions[set];
  if (!positions[set].empty()) last = positions[set].back();
  if (!tier_positions[set].empty()) last = std::max<int64_t>(last, tier_positions[set].back());
  if (!w.empty()) last = std::max<int64_t>(last, w.back());
  const size_t n_pinned = static_cast<size_t>(std::min<int64_t>(pinned, static_cast<int64_t>(w.size())));
  if (n_pinned > 0) last = std::max<int64_t>(last, w[n_pinned - 1]);
  return last;
}

int64_t CompressedKV::last_position(int l) const {
  const auto& ld = layer(l);
  int64_t last = -1;
  for (size_t s = 0; s < ld.positions.size(); ++s) last = std::max(last, ld.last_position(s));
  return last;
}

std::vector<int32_t> CompressedKV::stored_positions(int l) const {
  const auto& ld = layer(l);
  std::vector<int32_t> all;
  for (const auto* sets : {&ld.positions, &ld.tier_positions, &ld.window_positions})
    for (const auto& set : *sets) all.insert(all.end(), set.begin(), set.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

DenseLayer CompressedKV::decompress_layer(int l) const {
  const auto& L = layout();
  DenseLayer out;
  out.kv_heads = L.n_kv_heads;
  out.head_dim = L.head_dim;
  out.positions = stored_positions(l);  // the rows: every head's positions, once
  if (out.positions.empty()) return out;
  std::vector<CompactHead> heads;
  for (int h = 0; h < L.n_kv_heads; ++h) heads.push_back(decompress_head(l, h));
  out.first_position = out.positions.front();
  out.tokens = static_cast<int64_t>(out.positions.size());
  const int64_t H = L.n_kv_heads, d = L.head_dim;
  out.keys.assign(static_cast<size_t>(out.tokens * H * d), 0.f);
  out.values.assign(static_cast<size_t>(out.tokens * H * d), 0.f);
  out.mask.assign(static_cast<size_t>(H * out.tokens), -std::numeric_limits<float>::infinity());
  for (int64_t h = 0; h < H; ++h) {
    const auto& ch = heads[static_cast<size_t>(h)];
    auto row = out.positions.begin();
    for (size_t i = 0; i < ch.positions.size(); ++i) {
      row = std::lower_bound(row, out.positions.end(), ch.positions[i]);
      const int64_t t = row - out.positions.begin();
      out.mask[static_cast<size_t>(h * out.tokens + t)] = 0.f;
      std::copy(&ch.keys[i * d], &ch.keys[i * d] + d, &out.keys[static_cast<size_t>((t * H + h) * d)]);
      std::copy(&ch.values[i * d], &ch.values[i * d] + d, &out.values[static_cast<size_t>((t * H + h) * d)]);
    }
  }
  return out;
}

}  // namespace e8kv
