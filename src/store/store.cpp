// e8kv::store: addresses, open_store, and the in-process store.
#include "e8kv/store/store.hpp"

#include <map>
#include <mutex>

#include "e8kv/error.hpp"
#include "store/store_internal.hpp"

namespace e8kv::store {

namespace {

const char* kAccepted = "accepted: redis://host[:port], unix:///path/to/redis.sock, memory:";

int parse_port(const std::string& address, const std::string& s) {
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos)
    throw Error("store address '" + address + "': port '" + s + "' is not a number in 1-65535");
  const int p = std::stoi(s);
  if (p < 1 || p > 65535) throw Error("store address '" + address + "': port " + s + " is outside 1-65535");
  return p;
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

StoreAddress parse_address(const std::string& address) {
  StoreAddress a;
  const auto starts = [&](const char* p) { return address.rfind(p, 0) == 0; };
  if (address == "memory:" || address == "memory://") {
    a.kind = StoreAddress::Kind::kMemory;
    return a;
  }
  if (starts("unix:")) {
    a.kind = StoreAddress::Kind::kUnix;
    a.path = address.substr(starts("unix://") ? 7 : 5);
    if (a.path.empty()) throw Error("store address '" + address + "': no socket path; " + kAccepted);
    return a;
  }
  if (starts("redis://")) {
    std::string rest = address.substr(8);
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    if (rest.find('@') != std::string::npos || rest.find('/') != std::string::npos)
      throw Error("store address '" + address + "': user, password and database are not supported; " + kAccepted);
    if (!rest.empty() && rest[0] == '[') {  // [v6]:port
      const size_t close = rest.find(']');
      if (close == std::string::npos) throw Error("store address '" + address + "': unclosed '['");
      a.host = rest.substr(1, close - 1);
      const std::string tail = rest.substr(close + 1);
      if (!tail.empty()) {
        if (tail[0] != ':') throw Error("store address '" + address + "': expected ':' after ']'");
        a.port = parse_port(address, tail.substr(1));
      }
    } else {
      const size_t colon = rest.rfind(':');
      a.host = rest.substr(0, colon);
      if (colon != std::string::npos) a.port = parse_port(address, rest.substr(colon + 1));
    }
    if (a.host.empty()) throw Error("store address '" + address + "': no host; " + kAccepted);
    return a;
  }
  throw Error("store address '" + address + "' is not understood; " + kAccepted);
}

std::unique_ptr<Store> make_memory_store() { return std::make_unique<MemoryStore>(); }

std::unique_ptr<Store> open_store(const std::string& address, const StoreOptions& options) {
  const StoreAddress a = parse_address(address);
  if (a.kind == StoreAddress::Kind::kMemory) return make_memory_store();
  return open_redis_store(address, a, options);
}

}  // namespace e8kv::store
