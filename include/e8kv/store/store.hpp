// e8kv::store: a key-value store that several machines reach, for compressed KV caches moving
// between servers (prefill -> decode hand-off, a fleet sharing repeated prompts, idle
// conversations parked off the host). Built as e8kv::store when hiredis is found (libhiredis-dev).
//
//   auto s = e8kv::store::open_store("unix:///run/redis/redis.sock");   // or redis://host:6379
//   auto t = e8kv::store::open_store("redis://fleet:s3cret@cache:6379/2"); // ACL user, password, db 2
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
  /// Credentials for Redis AUTH, used when the address carries none (so a password can stay out of
  /// command lines and process lists; the e8kv tools fill them from E8KV_STORE_USER and
  /// E8KV_STORE_PASSWORD). An empty user with a password authenticates as Redis's default user.
  std::string user;
  std::string password;
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
  /// The address it was opened with, password redacted (for messages).
  virtual const std::string& address() const = 0;
};

/// Fills options.user and options.password from the environment variables E8KV_STORE_USER and
/// E8KV_STORE_PASSWORD where they are set and non-empty (the e8kv tools call this, so a fleet's
/// password stays out of their command lines). Returns `options`.
StoreOptions& credentials_from_environment(StoreOptions& options);

/// A parsed store address.
struct StoreAddress {
  enum class Kind { kTcp, kUnix, kMemory } kind = Kind::kTcp;
  std::string host;      ///< kTcp
  int port = 6379;       ///< kTcp
  std::string path;      ///< kUnix
  std::string user;      ///< AUTH user (empty: Redis's default user)
  std::string password;  ///< AUTH password (empty: no AUTH)
  int db = 0;            ///< SELECT'ed database number (0: Redis's default)
};
/// Accepts
///   redis://[[user][:password]@]host[:port][/db]   port 1-65535 (default 6379), "[v6addr]" for IPv6
///   unix://[[user][:password]@]/absolute/path[?db=N]   (also "unix:path")
///   memory:                                        an in-process store, for tests and one process
/// User and password are percent-decoded (write '@' as %40, ':' as %3A). db is a number 0-999999
/// (the server refuses one beyond its `databases`). Throws e8kv::Error naming the accepted forms;
/// its message never contains the password.
StoreAddress parse_address(const std::string& address);

/// The address with any password replaced by "***", for messages and logs.
std::string redact_address(const std::string& address);

/// Opens the store at `address` and connects (throws e8kv::Error when it cannot, within
/// options.connect_timeout), then sends AUTH when there is a password (the address's, else
/// options') and SELECT when db > 0; a refused AUTH or SELECT throws with the server's reason. Every
/// reconnect repeats them. "redis://" and "unix://" need the Redis backend (always built with
/// e8kv::store); "memory:" gives a fresh empty in-process store.
std::unique_ptr<Store> open_store(const std::string& address, const StoreOptions& options = {});

/// An in-process store with the same semantics (expiry included); thread-safe.
std::unique_ptr<Store> make_memory_store();

}  // namespace e8kv::store
