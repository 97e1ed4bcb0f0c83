// Peer backends (simulated storage, honest byte counts) for the real-model evaluation.
#include "backends.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "e8kv/attention/dense.hpp"

namespace e8kv::eval {

namespace {
constexpr int kKiviGroup = 32;
constexpr int kKiviResidual = 128;

int relaxed_levels_k(PeerKind k) { return k == PeerKind::kRelaxedK3V2 ? 8 : 4; }
constexpr int kRelaxedLevelsV = 4;

// Rotate, quantize with q4_0/q8_0 (blocks of 32 along the head vector), dequantize, rotate back.
void llama_cpp_roundtrip(const transform::RandomizedHadamard& rot, bool q4, int d, float* x) {
  float t[512];
  rot.forward(x, t);
  uint8_t buf[34 * 16];
  for (int b = 0; b < d / 32; ++b) {
    if (q4) {
      codebook::encode_q4_0_block(t + 32 * b, buf);
      codebook::decode_q4_0_block(buf, t + 32 * b);
    } else {
      codebook::encode_q8_0_block(t + 32 * b, buf);
      codebook::decode_q8_0_block(buf, t + 32 * b);
    }
  }
  rot.inverse(t, x);
}

// Sylvester Hadamard H_d / sqrt(d) in place (symmetric: its own inverse), as NexusQuant's
// hadamard_matrix(d) builds it; d a power of two (NexusQuant raises for any other).
void sylvester_orthonormal(float* x, int d) {
  switch (d) {
    case 64: transform::fwht_orthonormal<64>(x); break;
    case 128: transform::fwht_orthonormal<128>(x); break;
    case 256: transform::fwht_orthonormal<256>(x); break;
    default: throw Error("relaxed peer: NexusQuant's Hadamard needs a power-of-two head_dim (64, 128, 256), got " +
                         std::to_string(d));
  }
}

// NexusQuant's quant-only path (NexusQuantQuantOnly.compress, nexusquant-kv 0.6.3): a plain
// Sylvester Hadamard, relaxed E8 with one amax scale per vector, back. Keys leave RoPE first and
// get it back after (done by the caller, in Hugging Face's channel order). 0.6.3's
// E8Lattice.nearest_point repairs the integer candidate's parity at the LARGEST rounding gap
// (Conway-Sloane; the 0.5.0 code the research read used the smallest) and still never repairs the
// half-integer candidate.
void relaxed_roundtrip(int levels, int d, float* x, std::vector<int16_t>& codes_out) {
  float t[512];
  std::copy(x, x + d, t);
  sylvester_orthonormal(t, d);
  int16_t codes[512];
  float scale = 0.f;
  codebook::relaxed_encode(t, d, levels, codebook::RelaxedScaling::kPerVector, codebook::RelaxedRepair::kArgmaxCorrect,
                           codes, &scale);
  codebook::relaxed_decode(codes, &scale, d, codebook::RelaxedScaling::kPerVector, t);
  codes_out.insert(codes_out.end(), codes, codes + d);
  sylvester_orthonormal(t, d);
  std::copy(t, t + d, x);
}

// Coset-conditional empirical entropy (bits per element) of relaxed codes, 8-blocks.
double relaxed_entropy(const std::vector<int16_t>& codes) {
  if (codes.empty()) return 0.0;
  std::vector<size_t> flag(2, 0), elems(2, 0);
  std::vector<std::vector<size_t>> hist(2, std::vector<size_t>(65536, 0));
  const size_t blocks = codes.size() / 8;
  for (size_t b = 0; b < blocks; ++b) {
    int odd = 0;
    for (int i = 0; i < 8; ++i) odd |= codes[8 * b + i] & 1;
    ++flag[odd];
    for (int i = 0; i < 8; ++i) {
      ++hist[odd][static_cast<uint16_t>(codes[8 * b + i])];
      ++elems[odd];
    }
  }
  double bits = 0;
  for (int c = 0; c < 2; ++c) {
    if (flag[c]) bits -= flag[c] * std::log2(double(flag[c]) / blocks);
    for (size_t n : hist[c])
      if (n) bits -= n * std::log2(double(n) / elems[c]);
  }
  return bits / static_cast<double>(blocks * 8);
}
}  // namespace

namespace {
/// The library's dense attention of one query token over n rows of `n_kv_heads` heads, `stride`
/// floats apart (0: n_kv_heads·head_dim).
void attend_rows(const float* k, const float* v, int64_t n, int64_t stride, int n_kv_heads, int n_q_heads, int head_dim,
                 const float* q, float scale, float* out, float* lse) {
  DenseRows rows;
  rows.keys = k;
  rows.values = v;
  rows.dtype = DType::kF32;
  rows.n = n;  // positions null: row r at position r, so the query at n − 1 sees every row
  rows.row_stride = stride;
  const int32_t last = static_cast<int32_t>(std::max<int64_t>(n - 1, 0));
  dense_attention(rows, DenseShape{n_kv_heads, n_q_heads, head_dim, scale, 0}, q, &last, 1, out, lse);
}
}  // namespace

void dense_attention_lse(const float* k, const float* v, int64_t n, int n_kv_heads, int n_q_heads, int head_dim,
                         const float* q, float scale, float* out, float* lse) {
  attend_rows(k, v, n, 0, n_kv_heads, n_q_heads, head_dim, q, scale, out, lse);
}

void E8kvBackend::append(int layer, const float* k, const float* v, int64_t position) {
  if (!at_rest_) {
    c_.append(cache_, layer, k, v, static_cast<int32_t>(position));
    return;
  }
  // The checks c_.append would make (the dense rows skip it): a later position, finite values.
  require(layer >= 0 && layer < cache_.n_layers(), "at-rest append: layer " + std::to_string(layer) + " out of range");
  auto& last = tail_last_[static_cast<size_t>(layer)];
  require(position > std::max(last, cache_.last_position(layer)),
          "at-rest append: position " + std::to_string(position) + " does not follow the stored tokens of layer " +
              std::to_string(layer));
  const size_t row = static_cast<size_t>(H_) * d_;
  for (size_t i = 0; i < row; ++i)
    require(std::isfinite(k[i]) && std::isfinite(v[i]), "at-rest append: non-finite key or value at layer " +
                                                             std::to_string(layer) + ", element " + std::to_string(i));
  last = position;
  auto& tk = tail_k_[static_cast<size_t>(layer)];
  auto& tv = tail_v_[static_cast<size_t>(layer)];
  tk.insert(tk.end(), k, k + row);
  tv.insert(tv.end(), v, v + row);
}

void E8kvBackend::attend(int layer, const float* q, int64_t position, float* out) {
  const auto& tk = tail_k_[static_cast<size_t>(layer)];
  if (!at_rest_ || tk.empty()) {
    c_.attend(cache_, layer, q, static_cast<int32_t>(position), out);
    return;
  }
  const size_t n = static_cast<size_t>(Q_) * d_;
  o_codes_.resize(n);
  o_tail_.resize(n);
  lse_codes_.resize(static_cast<size_t>(Q_));
  lse_tail_.resize(static_cast<size_t>(Q_));
  e8kv::attend(cache_, layer, q, o_codes_.data(), lse_codes_.data());
  const float scale = cache_.layout().effective_softmax_scale();
  dense_attention_lse(tk.data(), tail_v_[static_cast<size_t>(layer)].data(),
                      static_cast<int64_t>(tk.size() / (static_cast<size_t>(H_) * d_)), H_, Q_, d_, q, scale,
                      o_tail_.data(), lse_tail_.data());
  merge_attention(o_codes_.data(), lse_codes_.data(), o_tail_.data(), lse_tail_.data(), Q_, d_, out, lse_codes_.data());
}

PeerBackend::PeerBackend(PeerKind kind, const llama::ModelConfig& mc, const llama::PrefillCapture& capture)
    : kind_(kind), L_(mc.n_layers), H_(mc.n_kv_heads), Q_(mc.n_heads), d_(mc.head_dim),
      n_(static_cast<size_t>(L_), 0), k_(static_cast<size_t>(L_) * H_), v_(static_cast<size_t>(L_) * H_),
      kivi_k_done_(static_cast<size_t>(L_), 0), kivi_v_done_(static_cast<size_t>(L_), 0),
      relaxed_codes_k_(static_cast<size_t>(L_)), relaxed_codes_v_(static_cast<size_t>(L_)) {
  require(d_ % 32 == 0, "peer backends need head_dim % 32 == 0");
  if (kind_ == PeerKind::kRelaxedK3V2 || kind_ == PeerKind::kRelaxedK2V2) {
    require(mc.rope_dim == 0 || mc.rope_dim == d_, "relaxed peer: partial rotary (rope_dim " +
                                                      std::to_string(mc.rope_dim) + " < head_dim) is not modelled");
    auto rp = llama::rope_params(mc);
    rp.layout = transform::RopeLayout::kSplitHalf;  // applied in Hugging Face's channel order
    relaxed_rope_ = std::make_unique<transform::Rope>(rp);
    adjacent_pairs_ = mc.rope_adjacent_pairs;
  }
  for (int l = 0; l < L_; ++l)
    for (int h = 0; h < H_; ++h) rot_.emplace_back(d_, 0xA11CEull + 131ull * l + h);
  for (int64_t t = 0; t < capture.n_tokens; ++t)
    for (int l = 0; l < L_; ++l)
      append(l, &capture.k[l][static_cast<size_t>(t) * H_ * d_], &capture.v[l][static_cast<size_t>(t) * H_ * d_], t);
}

// The key in Hugging Face's channel order (GGUF Llama keys rotate adjacent pairs: HF's element
// half·d/2 + i is GGUF's 2i + half), RoPE removed there as NexusQuant's inverse_rope does, coded,
// RoPE applied again, back to the engine's order.
void PeerBackend::relaxed_key_roundtrip(float* k, int64_t position, std::vector<int16_t>& codes) const {
  float hf[512];
  if (adjacent_pairs_) {
    for (int i = 0; i < d_ / 2; ++i) {
      hf[i] = k[2 * i];
      hf[d_ / 2 + i] = k[2 * i + 1];
    }
  } else {
    std::copy(k, k + d_, hf);
  }
  relaxed_rope_->remove(hf, position);
  relaxed_roundtrip(relaxed_levels_k(kind_), d_, hf, codes);
  relaxed_rope_->apply(hf, position);
  if (adjacent_pairs_) {
    for (int i = 0; i < d_ / 2; ++i) {
      k[2 * i] = hf[i];
      k[2 * i + 1] = hf[d_ / 2 + i];
    }
  } else {
    std::copy(hf, hf + d_, k);
  }
}

void PeerBackend::append(int layer, const float* k, const float* v, int64_t position) {
  float kb[512], vb[512];
  for (int h = 0; h < H_; ++h) {
    std::copy(k + h * d_, k + (h + 1) * d_, kb);
    std::copy(v + h * d_, v + (h + 1) * d_, vb);
    const auto& rot = rot_[at(layer, h)];
    // At rest (after stop_quantizing) every peer keeps appended rows as given.
    if (quantize_appended_) switch (kind_) {
      case PeerKind::kQ8_0Rotated:
      case PeerKind::kQ4_0Rotated:
        llama_cpp_roundtrip(rot, kind_ == PeerKind::kQ4_0Rotated, d_, kb);
        llama_cpp_roundtrip(rot, kind_ == PeerKind::kQ4_0Rotated, d_, vb);
        break;
      case PeerKind::kRelaxedK3V2:
      case PeerKind::kRelaxedK2V2:
        relaxed_key_roundtrip(kb, position, relaxed_codes_k_[static_cast<size_t>(layer)]);
        relaxed_roundtrip(kRelaxedLevelsV, d_, vb, relaxed_codes_v_[static_cast<size_t>(layer)]);
        break;
      case PeerKind::kKivi2:
      case PeerKind::kKivi4:
        break;  // kept as given; kivi_flush quantizes rows once they leave the fp16 window
    }
    auto& K = k_[at(layer, h)];
    auto& V = v_[at(layer, h)];
    K.insert(K.end(), kb, kb + d_);
    V.insert(V.end(), vb, vb + d_);
  }
  ++n_[static_cast<size_t>(layer)];
  if (kivi() && quantize_appended_) kivi_flush(layer);
}

// KIVI: values leave the fp16 window one token at a time (per-token groups); keys in whole groups
// of 32 tokens (per-channel groups along the token axis).
void PeerBackend::kivi_flush(int layer) {
  const int bits = kind_ == PeerKind::kKivi2 ? 2 : 4;
  const int64_t n = n_[static_cast<size_t>(layer)];
  auto& vdone = kivi_v_done_[static_cast<size_t>(layer)];
  auto& kdone = kivi_k_done_[static_cast<size_t>(layer)];
  uint8_t codes[kKiviGroup];
  uint16_t scale = 0, zero = 0;
  for (int h = 0; h < H_; ++h) {
    auto& V = v_[at(layer, h)];
    for (int64_t t = vdone; t < n - kKiviResidual; ++t)
      for (int g = 0; g < d_ / kKiviGroup; ++g) {
        float* row = &V[static_cast<size_t>(t * d_ + g * kKiviGroup)];
        codebook::kivi_encode_group(row, kKiviGroup, 1, bits, codes, &scale, &zero);
        codebook::kivi_decode_group(codes, scale, zero, kKiviGroup, bits, row, 1);
      }
    auto& K = k_[at(layer, h)];
    for (int64_t t0 = kdone; t0 + kKiviGroup <= n - kKiviResidual; t0 += kKiviGroup)
      for (int c = 0; c < d_; ++c) {
        float* col = &K[static_cast<size_t>(t0 * d_ + c)];
        codebook::kivi_encode_group(col, kKiviGroup, d_, bits, codes, &scale, &zero);
        codebook::kivi_decode_group(codes, scale, zero, kKiviGroup, bits, col, d_);
      }
  }
  vdone = std::max<int64_t>(vdone, n - kKiviResidual);
  while (kdone + kKiviGroup <= n - kKiviResidual) kdone += kKiviGroup;
}

void PeerBackend::attend(int layer, const float* q, int64_t /*position*/, float* out) {
  const int64_t n = n_[static_cast<size_t>(layer)];
  const int G = Q_ / H_;
  const float scale = 1.f / std::sqrt(static_cast<float>(d_));
  // The peer's rows (decoded from its own codes) per KV head, [n][d].
  for (int h = 0; h < H_; ++h)
    attend_rows(k_[at(layer, h)].data(), v_[at(layer, h)].data(), n, d_, 1, G, d_, q + static_cast<size_t>(h) * G * d_,
                scale, out + static_cast<size_t>(h) * G * d_, nullptr);
}

double PeerBackend::bytes() const {
  double total = 0;
  for (int l = 0; l < L_; ++l) {
    const double n = static_cast<double>(n_[static_cast<size_t>(l)]);
    const double vectors = n * H_;
    switch (kind_) {
      case PeerKind::kQ8_0Rotated: total += 2 * vectors * (d_ / 32) * codebook::kQ8_0BlockBytes; break;
      case PeerKind::kQ4_0Rotated: total += 2 * vectors * (d_ / 32) * codebook::kQ4_0BlockBytes; break;
      case PeerKind::kKivi2:
      case PeerKind::kKivi4:
        total += H_ * static_cast<double>(codebook::kivi_cache_bytes(static_cast<int>(n), d_,
                                                                    kind_ == PeerKind::kKivi2 ? 2 : 4, kKiviGroup,
                                                                    kKiviResidual));
        break;
      case PeerKind::kRelaxedK3V2:
      case PeerKind::kRelaxedK2V2: {
        const double elems = vectors * d_;
        total += elems * relaxed_entropy(relaxed_codes_k_[static_cast<size_t>(l)]) / 8.0 + 2 * vectors;
        total += elems * relaxed_entropy(relaxed_codes_v_[static_cast<size_t>(l)]) / 8.0 + 2 * vectors;
        break;
      }
    }
  }
  return total;
}

std::string PeerBackend::rate_note() const {
  switch (kind_) {
    case PeerKind::kRelaxedK3V2:
    case PeerKind::kRelaxedK2V2:
      return "relaxed parity has no fixed-rate index: rate = empirical entropy of its codes (coset flag + "
             "per coordinate, per layer) + fp16 scales";
    case PeerKind::kKivi2:
    case PeerKind::kKivi4:
      return "KIVI: group 32, fp16 scale+zero per group, 128-token fp16 window counted";
    default:
      return "llama.cpp block format after a Hadamard rotation: 32 elements + fp16 scale";
  }
}

}  // namespace e8kv::eval
