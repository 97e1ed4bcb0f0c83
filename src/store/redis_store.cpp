// The Redis backend of e8kv::store (hiredis, blocking context with connect and command timeouts).
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <time.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "e8kv/error.hpp"
#include "e8kv/store/store.hpp"
#include "store/store_internal.hpp"

namespace e8kv::store {

namespace {

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextFree>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
  tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
  return tv;
}

const char* reply_type_name(int type) {
  switch (type) {
    case REDIS_REPLY_STRING: return "string";
    case REDIS_REPLY_ARRAY: return "array";
    case REDIS_REPLY_INTEGER: return "integer";
    case REDIS_REPLY_NIL: return "nil";
    case REDIS_REPLY_STATUS: return "status";
    case REDIS_REPLY_ERROR: return "error";
    default: return "unknown";
  }
}

// A write to a connection the server closed raises SIGPIPE, whose default action ends the process.
// hiredis writes with write(2) (no MSG_NOSIGNAL), so, like libpq, block SIGPIPE in this thread for
// the call, consume one it raised, and restore the mask: the caller gets an e8kv::Error instead,
// and the process's signal handling is left alone.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

class RedisStore final : public Store {
 public:
  RedisStore(std::string address, StoreAddress where, StoreOptions options)
      : address_(redact_address(address)), where_(std::move(where)), options_(std::move(options)) {
    if (where_.password.empty()) {  // the address carries no credentials: the options' (if any)
      where_.user = options_.user;
      where_.password = options_.password;
    }
    if (!where_.user.empty() && where_.password.empty())
      throw Error("store " + address_ + ": a user without a password; give StoreOptions::password (or E8KV_STORE_PASSWORD)");
    connect();
  }

  bool put_if_absent(const std::string& key, const std::vector<uint8_t>& value, std::chrono::milliseconds ttl) override {
    if (ttl.count() < 0) throw Error("store put_if_absent: ttl is negative; accepted 0 (no expiry) or more");
    const std::string ms = std::to_string(ttl.count());
    const char* argv[6] = {"SET", key.data(), reinterpret_cast<const char*>(value.data()), "NX", "PX", ms.c_str()};
    size_t lens[6] = {3, key.size(), value.size(), 2, 2, ms.size()};
    ReplyPtr r = command(ttl.count() > 0 ? 6 : 4, argv, lens, "SET NX");
    if (r->type == REDIS_REPLY_NIL) return false;
    if (r->type == REDIS_REPLY_STATUS && std::strcmp(r->str, "OK") == 0) return true;
    throw unexpected("SET NX", r.get());
  }

  std::optional<std::vector<uint8_t>> get(const std::string& key) override {
    const char* argv[2] = {"GET", key.data()};
    size_t lens[2] = {3, key.size()};
    ReplyPtr r = command(2, argv, lens, "GET");
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    if (r->type != REDIS_REPLY_STRING) throw unexpected("GET", r.get());
    return std::vector<uint8_t>(r->str, r->str + r->len);
  }

  std::vector<bool> exists(const std::vector<std::string>& keys) override {
    std::vector<bool> out(keys.size(), false);
    if (keys.empty()) return out;
    ensure_connected();
    SigpipeGuard no_sigpipe;
    // Pipelined: every EXISTS is appended to the output buffer, which the first redisGetReply
    // writes in one go; the replies then arrive back to back (one round trip).
    for (const std::string& k : keys) {
      const char* argv[2] = {"EXISTS", k.data()};
      size_t lens[2] = {6, k.size()};
      if (redisAppendCommandArgv(ctx_.get(), 2, argv, lens) != REDIS_OK) throw failure("EXISTS");
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      void* raw = nullptr;
      if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) throw failure("EXISTS");
      ReplyPtr r(static_cast<redisReply*>(raw));
      if (r->type != REDIS_REPLY_INTEGER) {
        Error e = unexpected("EXISTS", r.get());
        drop();  // replies of the rest are still queued: the connection is out of step
        throw e;
      }
      out[i] = r->integer != 0;
    }
    return out;
  }

  bool remove(const std::string& key) override {
    const char* argv[2] = {"DEL", key.data()};
    size_t lens[2] = {3, key.size()};
    ReplyPtr r = command(2, argv, lens, "DEL");
    if (r->type != REDIS_REPLY_INTEGER) throw unexpected("DEL", r.get());
    return r->integer != 0;
  }

  const std::string& address() const override { return address_; }

 private:
  void connect() {
    const timeval tv = to_timeval(options_.connect_timeout);
    redisContext* c = where_.kind == StoreAddress::Kind::kUnix
                          ? redisConnectUnixWithTimeout(where_.path.c_str(), tv)
                          : redisConnectWithTimeout(where_.host.c_str(), where_.port, tv);
    if (c == nullptr) throw Error("store " + address_ + ": cannot allocate a Redis connection");
    ContextPtr ctx(c);
    if (ctx->err) {
      throw Error("store " + address_ + ": cannot connect (" + std::string(ctx->errstr) +
                  "); is redis-server running there? (connect timeout " +
                  std::to_string(options_.connect_timeout.count()) + " ms)");
    }
    if (redisSetTimeout(ctx.get(), to_timeval(options_.command_timeout)) != REDIS_OK)
      throw Error("store " + address_ + ": cannot set the command timeout (" + std::string(ctx->errstr) + ")");
    ctx_ = std::move(ctx);
    // On every (re)connect: a connection starts unauthenticated and in database 0.
    if (!where_.password.empty()) {
      if (where_.user.empty()) {
        const char* argv[2] = {"AUTH", where_.password.c_str()};
        size_t lens[2] = {4, where_.password.size()};
        handshake(2, argv, lens, "AUTH");
      } else {
        const char* argv[3] = {"AUTH", where_.user.c_str(), where_.password.c_str()};
        size_t lens[3] = {4, where_.user.size(), where_.password.size()};
        handshake(3, argv, lens, "AUTH");
      }
    }
    if (where_.db != 0) {
      const std::string db = std::to_string(where_.db);
      const char* argv[2] = {"SELECT", db.c_str()};
      size_t lens[2] = {6, db.size()};
      handshake(2, argv, lens, ("SELECT " + db).c_str());
    }
  }
  // A connection-setup command whose answer must be a status (+OK): anything else drops the
  // connection and throws with the server's reason.
  void handshake(int argc, const char** argv, const size_t* lens, const char* what) {
    ReplyPtr r = command(argc, argv, lens, what);
    if (r->type == REDIS_REPLY_STATUS) return;
    Error e = unexpected(what, r.get());
    drop();
    throw e;
  }
  void ensure_connected() {
    if (!ctx_) connect();
  }
  void drop() { ctx_.reset(); }

  // The context failed (I/O error, timeout, EOF, protocol): it cannot be used again; the next call
  // reconnects.
  Error failure(const char* what) {
    std::string why = ctx_ && ctx_->errstr[0] ? ctx_->errstr : "connection failed";
    const bool timed_out = ctx_ && ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    drop();
    if (timed_out) why = "no reply within " + std::to_string(options_.command_timeout.count()) + " ms (" + why + ")";
    return Error("store " + address_ + ": " + what + " failed: " + why);
  }
  Error unexpected(const char* what, const redisReply* r) {
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string reason(r->str, r->len);
      const bool needs_auth = reason.rfind("NOAUTH", 0) == 0;
      return Error("store " + address_ + ": " + what + " refused by the server: " + reason +
                   (needs_auth ? " (the server wants a password: redis://[user]:PASSWORD@host, or "
                                 "StoreOptions::password; the e8kv tools read E8KV_STORE_PASSWORD)"
                               : ""));
    }
    return Error("store " + address_ + ": " + what + " gave an unexpected " + reply_type_name(r->type) + " reply");
  }
  ReplyPtr command(int argc, const char** argv, const size_t* lens, const char* what) {
    ensure_connected();
    SigpipeGuard no_sigpipe;
    void* raw = redisCommandArgv(ctx_.get(), argc, argv, lens);
    if (raw == nullptr) throw failure(what);
    return ReplyPtr(static_cast<redisReply*>(raw));
  }

  std::string address_;
  StoreAddress where_;
  StoreOptions options_;
  ContextPtr ctx_;
};

}  // namespace

std::unique_ptr<Store> open_redis_store(const std::string& address, const StoreAddress& where,
                                        const StoreOptions& options) {
  if (options.connect_timeout.count() <= 0 || options.command_timeout.count() <= 0)
    throw Error("store " + address + ": connect_timeout and command_timeout must be > 0 ms");
  return std::make_unique<RedisStore>(address, where, options);
}

}  // namespace e8kv::store
