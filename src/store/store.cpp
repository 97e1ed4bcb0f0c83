// e8kv::store: addresses, open_store, and the in-process store.
#include "e8kv/store/store.hpp"

#include <cstdlib>
#include <map>
#include <mutex>

#include "e8kv/error.hpp"
#include "store/store_internal.hpp"

namespace e8kv::store {

namespace {

const char* kAccepted =
    "accepted: redis://[[user][:password]@]host[:port][/db], unix://[[user][:password]@]/path[?db=N], memory:";

// Where the user-info ("user:password") of a redis:// or unix:// address lies: [begin, at), with
// the '@' at `at`; at == 0 when there is none. For redis:// the last '@' ends it (host, port and db
// hold none); for unix:// the first "@/" (the socket path is absolute).
struct UserInfoSpan {
  size_t begin = 0, at = 0;
};
UserInfoSpan user_info_span(const std::string& address) {
  if (address.rfind("redis://", 0) == 0) {
    const size_t at = address.rfind('@');
    if (at != std::string::npos && at >= 8) return {8, at};
  } else if (address.rfind("unix://", 0) == 0 && address.size() > 7 && address[7] != '/') {
    const size_t at = address.find("@/", 7);
    if (at != std::string::npos) return {7, at};
  }
  return {};
}

std::string percent_decode(const std::string& shown, const std::string& s, const char* what) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int hi = i + 2 < s.size() ? hex(s[i + 1]) : -1, lo = i + 2 < s.size() ? hex(s[i + 2]) : -1;
    if (hi < 0 || lo < 0)
      throw Error("store address '" + shown + "': the " + what + " has a '%' not followed by two hex digits");
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

int parse_port(const std::string& shown, const std::string& s) {
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos)
    throw Error("store address '" + shown + "': port '" + s + "' is not a number in 1-65535");
  const int p = std::stoi(s);
  if (p < 1 || p > 65535) throw Error("store address '" + shown + "': port " + s + " is outside 1-65535");
  return p;
}

int parse_db(const std::string& shown, const std::string& s) {
  if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos)
    throw Error("store address '" + shown + "': database '" + s + "' is not a number in 0-999999");
  return std::stoi(s);
}

// Takes the user-info off `rest` (the address after its scheme) into `a`.
void take_user_info(const std::string& address, const std::string& shown, std::string& rest, StoreAddress& a) {
  const UserInfoSpan span = user_info_span(address);
  if (span.at == 0) return;
  const std::string info = address.substr(span.begin, span.at - span.begin);
  rest = address.substr(span.at + 1);
  const size_t colon = info.find(':');
  if (colon == std::string::npos)
    throw Error("store address '" + shown + "': user '" + info + "' without a password; write user:password@ or :password@");
  a.user = percent_decode(shown, info.substr(0, colon), "user");
  a.password = percent_decode(shown, info.substr(colon + 1), "password");
  if (a.password.empty()) throw Error("store address '" + shown + "': the password after ':' is empty");
}

class MemoryStore final : public Store {
 public:
  bool put_if_absent(const std::string& key, const std::vector<uint8_t>& value,
                     std::chrono::milliseconds ttl) override {
    if (ttl.count() < 0) throw Error("store put_if_absent: ttl is negative; accepted 0 (no expiry) or more");
    std::lock_guard<std::mutex> lock(mutex_);
    if (live(key)) return false;
    Entry e{value, ttl.count() > 0 ? Clock::now() + ttl : Clock::time_point::max()};
    entries_[key] = std::move(e);
    return true;
  }
  std::optional<std::vector<uint8_t>> get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!live(key)) return std::nullopt;
    return entries_[key].value;
  }
  std::vector<bool> exists(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<bool> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(live(k));
    return out;
  }
  bool remove(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool had = live(key);
    entries_.erase(key);
    return had;
  }
  const std::string& address() const override { return address_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::vector<uint8_t> value;
    Clock::time_point expires;
  };
  bool live(const std::string& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    if (Clock::now() >= it->second.expires) {
      entries_.erase(it);
      return false;
    }
    return true;
  }
  std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::string address_ = "memory:";
};

}  // namespace

std::string redact_address(const std::string& address) {
  const UserInfoSpan span = user_info_span(address);
  if (span.at == 0) return address;
  const size_t colon = address.find(':', span.begin);
  if (colon == std::string::npos || colon > span.at) return address;
  return address.substr(0, colon + 1) + "***" + address.substr(span.at);
}

StoreAddress parse_address(const std::string& address) {
  StoreAddress a;
  const std::string shown = redact_address(address);
  const auto starts = [&](const char* p) { return address.rfind(p, 0) == 0; };
  if (address == "memory:" || address == "memory://") {
    a.kind = StoreAddress::Kind::kMemory;
    return a;
  }
  if (starts("unix:")) {
    a.kind = StoreAddress::Kind::kUnix;
    std::string rest = address.substr(starts("unix://") ? 7 : 5);
    take_user_info(address, shown, rest, a);
    const size_t q = rest.find('?');
    if (q != std::string::npos) {
      const std::string query = rest.substr(q + 1);
      rest.resize(q);
      if (query.rfind("db=", 0) != 0 || query.find('&') != std::string::npos)
        throw Error("store address '" + shown + "': the only query accepted is ?db=N, not '?" + query + "'");
      a.db = parse_db(shown, query.substr(3));
    }
    a.path = rest;
    if (a.path.empty()) throw Error("store address '" + shown + "': no socket path; " + kAccepted);
    return a;
  }
  if (starts("redis://")) {
    std::string rest = address.substr(8);
    take_user_info(address, shown, rest, a);
    const size_t slash = rest.find('/');
    if (slash != std::string::npos) {
      const std::string db = rest.substr(slash + 1);
      rest.resize(slash);
      if (!db.empty()) a.db = parse_db(shown, db);
    }
    if (!rest.empty() && rest[0] == '[') {  // [v6]:port
      const size_t close = rest.find(']');
      if (close == std::string::npos) throw Error("store address '" + shown + "': unclosed '['");
      a.host = rest.substr(1, close - 1);
      const std::string tail = rest.substr(close + 1);
      if (!tail.empty()) {
        if (tail[0] != ':') throw Error("store address '" + shown + "': expected ':' after ']'");
        a.port = parse_port(shown, tail.substr(1));
      }
    } else {
      const size_t colon = rest.rfind(':');
      a.host = rest.substr(0, colon);
      if (colon != std::string::npos) a.port = parse_port(shown, rest.substr(colon + 1));
    }
    if (a.host.empty()) throw Error("store address '" + shown + "': no host; " + kAccepted);
    return a;
  }
  throw Error("store address '" + shown + "' is not understood; " + kAccepted);
}

StoreOptions& credentials_from_environment(StoreOptions& options) {
  const char* user = std::getenv("E8KV_STORE_USER");
  const char* password = std::getenv("E8KV_STORE_PASSWORD");
  if (user != nullptr && *user != '\0') options.user = user;
  if (password != nullptr && *password != '\0') options.password = password;
  return options;
}

std::unique_ptr<Store> make_memory_store() { return std::make_unique<MemoryStore>(); }

std::unique_ptr<Store> open_store(const std::string& address, const StoreOptions& options) {
  const StoreAddress a = parse_address(address);
  if (a.kind == StoreAddress::Kind::kMemory) return make_memory_store();
  return open_redis_store(address, a, options);
}

}  // namespace e8kv::store
