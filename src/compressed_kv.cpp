// CompressedKV and CacheCodecs: encoding of single vectors, flushing, byte accounting, the CPU
// reference decode attention and decompression.
#include "e8kv/cache/compressed_kv.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

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

CacheCodecs::CacheCodecs(CacheLayout layout) : layout_(std::move(layout)) {
  const auto& L = layout_;
  require(L.n_layers >= 0 && static_cast<int>(L.key_codec.size()) == L.n_layers &&
              static_cast<int>(L.value_codec.size()) == L.n_layers,
          "CacheLayout: one key and one value codec per layer are required");
  for (int l = 0; l < L.n_layers; ++l) {
    key_q_.emplace_back(L.head_dim, L.key_codec[static_cast<size_t>(l)], L.key_gain, L.key_scale);
    value_q_.emplace_back(L.head_dim, L.value_codec[static_cast<size_t>(l)], L.value_gain, L.value_scale);
  }
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
  rope_tables_ = quant::build_rope_table(inv.data(), n_pairs_);
  if (layout_.key_frame != transform::KeyFrame::kPostRope)
    rope_low_planar_ = build_planar_rope_low(rope_tables_, n_pairs_);
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
  require(layer >= 0 && layer < layout_.n_layers && head >= 0 && head < layout_.n_kv_heads && (kind == 0 || kind == 1),
          "CacheCodecs::codec_args: (layer " + std::to_string(layer) + ", head " + std::to_string(head) + ", kind " +
              std::to_string(kind) + ") out of range");
  quant::VectorCodecArgs a;
  a.head_dim = layout_.head_dim;
  a.scale = kind == 0 ? layout_.key_scale : layout_.value_scale;
  a.gain = kind == 0 ? layout_.key_gain : layout_.value_gain;
  a.sign_bits = rotation(layer, head, kind).sign_bits();
  return a;
}

namespace {
void require_finite(const float* x, int d, const char* what) {
  uint32_t special = 0;  // all-ones exponent: Inf or NaN (bit test: vectorizes, unlike isfinite)
  for (int i = 0; i < d; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    special |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  if (special == 0) return;
  for (int i = 0; i < d; ++i)
    if (!std::isfinite(x[i])) throw Error(std::string(what) + ": non-finite input at element " + std::to_string(i));
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
    throw Error("CacheCodecs::encode_key: position must be >= 0 for pre-RoPE keys, got " + std::to_string(position));
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
    throw Error("CacheCodecs::decode_key: position must be >= 0 for pre-RoPE keys, got " + std::to_string(position));
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

void CacheCodecs::rope_cos_sin(int32_t position, float* cos_out, float* sin_out) const {
  if (position < 0) throw Error("RoPE position must be >= 0, got " + std::to_string(position));
  for (int i = 0; i < n_pairs_; ++i) quant::rope_table_cos_sin(rope_tables_.data(), n_pairs_, position, i, cos_out[i], sin_out[i]);
}

void CacheCodecs::apply_rope_fast(float* x, int32_t position) const {
  if (position < 0) throw Error("RoPE position must be >= 0, got " + std::to_string(position));
  quant::RopeTableView v;
  v.table = rope_tables_.data();
  v.rotary_dim = rope_->rotary_dim();
  v.layout = rope_->params().layout;
  quant::rope_table_rotate(x, v, position, /*inverse=*/false);
}

void CacheCodecs::remove_rope_fast(float* x, int32_t position) const {
  if (position < 0) throw Error("RoPE position must be >= 0, got " + std::to_string(position));
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
    layer.heads.assign(static_cast<size_t>(L.n_kv_heads), {});
  }
}

const CacheLayout& CompressedKV::layout() const {
  require(codecs_ != nullptr, "CompressedKV: empty cache (default-constructed)");
  return codecs_->layout();
}

const CompressedKV::LayerData& CompressedKV::layer(int l) const {
  require(l >= 0 && l < n_layers(), "CompressedKV: layer " + std::to_string(l) + " out of range [0, " +
                                        std::to_string(n_layers()) + ")");
  return layers_[static_cast<size_t>(l)];
}
CompressedKV::LayerData& CompressedKV::mutable_layer(int l) {
  require(l >= 0 && l < n_layers(), "CompressedKV: layer " + std::to_string(l) + " out of range [0, " +
                                        std::to_string(n_layers()) + ")");
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
      b.codes += h.key_codes.size() + h.value_codes.size();
      b.gains += 2 * (h.key_gains.size() + h.value_gains.size()) + h.key_gain_codes.size() + h.value_gain_codes.size() +
                 (h.key_gain_ref != 0 ? 2 : 0) + (h.value_gain_ref != 0 ? 2 : 0);
      b.window += 2 * (h.window_keys.size() + h.window_values.size());
      b.means += 2 * (h.key_mean.size() + h.value_mean.size() + h.key_channel_scale.size());
    }
    for (size_t s = 0; s < l.positions.size(); ++s) {
      // A set whose positions (coded and window) form one contiguous run is stored as
      // (start, count); otherwise 4 bytes per position.
      all = l.positions[s];
      all.insert(all.end(), l.window_positions[s].begin(), l.window_positions[s].end());
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

void CompressedKV::flush(int l) {
  const auto& L = layout();
  auto& ld = mutable_layer(l);
  const int d = L.head_dim;
  const auto& kq = codecs_->key_quantizer(l);
  const auto& vq = codecs_->value_quantizer(l);
  const size_t kcb = kq.code_bytes(), vcb = vq.code_bytes();
  const bool k_coded = kq.codec() != quant::Codec::kFp16, v_coded = vq.codec() != quant::Codec::kFp16;
  const bool k_gain = kq.gain_bytes() > 0, v_gain = vq.gain_bytes() > 0;
  const size_t sets = ld.positions.size();
  const int64_t p = ld.pinned;
  for (size_t s = 0; s < sets; ++s) {
    // Heads served by this set: all heads when shared, head s alone otherwise.
    const int h_begin = sets == 1 ? 0 : static_cast<int>(s);
    const int h_end = sets == 1 ? L.n_kv_heads : static_cast<int>(s) + 1;
    const int64_t flushable = static_cast<int64_t>(ld.window_positions[s].size()) - p;
    const bool need_mean = L.center && (k_coded || v_coded) && ld.positions[s].empty();
    int64_t threshold = static_cast<int64_t>(L.residual_length) + L.flush_block;
    if (need_mean) threshold = std::max<int64_t>(threshold, L.mean_tokens);
    if (flushable < threshold) continue;
    const int64_t move = (flushable - L.residual_length) / L.flush_block * L.flush_block;
    const auto& wpos = ld.window_positions[s];
    float k[512], v[512], mu[512];
    for (int h = h_begin; h < h_end; ++h) {
      auto& hd = ld.heads[static_cast<size_t>(h)];
      if (need_mean) {
        // Means over the first mean_tokens unpinned window tokens, keys in their coding frame.
        std::vector<double> km(static_cast<size_t>(d), 0.0), vm(static_cast<size_t>(d), 0.0);
        for (int64_t t = p; t < p + L.mean_tokens; ++t) {
          for (int i = 0; i < d; ++i) {
            k[i] = fp16_bits_to_float(hd.window_keys[static_cast<size_t>(t * d + i)]);
            vm[static_cast<size_t>(i)] += fp16_bits_to_float(hd.window_values[static_cast<size_t>(t * d + i)]);
          }
          // The mean of pre-RoPE keys, with RoPE removed by the same table that later puts it
          // back at each position (CacheCodecs::apply_rope_fast): one frame throughout.
          if (L.key_frame != transform::KeyFrame::kPostRope) {
            if (wpos[static_cast<size_t>(t)] < 0)
              throw Error("compress: RoPE position must be >= 0, got " + std::to_string(wpos[static_cast<size_t>(t)]));
            codecs_->remove_rope_fast(k, wpos[static_cast<size_t>(t)]);
          }
          for (int i = 0; i < d; ++i) km[static_cast<size_t>(i)] += k[i];
        }
        hd.key_mean.clear();
        hd.value_mean.clear();
        for (int i = 0; i < d && k_coded; ++i) hd.key_mean.push_back(float_to_fp16_bits(static_cast<float>(km[i] / L.mean_tokens)));
        for (int i = 0; i < d && v_coded; ++i) hd.value_mean.push_back(float_to_fp16_bits(static_cast<float>(vm[i] / L.mean_tokens)));
        if (k_coded && L.query_weighted_keys && !ld.query_energy.empty())
          hd.key_channel_scale = key_channel_scales(l, h, ld.query_energy[static_cast<size_t>(h)], p, wpos);
      }
      const size_t kc0 = hd.key_codes.size(), vc0 = hd.value_codes.size();
      hd.key_codes.resize(kc0 + static_cast<size_t>(move) * kcb);
      hd.value_codes.resize(vc0 + static_cast<size_t>(move) * vcb);
      const size_t kg0 = hd.key_gains.size(), vg0 = hd.value_gains.size();
      if (k_gain) hd.key_gains.resize(kg0 + static_cast<size_t>(move));
      if (v_gain) hd.value_gains.resize(vg0 + static_cast<size_t>(move));
      // The means as floats once per head (the same values key_mean_at starts from).
      float key_mean[512], value_mean[512], key_scale[512];
      fp16_bits_to_floats(hd.key_mean.data(), key_mean, hd.key_mean.size());
      fp16_bits_to_floats(hd.key_channel_scale.data(), key_scale, hd.key_channel_scale.size());
      const bool k_scaled = !hd.key_channel_scale.empty();
      fp16_bits_to_floats(hd.value_mean.data(), value_mean, hd.value_mean.size());
      for (int64_t t = 0; t < move; ++t) {
        const size_t w = static_cast<size_t>(p + t);
        const int32_t pos = wpos[w];
        fp16_bits_to_floats(&hd.window_keys[w * d], k, static_cast<size_t>(d));
        fp16_bits_to_floats(&hd.window_values[w * d], v, static_cast<size_t>(d));
        if (!hd.key_mean.empty()) {
          std::copy(key_mean, key_mean + d, mu);
          if (L.key_frame != transform::KeyFrame::kPostRope) codecs_->apply_rope_fast(mu, pos);  // = key_mean_at
          for (int i = 0; i < d; ++i) k[i] -= mu[i];
        }
        if (k_scaled)
          for (int i = 0; i < d; ++i) k[i] *= key_scale[i];
        for (int i = 0; i < static_cast<int>(hd.value_mean.size()); ++i) v[i] -= value_mean[i];
        uint16_t kg = 0, vg = 0;
        codecs_->encode_key(l, h, k, pos, &hd.key_codes[kc0 + static_cast<size_t>(t) * kcb], &kg);
        codecs_->encode_value(l, h, v, &hd.value_codes[vc0 + static_cast<size_t>(t) * vcb], &vg);
        if (k_gain) hd.key_gains[kg0 + static_cast<size_t>(t)] = kg;
        if (v_gain) hd.value_gains[vg0 + static_cast<size_t>(t)] = vg;
      }
      if (L.gain_bits == 8) {
        // The block's fp16 gains become 8-bit codes; the first block sets the references.
        if (k_gain) gains_to_codes(hd.key_gains, hd.key_gain_codes, hd.key_gain_ref);
        if (v_gain) gains_to_codes(hd.value_gains, hd.value_gain_codes, hd.value_gain_ref);
      }
      hd.window_keys.erase(hd.window_keys.begin() + p * d, hd.window_keys.begin() + (p + move) * d);
      hd.window_values.erase(hd.window_values.begin() + p * d, hd.window_values.begin() + (p + move) * d);
    }
    auto& pos = ld.positions[s];
    pos.insert(pos.end(), wpos.begin() + p, wpos.begin() + p + move);
    ld.window_positions[s].erase(ld.window_positions[s].begin() + p, ld.window_positions[s].begin() + p + move);
  }
}

std::vector<uint16_t> CompressedKV::key_channel_scales(int l, int h, const std::vector<float>& query_energy,
                                                      int64_t first, const std::vector<int32_t>& wpos) const {
  // Floor added to both energies (a share of their mean): a channel that the 32 observation
  // queries barely touch may still matter later, and a near-constant key channel must not get
  // an unbounded scale. The exponent is below the Cauchy–Schwarz optimum 1/4: the energies are
  // estimated from few queries, so the scales are shrunk toward 1. Both were chosen on
  // SmolLM2 at ctx 1024 (docs/accuracy.md, "Query-weighted keys"); KL varied by ±15 % over
  // floor 0.01–0.5 and exponent 0.1–0.35, all far below unscaled keys.
  constexpr double kFloor = 0.2;
  constexpr double kExponent = 0.2;
  const auto& L = layout();
  const int d = L.head_dim;
  const auto& hd = layers_[static_cast<size_t>(l)].heads[static_cast<size_t>(h)];
  std::vector<double> key_energy(static_cast<size_t>(d), 0.0);
  float k[512], mu[512];
  for (int64_t t = first; t < first + L.mean_tokens; ++t) {
    fp16_bits_to_floats(&hd.window_keys[static_cast<size_t>(t * d)], k, static_cast<size_t>(d));
    key_mean_at(l, h, wpos[static_cast<size_t>(t)], mu);
    for (int i = 0; i < d; ++i) key_energy[static_cast<size_t>(i)] += static_cast<double>(k[i] - mu[i]) * (k[i] - mu[i]);
  }
  std::vector<float> sigma2(static_cast<size_t>(d));
  double mean_w = 0, mean_s = 0;
  for (int i = 0; i < d; ++i) {
    sigma2[static_cast<size_t>(i)] = static_cast<float>(key_energy[static_cast<size_t>(i)] / L.mean_tokens);
    mean_w += query_energy[static_cast<size_t>(i)] / d;
  }
  codecs_->average_rope_pairs(sigma2.data());
  for (float s : sigma2) mean_s += static_cast<double>(s) / d;
  std::vector<double> s(static_cast<size_t>(d));
  double log_sum = 0;
  for (int i = 0; i < d; ++i) {
    const double w = query_energy[static_cast<size_t>(i)] + kFloor * mean_w + 1e-30;
    const double e = sigma2[static_cast<size_t>(i)] + kFloor * mean_s + 1e-30;
    s[static_cast<size_t>(i)] = std::pow(w / e, kExponent);
    log_sum += std::log(s[static_cast<size_t>(i)]);
  }
  const double norm = std::exp(-log_sum / d);  // geometric mean 1 (the gain absorbs any scale)
  std::vector<uint16_t> out(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) out[static_cast<size_t>(i)] = float_to_fp16_bits(static_cast<float>(s[static_cast<size_t>(i)] * norm));
  return out;
}

void CompressedKV::gains_to_codes(std::vector<uint16_t>& fp16_gains, std::vector<uint8_t>& codes, uint16_t& ref) {
  if (fp16_gains.empty()) return;
  if (ref == 0) {
    // Reference: the geometric mean of the first block's non-zero gains, so the ±4 octaves of
    // the code sit around this head's typical gain.
    double log_sum = 0;
    int n = 0;
    for (uint16_t g : fp16_gains) {
      const float f = fp16_bits_to_float(g);
      if (f > 0.f) {
        log_sum += std::log2(static_cast<double>(f));
        ++n;
      }
    }
    ref = float_to_fp16_bits(n > 0 ? static_cast<float>(std::exp2(log_sum / n)) : 1.0f);
    if (ref == 0) ref = float_to_fp16_bits(6.1e-5f);  // keep the reference positive
  }
  const float r = fp16_bits_to_float(ref);
  for (uint16_t g : fp16_gains) codes.push_back(quant::gain_to_code(fp16_bits_to_float(g), r));
  fp16_gains.clear();
}

void CompressedKV::key_mean_at(int l, int h, int32_t position, float* mu) const {
  const auto& L = layout();
  const auto& km = layers_[static_cast<size_t>(l)].heads[static_cast<size_t>(h)].key_mean;
  for (int i = 0; i < L.head_dim; ++i) mu[i] = km.empty() ? 0.f : fp16_bits_to_float(km[static_cast<size_t>(i)]);
  if (!km.empty() && L.key_frame != transform::KeyFrame::kPostRope) codecs_->apply_rope_fast(mu, position);
}

CompactHead CompressedKV::decompress_head(int l, int h) const {
  const auto& L = layout();
  const auto& ld = layer(l);
  require(h >= 0 && h < L.n_kv_heads, "decompress_head: head out of range");
  const auto& hd = ld.heads[static_cast<size_t>(h)];
  const auto& pos = positions(l, h);
  const auto& wpos = window_positions(l, h);
  const int d = L.head_dim;
  const size_t kcb = codecs_->key_quantizer(l).code_bytes(), vcb = codecs_->value_quantizer(l).code_bytes();
  CompactHead out;
  out.positions = pos;
  out.positions.insert(out.positions.end(), wpos.begin(), wpos.end());
  const size_t n = out.positions.size();
  out.keys.resize(n * d);
  out.values.resize(n * d);
  float mu[512], inv_scale[512];
  const auto key_gain = hd.key_gains_reader(), value_gain = hd.value_gains_reader();
  const bool k_scaled = !hd.key_channel_scale.empty();
  for (int i = 0; i < d && k_scaled; ++i) inv_scale[i] = 1.0f / fp16_bits_to_float(hd.key_channel_scale[static_cast<size_t>(i)]);
  for (size_t t = 0; t < pos.size(); ++t) {
    codecs_->decode_key_with_gain(l, h, &hd.key_codes[t * kcb], key_gain(t), pos[t], &out.keys[t * d]);
    if (k_scaled)  // S is constant on each RoPE pair, so it commutes with the RoPE decode_key applied
      for (int i = 0; i < d; ++i) out.keys[t * d + i] *= inv_scale[i];
    codecs_->decode_value_with_gain(l, h, &hd.value_codes[t * vcb], value_gain(t), &out.values[t * d]);
    if (!hd.key_mean.empty()) {
      key_mean_at(l, h, pos[t], mu);
      for (int i = 0; i < d; ++i) out.keys[t * d + i] += mu[i];
    }
    for (size_t i = 0; i < hd.value_mean.size(); ++i) out.values[t * d + i] += fp16_bits_to_float(hd.value_mean[i]);
  }
  for (size_t t = 0; t < wpos.size(); ++t)
    for (int i = 0; i < d; ++i) {
      out.keys[(pos.size() + t) * d + i] = fp16_bits_to_float(hd.window_keys[t * d + i]);
      out.values[(pos.size() + t) * d + i] = fp16_bits_to_float(hd.window_values[t * d + i]);
    }
  // Pinned sinks sit at the front of the window: order everything by position.
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

DenseLayer CompressedKV::decompress_layer(int l) const {
  const auto& L = layout();
  DenseLayer out;
  out.kv_heads = L.n_kv_heads;
  out.head_dim = L.head_dim;
  int32_t lo = std::numeric_limits<int32_t>::max(), hi = std::numeric_limits<int32_t>::min();
  std::vector<CompactHead> heads;
  for (int h = 0; h < L.n_kv_heads; ++h) {
    heads.push_back(decompress_head(l, h));
    for (int32_t p : heads.back().positions) {
      lo = std::min(lo, p);
      hi = std::max(hi, p);
    }
  }
  if (lo > hi) return out;
  out.first_position = lo;
  out.tokens = static_cast<int64_t>(hi) - lo + 1;
  const int64_t H = L.n_kv_heads, d = L.head_dim;
  out.keys.assign(static_cast<size_t>(out.tokens * H * d), 0.f);
  out.values.assign(static_cast<size_t>(out.tokens * H * d), 0.f);
  out.mask.assign(static_cast<size_t>(H * out.tokens), -std::numeric_limits<float>::infinity());
  for (int64_t h = 0; h < H; ++h) {
    const auto& ch = heads[static_cast<size_t>(h)];
    for (size_t i = 0; i < ch.positions.size(); ++i) {
      const int64_t t = ch.positions[i] - lo;
      out.mask[static_cast<size_t>(h * out.tokens + t)] = 0.f;
      std::copy(&ch.keys[i * d], &ch.keys[i * d] + d, &out.keys[static_cast<size_t>((t * H + h) * d)]);
      std::copy(&ch.values[i * d], &ch.values[i * d] + d, &out.values[static_cast<size_t>((t * H + h) * d)]);
    }
  }
  return out;
}

}  // namespace e8kv
