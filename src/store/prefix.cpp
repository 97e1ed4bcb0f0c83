// Prefix keys, the value envelope and the longest-prefix lookup (include/e8kv/store/prefix.hpp).
#include "e8kv/store/prefix.hpp"

#include <cstdio>
#include <cstring>

#include "e8kv/detail/byte_io.hpp"
#include "e8kv/container/checksum.hpp"
#include "e8kv/error.hpp"

namespace e8kv::store {

namespace {

constexpr char kMagic[8] = {'E', '8', 'K', 'V', 'S', 'T', 'O', '1'};
constexpr size_t kFixedBytes = 8 + 4 + 4 + 8 + 4 + 8 + 4;  // magic kind flags n_tokens key_len payload_len crc
constexpr size_t kMaxKeyBytes = 1024;

}  // namespace

Digest model_fingerprint(const std::vector<TensorRecord>& tensors, const std::string& layout) {
  std::vector<uint8_t> b;
  detail::ByteWriter w(b);
  const std::string tag = "e8kv-model-v1";
  w.bytes(tag.data(), tag.size());
  w.u64(tensors.size());
  for (const auto& t : tensors) {
    w.u64(t.name.size());
    w.bytes(t.name.data(), t.name.size());
    w.u32(t.type);
    w.u32(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) w.i64(d);
  }
  w.u64(layout.size());
  w.bytes(layout.data(), layout.size());
  return sha256(b.data(), b.size());
}

std::vector<std::string> prefix_keys(const Digest& fingerprint, const int32_t* tokens, size_t n_tokens,
                                     size_t chunk_tokens) {
  if (chunk_tokens < 1 || chunk_tokens > (size_t{1} << 20))
    throw Error("prefix_keys: chunk_tokens is " + std::to_string(chunk_tokens) + "; accepted 1 to 1048576");
  const std::string head = "e8kv:" + to_hex(fingerprint.data(), 16) + ":" + std::to_string(chunk_tokens) + ":";
  std::vector<uint8_t> b;
  detail::ByteWriter w(b);
  const std::string tag = "e8kv-prefix-v1";
  w.bytes(tag.data(), tag.size());
  w.bytes(fingerprint.data(), fingerprint.size());
  w.u64(chunk_tokens);
  Digest h = sha256(b.data(), b.size());
  std::vector<std::string> keys;
  keys.reserve(n_tokens / chunk_tokens);
  for (size_t c = 0; (c + 1) * chunk_tokens <= n_tokens; ++c) {
    b.assign(h.begin(), h.end());
    for (size_t t = c * chunk_tokens; t < (c + 1) * chunk_tokens; ++t) w.i32(tokens[t]);
    h = sha256(b.data(), b.size());
    keys.push_back(head + to_hex(h.data(), 16));
  }
  return keys;
}

std::vector<uint8_t> wrap(const std::string& key, const Envelope& envelope) {
  if (key.size() > kMaxKeyBytes) throw Error("store wrap: key longer than 1024 bytes");
  std::vector<uint8_t> b;
  b.reserve(kFixedBytes + key.size() + envelope.payload.size());
  detail::ByteWriter w(b);
  w.bytes(kMagic, 8);
  w.u32(static_cast<uint32_t>(envelope.kind));
  w.u32(0);  // flags
  w.u64(envelope.n_tokens);
  w.u32(static_cast<uint32_t>(key.size()));
  w.bytes(key.data(), key.size());
  w.u64(envelope.payload.size());
  w.bytes(envelope.payload);
  w.u32(container::crc32c(b.data(), b.size()));
  return b;
}

std::optional<Envelope> unwrap(const std::string& key, const uint8_t* data, size_t size, std::string* reason) {
  const auto refuse = [&](const std::string& why) -> std::optional<Envelope> {
    if (reason) *reason = why;
    return std::nullopt;
  };
  if (size < kFixedBytes) return refuse("value of " + std::to_string(size) + " bytes is shorter than an envelope");
  if (std::memcmp(data, kMagic, 8) != 0) return refuse("not an e8kv store value (magic differs)");
  // Every read below lies inside the value: its size is checked before each variable part, so
  // the reader (which would throw) never runs short and every refusal is a miss with a reason.
  detail::ByteReader crc(data + size - 4, 4, "store value");
  if (container::crc32c(data, size - 4) != crc.u32("crc")) return refuse("checksum mismatch (corrupt value)");
  detail::ByteReader r(data, size - 4, "store value");
  r.skip(8, "magic");
  Envelope e;
  const uint32_t kind = r.u32("kind");
  if (kind != 1 && kind != 2) return refuse("unknown value kind " + std::to_string(kind));
  e.kind = static_cast<ValueKind>(kind);
  if (r.u32("flags") != 0) return refuse("unknown flags (written by a newer e8kv?)");
  e.n_tokens = r.u64("n_tokens");
  const uint64_t key_len = r.u32("key length");
  if (key_len > size - kFixedBytes) return refuse("key length exceeds the value");
  const uint8_t* stored = r.take(key_len, "key");
  const std::string stored_key(reinterpret_cast<const char*>(stored), key_len);
  if (stored_key != key) return refuse("stored under another key ('" + stored_key + "'): foreign value");
  const uint64_t payload_len = r.u64("payload length");
  if (payload_len != size - kFixedBytes - key_len) return refuse("payload length does not match the value's size");
  r.bytes(e.payload, payload_len, "payload");
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
