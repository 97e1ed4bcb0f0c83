// Keys that name a model and a token prefix, values wrapped in a checked envelope, and the longest
// stored prefix of a prompt found in one batched lookup.
//
// Key of the first n·C tokens of a sequence (C = chunk_tokens):
//   h_0 = SHA-256("e8kv-prefix-v1" | fingerprint | C)
//   h_i = SHA-256(h_{i-1} | tokens[(i-1)·C, i·C) as int32 little-endian)
//   key = "e8kv:" + hex(fingerprint)[0:32] + ":" + C + ":" + hex(h_n)[0:32]
// so a prompt's keys are computed locally, chunk by chunk, and one EXISTS round trip finds the
// longest prefix stored by any server of the fleet. The fingerprint names the model (the GGUF's
// tensor names, shapes and types) and the e8kv layout (the Config of each KV cache); a server
// with another model, quantization or preset never sees these keys.
//
// A value ("envelope") holds: magic "E8KVSTO1", kind (data or a reference to a longer entry),
// the tokens it covers, the key it was stored under, the payload and a CRC-32C over all of it.
// unwrap checks every field; a value that fails (truncated, corrupt, stored under another key, of
// another kind) is a miss whose reason is logged, never an exception or a wrong cache.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "e8kv/store/store.hpp"

namespace e8kv::store {

using Digest = std::array<uint8_t, 32>;
/// SHA-256 (FIPS 180-4).
Digest sha256(const uint8_t* data, size_t size);
std::string to_hex(const uint8_t* data, size_t size);

/// What the fingerprint reads from a model file: one record per tensor, in file order.
struct TensorRecord {
  std::string name;
  std::vector<int64_t> dims;
  uint32_t type = 0;
};
/// The model's fingerprint: its tensors (names, shapes, types) and `layout` (the e8kv layout and
/// Config of the caches, any string that must match between writer and reader).
Digest model_fingerprint(const std::vector<TensorRecord>& tensors, const std::string& layout);

/// The keys of the prefixes of `tokens` that end on a chunk boundary: keys[i] names the first
/// (i + 1)·chunk_tokens tokens. chunk_tokens in [1, 1 << 20].
std::vector<std::string> prefix_keys(const Digest& fingerprint, const int32_t* tokens, size_t n_tokens,
                                     size_t chunk_tokens);

enum class ValueKind : uint32_t {
  kData = 1,       ///< the payload is the cache of the key's prefix (or of a longer one, see n_tokens)
  kReference = 2,  ///< the payload is the key of a longer entry holding this prefix
};
struct Envelope {
  ValueKind kind = ValueKind::kData;
  uint64_t n_tokens = 0;  ///< tokens of the prefix the payload covers
  std::vector<uint8_t> payload;
};
std::vector<uint8_t> wrap(const std::string& key, const Envelope& envelope);
/// The envelope, or nullopt with `reason` set when the bytes fail a check (reason names it).
std::optional<Envelope> unwrap(const std::string& key, const uint8_t* data, size_t size, std::string* reason);

/// Logs a refused value ("<key>: <reason>"); default: one line on stderr.
using MissLog = std::function<void(const std::string& key, const std::string& reason)>;
void log_to_stderr(const std::string& key, const std::string& reason);

/// Checks a data payload (e.g. parses an e8kv container's header): throws e8kv::Error to refuse it.
using PayloadCheck = std::function<void(const uint8_t* data, size_t size)>;

struct PrefixHit {
  size_t chunks = 0;           ///< the prefix's length in chunks (0: no hit)
  size_t n_tokens = 0;         ///< chunks · chunk_tokens
  std::string key;             ///< the key found (the prefix's)
  std::string data_key;        ///< the key holding the data (differs when `key` is a reference)
  uint64_t data_tokens = 0;    ///< tokens of the data's prefix (>= n_tokens)
  std::vector<uint8_t> payload;
  size_t round_trips = 0;      ///< store round trips used (1 exists + 1 get, + 1 per reference or refusal)
};

/// Finds the longest prefix of `keys` (prefix_keys of a prompt) stored with a value that passes
/// every check: one pipelined EXISTS for all keys, then GETs from the longest present downwards
/// until one passes (a reference is followed once; its target must cover the prefix). Refused
/// values are logged and skipped. Store failures throw e8kv::Error.
PrefixHit find_longest_prefix(Store& store, const std::vector<std::string>& keys, size_t chunk_tokens,
                              const PayloadCheck& check = {}, const MissLog& log = log_to_stderr);

struct PublishResult {
  size_t data_stored = 0;        ///< 1 when the data entry was new
  size_t references_stored = 0;  ///< shorter prefixes newly pointing at it
};
/// Publishes `payload` (the cache of the first keys.size() chunks) under keys.back(), and a
/// reference to it under every shorter prefix key that is absent (put-if-absent throughout: an
/// existing entry for the same prefix is equally good and is kept). `references` false: the data
/// entry alone.
PublishResult publish_prefix(Store& store, const std::vector<std::string>& keys, size_t chunk_tokens,
                             const std::vector<uint8_t>& payload, std::chrono::milliseconds ttl,
                             bool references = true);

}  // namespace e8kv::store
