// e8kv::store: a key-value store that several machines reach, for compressed KV caches moving
// between servers (prefill -> decode hand-off, a fleet sharing repeated prompts, idle
// conversations parked off the host). Built as e8kv::store when hiredis is found (libhiredis-dev).
//
//   auto s = e8kv::store::open_store("unix:///run/redis/redis.sock");   // or redis://host:6379
//   s->put_if_absent("k", bytes, std::chrono::hours(24));                // SET k v NX PX ms
//   std::optional<std::vector<uint8_t>> v = s->get("k");                 // nullopt: absent
//   std::vector<bool> e = s->exists({"a", "b", "c"});                    // one pipelined round trip
//   s->remove("k");
//
// Values are opaque bytes here; include/e8kv/store/prefix.hpp keys them by model and token prefix
// and wraps them in a checked envelope. Every failure of the store itself (refused or timed-out
// connection, a reply that is an error or of the wrong type, a dropped connection) throws
// e8kv::Error naming the address and what happened; the next call reconnects. A Store is not
// thread-safe: one per thread (a connection each).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace e8kv::store {

struct StoreOptions {
  /// Connecting (TCP handshake or Unix socket connect). A host that does not answer fails after this.
  std::chrono::milliseconds connect_timeout{1000};
  /// Each command's send and reply. A server that accepts but never replies fails after this.
  std::chrono::milliseconds command_timeout{2000};
};

class Store {
 public:
  virtual ~Store() = default;
  /// Stores `value` under `key` unless the key exists; `ttl` > 0 expires it after that long (0: never).
  /// Returns true when stored, false when the key was already there (its value untouched).
  virtual bool put_if_absent(const std::string& key, const std::vector<uint8_t>& value,
                             std::chrono::milliseconds ttl) = 0;
  /// The value, or nullopt when the key is absent (or expired).
  virtual std::optional<std::vector<uint8_t>> get(const std::string& key) = 0;
  /// For each key whether it exists, in one round trip.
  virtual std::vector<bool> exists(const std::vector<std::string>& keys) = 0;
  /// Removes the key; true when it existed.
  virtual bool remove(const std::string& key) = 0;
  /// The address it was opened with (for messages).
  virtual const std::string& address() const = 0;
};

/// A parsed store address.
struct StoreAddress {
  enum class Kind { kTcp, kUnix, kMemory } kind = Kind::kTcp;
  std::string host;  ///< kTcp
  int port = 6379;   ///< kTcp
  std::string path;  ///< kUnix
};
/// Accepts "redis://host[:port]" (port 1-65535, default 6379; "[v6addr]:port" for IPv6),
/// "unix:///absolute/path" (also "unix:path") and "memory:" (an in-process store, for tests and
/// single-process tools). Throws e8kv::Error naming the accepted forms.
StoreAddress parse_address(const std::string& address);

/// Opens the store at `address` and connects (throws e8kv::Error when it cannot, within
/// options.connect_timeout). "redis://" and "unix://" need the Redis backend (always built with
/// e8kv::store); "memory:" gives a fresh empty in-process store.
std::unique_ptr<Store> open_store(const std::string& address, const StoreOptions& options = {});

/// An in-process store with the same semantics (expiry included); thread-safe.
std::unique_ptr<Store> make_memory_store();

}  // namespace e8kv::store
