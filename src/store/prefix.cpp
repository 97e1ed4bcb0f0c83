// Prefix keys, the value envelope and the longest-prefix lookup (include/e8kv/store/prefix.hpp).
#include "e8kv/store/prefix.hpp"

#include <cstdio>
#include <cstring>

#include "e8kv/entropy/checksum.hpp"
#include "e8kv/error.hpp"

namespace e8kv::store {

namespace {

// ---- SHA-256 (FIPS 180-4) ----
constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void sha256_block(uint32_t h[8], const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) | p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

constexpr char kMagic[8] = {'E', '8', 'K', 'V', 'S', 'T', 'O', '1'};
constexpr size_t kFixedBytes = 8 + 4 + 4 + 8 + 4 + 8 + 4;  // magic kind flags n_tokens key_len payload_len crc
constexpr size_t kMaxKeyBytes = 1024;

}  // namespace

Digest sha256(const uint8_t* data, size_t size) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  size_t i = 0;
  for (; i + 64 <= size; i += 64) sha256_block(h, data + i);
  uint8_t tail[128] = {};
  const size_t rest = size - i;
  if (rest) std::memcpy(tail, data + i, rest);
  tail[rest] = 0x80;
  const size_t tail_len = rest + 9 <= 64 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(size) * 8;
  for (int k = 0; k < 8; ++k) tail[tail_len - 1 - k] = static_cast<uint8_t>(bits >> (8 * k));
  for (size_t k = 0; k < tail_len; k += 64) sha256_block(h, tail + k);
  Digest d;
  for (int k = 0; k < 8; ++k)
    for (int j = 0; j < 4; ++j) d[4 * k + j] = static_cast<uint8_t>(h[k] >> (24 - 8 * j));
  return d;
}

std::string to_hex(const uint8_t* data, size_t size) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  s.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    s.push_back(hex[data[i] >> 4]);
    s.push_back(hex[data[i] & 15]);
  }
  return s;
}

Digest model_fingerprint(const std::vector<TensorRecord>& tensors, const std::string& layout) {
  std::vector<uint8_t> b;
  const std::string tag = "e8kv-model-v1";
  b.insert(b.end(), tag.begin(), tag.end());
  put_u64(b, tensors.size());
  for (const auto& t : tensors) {
    put_u64(b, t.name.size());
    b.insert(b.end(), t.name.begin(), t.name.end());
    put_u32(b, t.type);
    put_u32(b, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put_u64(b, static_cast<uint64_t>(d));
  }
  put_u64(b, layout.size());
  b.insert(b.end(), layout.begin(), layout.end());
  return sha256(b.data(), b.size());
}

std::vector<std::string> prefix_keys(const Digest& fingerprint, const int32_t* tokens, size_t n_tokens,
                                     size_t chunk_tokens) {
  if (chunk_tokens < 1 || chunk_tokens > (size_t{1} << 20))
    throw Error("prefix_keys: chunk_tokens is " + std::to_string(chunk_tokens) + "; accepted 1 to 1048576");
  const std::string head = "e8kv:" + to_hex(fingerprint.data(), 16) + ":" + std::to_string(chunk_tokens) + ":";
  std::vector<uint8_t> b;
  const std::string tag = "e8kv-prefix-v1";
  b.insert(b.end(), tag.begin(), tag.end());
  b.insert(b.end(), fingerprint.begin(), fingerprint.end());
  put_u64(b, chunk_tokens);
  Digest h = sha256(b.data(), b.size());
  std::vector<std::string> keys;
  keys.reserve(n_tokens / chunk_tokens);
  for (size_t c = 0; (c + 1) * chunk_tokens <= n_tokens; ++c) {
    b.assign(h.begin(), h.end());
    for (size_t t = c * chunk_tokens; t < (c + 1) * chunk_tokens; ++t) put_u32(b, static_cast<uint32_t>(tokens[t]));
    h = sha256(b.data(), b.size());
    keys.push_back(head + to_hex(h.data(), 16));
  }
  return keys;
}

std::vector<uint8_t> wrap(const std::string& key, const Envelope& envelope) {
  if (key.size() > kMaxKeyBytes) throw Error("store wrap: key longer than 1024 bytes");
  std::vector<uint8_t> b;
  b.reserve(kFixedBytes + key.size() + envelope.payload.size());
  b.resize(8);
  std::memcpy(b.data(), kMagic, 8);
  put_u32(b, static_cast<uint32_t>(envelope.kind));
  put_u32(b, 0);  // flags
  put_u64(b, envelope.n_tokens);
  put_u32(b, static_cast<uint32_t>(key.size()));
  b.insert(b.end(), key.begin(), key.end());
  put_u64(b, envelope.payload.size());
  b.insert(b.end(), envelope.payload.begin(), envelope.payload.end());
  put_u32(b, entropy::crc32c(b.data(), b.size()));
  return b;
}

std::optional<Envelope> unwrap(const std::string& key, const uint8_t* data, size_t size, std::string* reason) {
  const auto refuse = [&](const std::string& why) -> std::optional<Envelope> {
    if (reason) *reason = why;
    return std::nullopt;
  };
  if (size < kFixedBytes) return refuse("value of " + std::to_string(size) + " bytes is shorter than an envelope");
  if (std::memcmp(data, kMagic, 8) != 0) return refuse("not an e8kv store value (magic differs)");
  const uint32_t stored_crc = static_cast<uint32_t>(get_le(data + size - 4, 4));
  if (entropy::crc32c(data, size - 4) != stored_crc) return refuse("checksum mismatch (corrupt value)");
  Envelope e;
  const uint32_t kind = static_cast<uint32_t>(get_le(data + 8, 4));
  if (kind != 1 && kind != 2) return refuse("unknown value kind " + std::to_string(kind));
  e.kind = static_cast<ValueKind>(kind);
  if (get_le(data + 12, 4) != 0) return refuse("unknown flags (written by a newer e8kv?)");
  e.n_tokens = get_le(data + 16, 8);
  const uint64_t key_len = get_le(data + 24, 4);
  if (key_len > size - kFixedBytes) return refuse("key length exceeds the value");
  const std::string stored_key(reinterpret_cast<const char*>(data + 28), key_len);
  if (stored_key != key) return refuse("stored under another key ('" + stored_key + "'): foreign value");
  const uint64_t payload_len = get_le(data + 28 + key_len, 8);
  if (payload_len != size - kFixedBytes - key_len) return refuse("payload length does not match the value's size");
  const uint8_t* p = data + 36 + key_len;
  e.payload.assign(p, p + payload_len);
  return e;
}

void log_to_stderr(const std::string& key, const std::string& reason) {
  std::fprintf(stderr, "e8kv store: miss: %s: %s\n", key.c_str(), reason.c_str());
}

PrefixHit find_longest_prefix(Store& store, const std::vector<std::string>& keys, size_t chunk_tokens,
                              const PayloadCheck& check, const MissLog& log) {
  PrefixHit hit;
  if (keys.empty()) return hit;
  const std::vector<bool> present = store.exists(keys);
  hit.round_trips = 1;
  const auto refused = [&](const std::string& key, const std::string& why) {
    if (log) log(key, why);
  };
  for (size_t i = keys.size(); i-- > 0;) {
    if (!present[i]) continue;
    const std::string& key = keys[i];
    const uint64_t want = static_cast<uint64_t>(i + 1) * chunk_tokens;
    auto bytes = store.get(key);
    ++hit.round_trips;
    if (!bytes) continue;  // expired or removed since EXISTS
    std::string why;
    auto env = unwrap(key, bytes->data(), bytes->size(), &why);
    if (!env) { refused(key, why); continue; }
    std::string data_key = key;
    if (env->kind == ValueKind::kReference) {
      if (env->n_tokens != want) { refused(key, "reference covers " + std::to_string(env->n_tokens) + " tokens, key names " + std::to_string(want)); continue; }
      data_key.assign(env->payload.begin(), env->payload.end());
      auto target = store.get(data_key);
      ++hit.round_trips;
      if (!target) { refused(key, "reference to " + data_key + ", which is gone"); continue; }
      env = unwrap(data_key, target->data(), target->size(), &why);
      if (!env) { refused(data_key, why); continue; }
      if (env->kind != ValueKind::kData) { refused(data_key, "reference target is not data"); continue; }
      if (env->n_tokens < want) { refused(data_key, "reference target covers fewer tokens than the prefix"); continue; }
    } else if (env->n_tokens != want) {
      refused(key, "data covers " + std::to_string(env->n_tokens) + " tokens, key names " + std::to_string(want));
      continue;
    }
    if (check) {
      try {
        check(env->payload.data(), env->payload.size());
      } catch (const std::exception& e) {
        refused(data_key, std::string("payload refused: ") + e.what());
        continue;
      }
    }
    hit.chunks = i + 1;
    hit.n_tokens = static_cast<size_t>(want);
    hit.key = key;
    hit.data_key = data_key;
    hit.data_tokens = env->n_tokens;
    hit.payload = std::move(env->payload);
    return hit;
  }
  return hit;
}

PublishResult publish_prefix(Store& store, const std::vector<std::string>& keys, size_t chunk_tokens,
                             const std::vector<uint8_t>& payload, std::chrono::milliseconds ttl, bool references) {
  PublishResult r;
  if (keys.empty()) throw Error("publish_prefix: no keys (the sequence is shorter than one chunk)");
  const uint64_t n = static_cast<uint64_t>(keys.size()) * chunk_tokens;
  Envelope data{ValueKind::kData, n, payload};
  r.data_stored = store.put_if_absent(keys.back(), wrap(keys.back(), data), ttl) ? 1 : 0;
  if (!references || keys.size() < 2) return r;
  std::vector<std::string> shorter(keys.begin(), keys.end() - 1);
  const std::vector<bool> present = store.exists(shorter);
  for (size_t i = 0; i < shorter.size(); ++i) {
    if (present[i]) continue;
    Envelope ref{ValueKind::kReference, static_cast<uint64_t>(i + 1) * chunk_tokens,
                 std::vector<uint8_t>(keys.back().begin(), keys.back().end())};
    r.references_stored += store.put_if_absent(shorter[i], wrap(shorter[i], ref), ttl) ? 1 : 0;
  }
  return r;
}

}  // namespace e8kv::store
