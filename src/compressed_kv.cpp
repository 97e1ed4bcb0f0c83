// CompressedKV and CacheCodecs: encoding of single vectors, flushing, byte accounting, the CPU
// reference decode attention and decompression.
#include "e8kv/cache/compressed_kv.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/numeric/random.hpp"

namespace e8kv {

namespace {
constexpr int kRopeLevelBits = 10;
constexpr int kRopeLevelEntries[3] = {1 << kRopeLevelBits, 1 << kRopeLevelBits, 1 << 11};
constexpr int kRopeLevelOffset[3] = {0, 1 << kRopeLevelBits, 2 << kRopeLevelBits};
constexpr int kRopeTotalEntries = (2 << kRopeLevelBits) + (1 << 11);

// Rotary pair p covers coordinates (first, second) in the given layout.
inline void pair_coords(transform::RopeLayout layout, int rotary_dim, int p, int& a, int& b) {
  if (layout == transform::RopeLayout::kSplitHalf) {
    a = p;
    b = p + rotary_dim / 2;
  } else {
    a = 2 * p;
    b = 2 * p + 1;
  }
}

inline float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

float CacheLayout::effective_softmax_scale() const {
  return softmax_scale > 0.f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

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
  rope_tables_.resize(static_cast<size_t>(kRopeTotalEntries) * n_pairs_ * 2);
  for (int level = 0; level < 3; ++level) {
    const double step = std::ldexp(1.0, kRopeLevelBits * level);
    for (int e = 0; e < kRopeLevelEntries[level]; ++e) {
      float* row = &rope_tables_[static_cast<size_t>(kRopeLevelOffset[level] + e) * n_pairs_ * 2];
      for (int p = 0; p < n_pairs_; ++p) {
        const double angle = std::fmod(e * step * inv[static_cast<size_t>(p)], 2.0 * M_PI);
        row[2 * p] = static_cast<float>(std::cos(angle));
        row[2 * p + 1] = static_cast<float>(std::sin(angle));
      }
    }
  }
}

const transform::RandomizedHadamard& CacheCodecs::rotation(int layer, int head, int kind) const {
  return rotations_[(static_cast<size_t>(layer) * layout_.n_kv_heads + head) * 2 + kind];
}

void CacheCodecs::encode_key(int layer, int head, const float* k, int32_t position, uint8_t* codes,
                             uint16_t* gain) const {
  const auto& q = key_quantizer(layer);
  if (q.codec() == quant::Codec::kFp16) {
    q.encode(k, codes, gain);
    return;
  }
  float tmp[512];
  std::copy(k, k + layout_.head_dim, tmp);
  if (layout_.keys_pre_rope) rope_->remove(tmp, position);
  rotation(layer, head, 0).forward(tmp, tmp);
  q.encode(tmp, codes, gain);
}

void CacheCodecs::encode_value(int layer, int head, const float* v, uint8_t* codes, uint16_t* gain) const {
  const auto& q = value_quantizer(layer);
  if (q.codec() == quant::Codec::kFp16) {
    q.encode(v, codes, gain);
    return;
  }
  float tmp[512];
  rotation(layer, head, 1).forward(v, tmp);
  q.encode(tmp, codes, gain);
}

void CacheCodecs::decode_key(int layer, int head, const uint8_t* codes, uint16_t gain, int32_t position,
                             float* k) const {
  const auto& q = key_quantizer(layer);
  q.decode(codes, gain, k);
  if (q.codec() == quant::Codec::kFp16) return;
  rotation(layer, head, 0).inverse(k, k);
  if (layout_.keys_pre_rope) apply_rope_fast(k, position);
}

void CacheCodecs::decode_value(int layer, int head, const uint8_t* codes, uint16_t gain, float* v) const {
  const auto& q = value_quantizer(layer);
  q.decode(codes, gain, v);
  if (q.codec() == quant::Codec::kFp16) return;
  rotation(layer, head, 1).inverse(v, v);
}

void CacheCodecs::rope_cos_sin(int32_t position, float* cos_out, float* sin_out) const {
  require(position >= 0, "RoPE position must be >= 0, got " + std::to_string(position));
  const uint32_t p = static_cast<uint32_t>(position);
  const uint32_t idx[3] = {p & 1023u, (p >> 10) & 1023u, p >> 20};
  const float* t0 = &rope_tables_[static_cast<size_t>(kRopeLevelOffset[0] + idx[0]) * n_pairs_ * 2];
  const float* t1 = &rope_tables_[static_cast<size_t>(kRopeLevelOffset[1] + idx[1]) * n_pairs_ * 2];
  const float* t2 = &rope_tables_[static_cast<size_t>(kRopeLevelOffset[2] + idx[2]) * n_pairs_ * 2];
  for (int i = 0; i < n_pairs_; ++i) {
    // e^{i(a+b+c)} = e^{ia}·e^{ib}·e^{ic}
    const float c01 = t0[2 * i] * t1[2 * i] - t0[2 * i + 1] * t1[2 * i + 1];
    const float s01 = t0[2 * i] * t1[2 * i + 1] + t0[2 * i + 1] * t1[2 * i];
    cos_out[i] = c01 * t2[2 * i] - s01 * t2[2 * i + 1];
    sin_out[i] = c01 * t2[2 * i + 1] + s01 * t2[2 * i];
  }
}

void CacheCodecs::apply_rope_fast(float* x, int32_t position) const {
  float c[256], s[256];
  rope_cos_sin(position, c, s);
  const auto& rp = rope_->params();
  const int rd = rp.rotary_dim > 0 ? rp.rotary_dim : layout_.head_dim;
  for (int p = 0; p < n_pairs_; ++p) {
    int a, b;
    pair_coords(rp.layout, rd, p, a, b);
    const float xa = x[a], xb = x[b];
    x[a] = xa * c[p] - xb * s[p];
    x[b] = xb * c[p] + xa * s[p];
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
  for (const auto& l : layers_) {
    for (const auto& h : l.heads) {
      b.codes += h.key_codes.size() + h.value_codes.size();
      b.gains += 2 * (h.key_gains.size() + h.value_gains.size());
      b.window += 2 * (h.window_keys.size() + h.window_values.size());
    }
    for (size_t s = 0; s < l.positions.size(); ++s) {
      // A set whose positions form one contiguous run is stored as (start, count).
      const auto& c = l.positions[s];
      const auto& w = l.window_positions[s];
      const size_t n = c.size() + w.size();
      bool contiguous = true;
      int32_t prev = 0;
      size_t i = 0;
      for (const auto* v : {&c, &w})
        for (int32_t p : *v) {
          if (i++ > 0 && p != prev + 1) contiguous = false;
          prev = p;
        }
      b.positions += contiguous ? 8 : 4 * n;
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
  const bool k_gain = kq.gain_bytes() > 0, v_gain = vq.gain_bytes() > 0;
  const size_t sets = ld.positions.size();
  for (size_t s = 0; s < sets; ++s) {
    const int64_t w = static_cast<int64_t>(ld.window_positions[s].size());
    if (w < L.residual_length + L.flush_block) continue;
    const int64_t move = (w - L.residual_length) / L.flush_block * L.flush_block;
    const auto& wpos = ld.window_positions[s];
    // Heads served by this set: all heads when shared, head s alone otherwise.
    const int h_begin = sets == 1 ? 0 : static_cast<int>(s);
    const int h_end = sets == 1 ? L.n_kv_heads : static_cast<int>(s) + 1;
    float k[512], v[512];
    for (int h = h_begin; h < h_end; ++h) {
      auto& hd = ld.heads[static_cast<size_t>(h)];
      const size_t kc0 = hd.key_codes.size(), vc0 = hd.value_codes.size();
      hd.key_codes.resize(kc0 + static_cast<size_t>(move) * kcb);
      hd.value_codes.resize(vc0 + static_cast<size_t>(move) * vcb);
      const size_t kg0 = hd.key_gains.size(), vg0 = hd.value_gains.size();
      if (k_gain) hd.key_gains.resize(kg0 + static_cast<size_t>(move));
      if (v_gain) hd.value_gains.resize(vg0 + static_cast<size_t>(move));
      for (int64_t t = 0; t < move; ++t) {
        for (int i = 0; i < d; ++i) {
          k[i] = fp16_bits_to_float(hd.window_keys[static_cast<size_t>(t * d + i)]);
          v[i] = fp16_bits_to_float(hd.window_values[static_cast<size_t>(t * d + i)]);
        }
        uint16_t kg = 0, vg = 0;
        codecs_->encode_key(l, h, k, wpos[static_cast<size_t>(t)], &hd.key_codes[kc0 + static_cast<size_t>(t) * kcb], &kg);
        codecs_->encode_value(l, h, v, &hd.value_codes[vc0 + static_cast<size_t>(t) * vcb], &vg);
        if (k_gain) hd.key_gains[kg0 + static_cast<size_t>(t)] = kg;
        if (v_gain) hd.value_gains[vg0 + static_cast<size_t>(t)] = vg;
      }
      hd.window_keys.erase(hd.window_keys.begin(), hd.window_keys.begin() + move * d);
      hd.window_values.erase(hd.window_values.begin(), hd.window_values.begin() + move * d);
    }
    auto& pos = ld.positions[s];
    pos.insert(pos.end(), wpos.begin(), wpos.begin() + move);
    ld.window_positions[s].erase(ld.window_positions[s].begin(), ld.window_positions[s].begin() + move);
  }
}

namespace {

// Softmax in place over n logits; returns nothing (all -inf gives zeros).
void softmax_inplace(float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  if (n == 0 || m == -std::numeric_limits<float>::infinity()) {
    std::fill(x, x + n, 0.f);
    return;
  }
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = static_cast<float>(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

void CompressedKV::attend(int l, const float* q, int32_t position, float* out) const {
  (void)position;  // every stored token precedes the query; kept for API symmetry with kernels
  const auto& L = layout();
  const auto& ld = layer(l);
  const int H = L.n_kv_heads, G = L.n_q_heads / L.n_kv_heads, d = L.head_dim;
  const float scale = L.effective_softmax_scale();
  const auto& kq = codecs_->key_quantizer(l);
  const auto& vq = codecs_->value_quantizer(l);
  const bool k_fp16 = kq.codec() == quant::Codec::kFp16, v_fp16 = vq.codec() == quant::Codec::kFp16;
  const size_t kcb = kq.code_bytes(), vcb = vq.code_bytes();
  std::vector<float> logits, q_rot(static_cast<size_t>(G * d)), acc_rot(static_cast<size_t>(G * d)),
      acc(static_cast<size_t>(G * d));
  float kbuf[512], vbuf[512];
  for (int h = 0; h < H; ++h) {
    const auto& hd = ld.heads[static_cast<size_t>(h)];
    const auto& pos = positions(l, h);
    const int64_t nc = static_cast<int64_t>(pos.size());
    const int64_t nw = window_tokens(l, h);
    const int64_t n = nc + nw;
    logits.assign(static_cast<size_t>(G * n), 0.f);
    const float* qh = q + static_cast<size_t>(h) * G * d;
    const bool rotated_dot = !k_fp16 && !L.keys_pre_rope;
    if (rotated_dot)
      for (int g = 0; g < G; ++g) codecs_->rotation(l, h, 0).forward(qh + g * d, &q_rot[static_cast<size_t>(g * d)]);
    // Keys: coded part.
    if (k_fp16) {
      for (int64_t t = 0; t < nc; ++t) {
        kq.decode(&hd.key_codes[static_cast<size_t>(t) * kcb], 0, kbuf);
        for (int g = 0; g < G; ++g) logits[static_cast<size_t>(g * n + t)] = dot(qh + g * d, kbuf, d) * scale;
      }
    } else {
      quant::dispatch_block_code(kq.codec(), [&](auto code) {
        using Code = decltype(code);
        const auto& rot = codecs_->rotation(l, h, 0);
        for (int64_t t = 0; t < nc; ++t) {
          quant::decode_vector<Code>(&hd.key_codes[static_cast<size_t>(t) * kcb], hd.key_gains[static_cast<size_t>(t)], d, kbuf);
          if (rotated_dot) {
            for (int g = 0; g < G; ++g)
              logits[static_cast<size_t>(g * n + t)] = dot(&q_rot[static_cast<size_t>(g * d)], kbuf, d) * scale;
          } else {
            rot.inverse(kbuf, kbuf);
            codecs_->apply_rope_fast(kbuf, pos[static_cast<size_t>(t)]);
            for (int g = 0; g < G; ++g) logits[static_cast<size_t>(g * n + t)] = dot(qh + g * d, kbuf, d) * scale;
          }
        }
        return 0;
      });
    }
    // Keys: residual window (fp16, post-RoPE).
    for (int64_t t = 0; t < nw; ++t) {
      for (int i = 0; i < d; ++i) kbuf[i] = fp16_bits_to_float(hd.window_keys[static_cast<size_t>(t * d + i)]);
      for (int g = 0; g < G; ++g) logits[static_cast<size_t>(g * n + nc + t)] = dot(qh + g * d, kbuf, d) * scale;
    }
    for (int g = 0; g < G; ++g) softmax_inplace(&logits[static_cast<size_t>(g * n)], n);
    // Values.
    std::fill(acc_rot.begin(), acc_rot.end(), 0.f);
    std::fill(acc.begin(), acc.end(), 0.f);
    auto accumulate = [&](std::vector<float>& dst, int64_t t, const float* v) {
      for (int g = 0; g < G; ++g) {
        const float p = logits[static_cast<size_t>(g * n + t)];
        float* a = &dst[static_cast<size_t>(g * d)];
        for (int i = 0; i < d; ++i) a[i] += p * v[i];
      }
    };
    if (v_fp16) {
      for (int64_t t = 0; t < nc; ++t) {
        vq.decode(&hd.value_codes[static_cast<size_t>(t) * vcb], 0, vbuf);
        accumulate(acc, t, vbuf);
      }
    } else {
      quant::dispatch_block_code(vq.codec(), [&](auto code) {
        using Code = decltype(code);
        for (int64_t t = 0; t < nc; ++t) {
          quant::decode_vector<Code>(&hd.value_codes[static_cast<size_t>(t) * vcb], hd.value_gains[static_cast<size_t>(t)], d, vbuf);
          accumulate(acc_rot, t, vbuf);
        }
        return 0;
      });
    }
    for (int64_t t = 0; t < nw; ++t) {
      for (int i = 0; i < d; ++i) vbuf[i] = fp16_bits_to_float(hd.window_values[static_cast<size_t>(t * d + i)]);
      accumulate(acc, nc + t, vbuf);
    }
    for (int g = 0; g < G; ++g) {
      float* o = out + (static_cast<size_t>(h) * G + g) * d;
      if (!v_fp16 && nc > 0) {
        codecs_->rotation(l, h, 1).inverse(&acc_rot[static_cast<size_t>(g * d)], o);
        for (int i = 0; i < d; ++i) o[i] += acc[static_cast<size_t>(g * d + i)];
      } else {
        for (int i = 0; i < d; ++i) o[i] = acc[static_cast<size_t>(g * d + i)];
      }
    }
  }
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
  for (size_t t = 0; t < pos.size(); ++t) {
    codecs_->decode_key(l, h, &hd.key_codes[t * kcb], hd.key_gains.empty() ? 0 : hd.key_gains[t], pos[t], &out.keys[t * d]);
    codecs_->decode_value(l, h, &hd.value_codes[t * vcb], hd.value_gains.empty() ? 0 : hd.value_gains[t],
                          &out.values[t * d]);
  }
  for (size_t t = 0; t < wpos.size(); ++t)
    for (int i = 0; i < d; ++i) {
      out.keys[(pos.size() + t) * d + i] = fp16_bits_to_float(hd.window_keys[t * d + i]);
      out.values[(pos.size() + t) * d + i] = fp16_bits_to_float(hd.window_values[t * d + i]);
    }
  return out;
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
