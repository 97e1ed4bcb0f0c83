// Content digests of caches, shared by the golden-file writer (bench/container) and the
// container test: CRC-32C over a canonical walk of everything a cache holds, so a digest taken
// from the in-memory cache before writing can be compared with one of the cache read back.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/container/checksum.hpp"
#include "e8kv/container/container.hpp"

namespace e8kv::test {

class Digest {
 public:
  template <class T>
  void add_vector(const std::vector<T>& v) {
    add_u64(v.size());
    if (!v.empty()) crc_ = container::crc32c(v.data(), v.size() * sizeof(T), crc_);
  }
  void add_u64(uint64_t x) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(x >> (8 * i));
    crc_ = container::crc32c(b, 8, crc_);
  }
  uint32_t value() const { return crc_; }
  std::string hex() const {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", crc_);
    return buf;
  }

 private:
  uint32_t crc_ = 0;
};

/// Digest of one layer's data (positions, codes, gains, windows, means, original_tokens, pinned).
inline void add_layer(Digest& d, const CompressedKV::LayerData& ld) {
  d.add_u64(static_cast<uint64_t>(ld.original_tokens));
  d.add_u64(static_cast<uint64_t>(ld.pinned));
  d.add_u64(ld.positions.size());
  for (size_t s = 0; s < ld.positions.size(); ++s) {
    d.add_vector(ld.positions[s]);
    d.add_vector(ld.window_positions[s]);
  }
  d.add_u64(ld.heads.size());
  for (const auto& h : ld.heads) {
    d.add_vector(h.key_codes);
    d.add_vector(h.value_codes);
    d.add_vector(h.key_gains);
    d.add_vector(h.value_gains);
    d.add_vector(h.window_keys);
    d.add_vector(h.window_values);
    d.add_vector(h.key_mean);
    d.add_vector(h.value_mean);
  }
}

/// Digest of a whole cache's data (the layout is compared field by field, not digested).
inline std::string cache_digest(const CompressedKV& cache) {
  Digest d;
  d.add_u64(static_cast<uint64_t>(cache.n_layers()));
  for (int l = 0; l < cache.n_layers(); ++l) add_layer(d, cache.layer(l));
  return d.hex();
}

/// What format version 2 adds to a layer: per head the key channel scales, the 8-bit gain codes
/// and their references, then the pending query energies.
inline void add_layer_v2(Digest& d, const CompressedKV::LayerData& ld) {
  for (const auto& h : ld.heads) {
    d.add_vector(h.key_channel_scale);
    d.add_vector(h.key_gain_codes);
    d.add_vector(h.value_gain_codes);
    d.add_u64(h.key_gain_ref);
    d.add_u64(h.value_gain_ref);
  }
  d.add_u64(ld.query_energy.size());
  for (const auto& e : ld.query_energy) d.add_vector(e);
}

/// What format version 5 adds to a layer: the code tier, per set its positions, per head its
/// codes and fp16 gains.
inline void add_layer_v5(Digest& d, const CompressedKV::LayerData& ld) {
  d.add_u64(ld.tier_positions.size());
  for (const auto& t : ld.tier_positions) d.add_vector(t);
  for (const auto& h : ld.heads) {
    d.add_vector(h.tier_key_codes);
    d.add_vector(h.tier_value_codes);
    d.add_vector(h.tier_key_gains);
    d.add_vector(h.tier_value_gains);
  }
}

/// Digest of a whole cache's data including what format version 2 adds (golden files of versions
/// 2 to 4 record this one; cache_digest stays what version-1 files record).
inline std::string cache_digest_v2(const CompressedKV& cache) {
  Digest d;
  d.add_u64(static_cast<uint64_t>(cache.n_layers()));
  for (int l = 0; l < cache.n_layers(); ++l) {
    add_layer(d, cache.layer(l));
    add_layer_v2(d, cache.layer(l));
  }
  return d.hex();
}

/// Digest of a whole cache's data including what format versions 2 and 5 add (golden files of
/// version 5 record this one).
inline std::string cache_digest_v5(const CompressedKV& cache) {
  Digest d;
  d.add_u64(static_cast<uint64_t>(cache.n_layers()));
  for (int l = 0; l < cache.n_layers(); ++l) {
    add_layer(d, cache.layer(l));
    add_layer_v2(d, cache.layer(l));
    add_layer_v5(d, cache.layer(l));
  }
  return d.hex();
}

/// cache_digest_v5 plus what format version 6 adds to a layout: whether the code tier is centred
/// and the RoPE frequency factors.
inline std::string cache_digest_v6(const CompressedKV& cache) {
  Digest d;
  d.add_u64(static_cast<uint64_t>(cache.n_layers()));
  for (int l = 0; l < cache.n_layers(); ++l) {
    add_layer(d, cache.layer(l));
    add_layer_v2(d, cache.layer(l));
    add_layer_v5(d, cache.layer(l));
  }
  const CacheLayout& L = cache.layout();
  d.add_u64(L.tier_centered ? 1 : 0);
  d.add_vector(L.rope.freq_factors);
  return d.hex();
}

/// The digest golden files of format `version` record (tests/data/golden.txt).
inline std::string cache_digest_for_version(const CompressedKV& cache, int version) {
  if (version == 1) return cache_digest(cache);
  if (version >= 6) return cache_digest_v6(cache);
  return version < 5 ? cache_digest_v2(cache) : cache_digest_v5(cache);
}

/// Digest of a plain cache (dtype, shape, elements).
inline std::string plain_digest(const container::PlainCache& p) {
  Digest d;
  d.add_u64(static_cast<uint64_t>(p.dtype));
  d.add_u64(static_cast<uint64_t>(p.tokens));
  d.add_u64(static_cast<uint64_t>(p.heads));
  d.add_u64(static_cast<uint64_t>(p.head_dim));
  d.add_u64(p.tensors.size());
  for (const auto& t : p.tensors) d.add_vector(t);
  return d.hex();
}

}  // namespace e8kv::test
