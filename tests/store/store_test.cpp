// e8kv::store: addresses, SHA-256, prefix keys, the envelope, and the store semantics against a
// real redis-server (tests/store/with_redis.sh: E8KV_TEST_REDIS_UNIX / _TCP) and the in-process
// store. Without with_redis.sh's variables the Redis cases are skipped (never passed).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/store/prefix.hpp"
#include "e8kv/store/store.hpp"
#include "testing/kv_fixture.hpp"

namespace {

using namespace e8kv::store;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// ---- pure parts -------------------------------------------------------------------------------

TEST(StoreAddress, Forms) {
  auto a = parse_address("redis://127.0.0.1:6380");
  EXPECT_EQ(a.kind, StoreAddress::Kind::kTcp);
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 6380);
  a = parse_address("redis://cache.local");
  EXPECT_EQ(a.port, 6379);
  a = parse_address("redis://[::1]:7000");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 7000);
  a = parse_address("unix:///tmp/r.sock");
  EXPECT_EQ(a.kind, StoreAddress::Kind::kUnix);
  EXPECT_EQ(a.path, "/tmp/r.sock");
  EXPECT_EQ(parse_address("memory:").kind, StoreAddress::Kind::kMemory);
  for (const char* bad : {"http://x", "redis://", "redis://h:0", "redis://h:70000", "redis://h:12ab",
                          "redis://user@h:1", "unix://", "redis://h:1/x"}) {
    EXPECT_THROW(parse_address(bad), e8kv::Error) << bad;
  }
  try {
    parse_address("tcp://x");
    FAIL();
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("redis://[[user][:password]@]host[:port][/db]"), std::string::npos) << e.what();
  }
}

TEST(StoreHash, Sha256KnownVectors) {
  const auto hex = [](const std::string& s) {
    const Digest d = sha256(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    return to_hex(d.data(), d.size());
  };
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Keys and envelopes are shared between e8kv versions and machines: their bytes are pinned here
// (written before the store moved onto the library's byte writer, and unchanged by it).
TEST(StoreKeys, GoldenBytes) {
  const std::vector<TensorRecord> tensors = {{"blk.0.attn_q.weight", {576, 576}, 2}, {"output_norm.weight", {576}, 0}};
  const Digest fp = model_fingerprint(tensors, "preset=quant-k3v2");
  EXPECT_EQ(to_hex(fp.data(), fp.size()), "898ebd2055ad70c6d93a9a8bcfc38aaef62a484c364b9f4724cd8780be251c8b");
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(i * 7919 - 3);
  const auto keys = prefix_keys(fp, tokens.data(), tokens.size(), 8);
  ASSERT_EQ(keys.size(), 5u);
  EXPECT_EQ(keys[0], "e8kv:898ebd2055ad70c6d93a9a8bcfc38aae:8:29fe0ca93387f195b974fe99403cb321");
  EXPECT_EQ(keys[4], "e8kv:898ebd2055ad70c6d93a9a8bcfc38aae:8:9ceeff560bcfcb48eb0caa98b976a451");
  Envelope e;
  e.kind = ValueKind(1);
  e.n_tokens = 40;
  e.payload = {1, 2, 3, 250};
  const std::vector<uint8_t> value = wrap(keys[1], e);
  EXPECT_EQ(to_hex(value.data(), value.size()),
            "45384b5653544f31010000000000000028000000000000004800000065386b763a3839386562643230353561643730633664"
            "3933613961386263666333386161653a383a64326263333066303538336535656433313963396531306635343433643636"
            "660400000000000000010203fae712ae2d");
}

TEST(StoreKeys, ChainedPrefixKeys) {
  const Digest fp = model_fingerprint({{"tok_embd.weight", {64, 100}, 1}}, "preset=quant-k3v2");
  std::vector<int32_t> t(35);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i * 7 + 1);
  const auto k = prefix_keys(fp, t.data(), t.size(), 8);
  ASSERT_EQ(k.size(), 4u);  // the partial last chunk has no key
  EXPECT_EQ(k, prefix_keys(fp, t.data(), 32, 8));
  EXPECT_EQ(k[0].rfind("e8kv:" + to_hex(fp.data(), 16) + ":8:", 0), 0u) << k[0];
  auto t2 = t;
  t2[17] += 1;  // chunk 2 differs: keys 0, 1 stay, 2 and 3 change
  const auto k2 = prefix_keys(fp, t2.data(), t2.size(), 8);
  EXPECT_EQ(k2[0], k[0]);
  EXPECT_EQ(k2[1], k[1]);
  EXPECT_NE(k2[2], k[2]);
  EXPECT_NE(k2[3], k[3]);
  // Another model, layout or chunk size: no key in common.
  const Digest fp2 = model_fingerprint({{"tok_embd.weight", {64, 100}, 0}}, "preset=quant-k3v2");
  const Digest fp3 = model_fingerprint({{"tok_embd.weight", {64, 100}, 1}}, "preset=quant-k4v4");
  EXPECT_NE(prefix_keys(fp2, t.data(), t.size(), 8)[0], k[0]);
  EXPECT_NE(prefix_keys(fp3, t.data(), t.size(), 8)[0], k[0]);
  EXPECT_NE(prefix_keys(fp, t.data(), t.size(), 4)[1], k[0]);
  EXPECT_TRUE(prefix_keys(fp, t.data(), 7, 8).empty());
  EXPECT_THROW(prefix_keys(fp, t.data(), t.size(), 0), e8kv::Error);
}

TEST(StoreEnvelope, RoundTripAndEveryCorruptionRefused) {
  Envelope e{ValueKind::kData, 512, bytes_of("payload\0bytes")};
  const auto w = wrap("key:1", e);
  std::string why;
  auto back = unwrap("key:1", w.data(), w.size(), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->kind, ValueKind::kData);
  EXPECT_EQ(back->n_tokens, 512u);
  EXPECT_EQ(back->payload, e.payload);
  EXPECT_FALSE(unwrap("key:2", w.data(), w.size(), &why));
  EXPECT_NE(why.find("foreign"), std::string::npos) << why;
  for (size_t i = 0; i < w.size(); ++i) {
    auto bad = w;
    bad[i] ^= 0x10;
    EXPECT_FALSE(unwrap("key:1", bad.data(), bad.size(), &why)) << "byte " << i;
  }
  for (size_t n = 0; n < w.size(); ++n) EXPECT_FALSE(unwrap("key:1", w.data(), n, &why)) << "size " << n;
  EXPECT_FALSE(unwrap("key:1", nullptr, 0, &why));
}

// A real e8kv container (the kind of payload the fleet stores) and its check.
std::vector<uint8_t> make_container(uint64_t seed) {
  e8kv::synth::SyntheticSpec spec;
  spec.tokens = 40;
  spec.seed = seed;
  e8kv::testkit::Fixture f(spec);
  e8kv::KVCompressor c(f.shape, e8kv::Config::parse("preset=quant-k3v2"));
  return e8kv::container::serialize(c.compress(f.seq));
}
void check_container(const uint8_t* p, size_t n) { (void)e8kv::container::deserialize(p, n); }

// ---- against stores ---------------------------------------------------------------------------

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string which = GetParam();
    address_ = which == "memory" ? "memory:" : env(which == "unix" ? "E8KV_TEST_REDIS_UNIX" : "E8KV_TEST_REDIS_TCP");
    if (address_.empty()) GTEST_SKIP() << "no redis-server: run through tests/store/with_redis.sh (ctest does)";
    store_ = open_store(address_);
    // Unique key space per test (one server serves every case of the binary).
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    ns_ = std::string("t:") + info->name() + ":";
  }
  std::string address_, ns_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, RoundTripsBinaryValues) {
  std::vector<uint8_t> big(3u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  const std::vector<std::vector<uint8_t>> values = {{}, {0}, bytes_of(std::string("a\0b\r\n", 5)), big};
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string k = ns_ + std::to_string(i);
    EXPECT_TRUE(store_->put_if_absent(k, values[i], milliseconds(0)));
    auto v = store_->get(k);
    ASSERT_TRUE(v) << k;
    EXPECT_EQ(*v, values[i]) << k;
  }
  EXPECT_FALSE(store_->get(ns_ + "absent"));
}

TEST_P(StoreTest, PutIfAbsentKeepsTheFirstValue) {
  const std::string k = ns_ + "k";
  EXPECT_TRUE(store_->put_if_absent(k, bytes_of("first"), milliseconds(0)));
  EXPECT_FALSE(store_->put_if_absent(k, bytes_of("second"), milliseconds(60000)));
  EXPECT_EQ(*store_->get(k), bytes_of("first"));
  EXPECT_TRUE(store_->remove(k));
  EXPECT_FALSE(store_->remove(k));
  EXPECT_FALSE(store_->get(k));
  EXPECT_TRUE(store_->put_if_absent(k, bytes_of("third"), milliseconds(0)));
  EXPECT_EQ(*store_->get(k), bytes_of("third"));
  EXPECT_THROW(store_->put_if_absent(k, {}, milliseconds(-1)), e8kv::Error);
}

TEST_P(StoreTest, ExistsInBatch) {
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) keys.push_back(ns_ + std::to_string(i));
  for (int i = 0; i < 50; i += 3) store_->put_if_absent(keys[i], bytes_of("x"), milliseconds(0));
  const auto e = store_->exists(keys);
  ASSERT_EQ(e.size(), keys.size());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(e[i], i % 3 == 0) << i;
  EXPECT_TRUE(store_->exists({}).empty());
}

TEST_P(StoreTest, Expiry) {
  const std::string k = ns_ + "short", keep = ns_ + "long";
  ASSERT_TRUE(store_->put_if_absent(k, bytes_of("v"), milliseconds(150)));
  ASSERT_TRUE(store_->put_if_absent(keep, bytes_of("v"), milliseconds(60000)));
  EXPECT_TRUE(store_->get(k));
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_FALSE(store_->get(k));
  EXPECT_EQ(store_->exists({k, keep}), (std::vector<bool>{false, true}));
  EXPECT_TRUE(store_->put_if_absent(k, bytes_of("again"), milliseconds(0)));  // expired = absent
}

// Counts the round trips find_longest_prefix makes.
class CountingStore final : public Store {
 public:
  explicit CountingStore(Store& s) : s_(s) {}
  bool put_if_absent(const std::string& k, const std::vector<uint8_t>& v, milliseconds t) override {
    return s_.put_if_absent(k, v, t);
  }
  std::optional<std::vector<uint8_t>> get(const std::string& k) override { ++gets; return s_.get(k); }
  std::vector<bool> exists(const std::vector<std::string>& k) override { ++exists_calls; return s_.exists(k); }
  bool remove(const std::string& k) override { return s_.remove(k); }
  const std::string& address() const override { return s_.address(); }
  int gets = 0, exists_calls = 0;
 private:
  Store& s_;
};

TEST_P(StoreTest, LongestPrefixThroughReferences) {
  const Digest fp = model_fingerprint({{"w", {8}, 0}}, ns_);
  const size_t C = 16;
  std::vector<int32_t> pushed(5 * C + 3);
  for (size_t i = 0; i < pushed.size(); ++i) pushed[i] = static_cast<int32_t>(1000 + i);
  const auto payload = make_container(7);
  const auto keys = prefix_keys(fp, pushed.data(), pushed.size(), C);
  ASSERT_EQ(keys.size(), 5u);
  auto pub = publish_prefix(*store_, keys, C, payload, milliseconds(60000));
  EXPECT_EQ(pub.data_stored, 1u);
  EXPECT_EQ(pub.references_stored, 4u);
  pub = publish_prefix(*store_, keys, C, payload, milliseconds(60000));  // again: nothing new
  EXPECT_EQ(pub.data_stored + pub.references_stored, 0u);

  // A prompt sharing the first 3 chunks (then different), 7 chunks long.
  std::vector<int32_t> prompt(pushed.begin(), pushed.begin() + 3 * C);
  for (size_t i = 0; i < 4 * C + 5; ++i) prompt.push_back(static_cast<int32_t>(5 + i));
  CountingStore counting(*store_);
  std::vector<std::string> refused;
  const MissLog log = [&](const std::string& k, const std::string& why) { refused.push_back(k + ": " + why); };
  auto hit = find_longest_prefix(counting, prefix_keys(fp, prompt.data(), prompt.size(), C), C, check_container, log);
  EXPECT_EQ(hit.chunks, 3u);
  EXPECT_EQ(hit.n_tokens, 3 * C);
  EXPECT_EQ(hit.data_key, keys.back());
  EXPECT_EQ(hit.data_tokens, 5 * C);
  EXPECT_EQ(hit.payload, payload);
  EXPECT_EQ(counting.exists_calls, 1);  // one batched lookup for all 7 prefixes
  EXPECT_EQ(counting.gets, 2);          // the reference, then its data
  EXPECT_TRUE(refused.empty());

  // The whole pushed sequence and a longer one: the data entry itself.
  hit = find_longest_prefix(*store_, keys, C, check_container, log);
  EXPECT_EQ(hit.chunks, 5u);
  EXPECT_EQ(hit.key, hit.data_key);
  // Nothing in common, or shorter than a chunk: no hit, no error.
  std::vector<int32_t> other(4 * C, 3);
  EXPECT_EQ(find_longest_prefix(*store_, prefix_keys(fp, other.data(), other.size(), C), C).chunks, 0u);
  EXPECT_EQ(find_longest_prefix(*store_, prefix_keys(fp, pushed.data(), C - 1, C), C).chunks, 0u);
  // Another model's fingerprint: no hit.
  const Digest fp2 = model_fingerprint({{"w", {8}, 1}}, ns_);
  EXPECT_EQ(find_longest_prefix(*store_, prefix_keys(fp2, pushed.data(), pushed.size(), C), C).chunks, 0u);
}

TEST_P(StoreTest, CorruptAndForeignValuesAreLoggedMisses) {
  const Digest fp = model_fingerprint({{"w", {8}, 0}}, ns_);
  const size_t C = 4;
  std::vector<int32_t> a(3 * C), b(3 * C);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<int32_t>(i);
    b[i] = static_cast<int32_t>(100 + i);
  }
  const auto ka = prefix_keys(fp, a.data(), a.size(), C), kb = prefix_keys(fp, b.data(), b.size(), C);
  // a: 1 chunk stored (good), 3 chunks stored with a flipped payload byte (corrupt).
  const auto good = make_container(1);
  publish_prefix(*store_, {ka[0]}, C, good, milliseconds(0));
  auto bad = wrap(ka[2], Envelope{ValueKind::kData, 3 * C, good});
  bad[bad.size() / 2] ^= 1;
  store_->put_if_absent(ka[2], bad, milliseconds(0));
  std::vector<std::string> refused;
  const MissLog log = [&](const std::string& k, const std::string& why) { refused.push_back(k + ": " + why); };
  auto hit = find_longest_prefix(*store_, ka, C, check_container, log);
  EXPECT_EQ(hit.chunks, 1u);  // the corrupt 3-chunk value skipped, the 1-chunk one used
  EXPECT_EQ(hit.payload, good);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("checksum"), std::string::npos) << refused[0];

  // b: a valid value copied from a's key (foreign), and a well-formed envelope whose payload is not
  // an e8kv container (the payload check refuses it).
  store_->put_if_absent(kb[0], *store_->get(ka[0]), milliseconds(0));
  store_->put_if_absent(kb[1], wrap(kb[1], Envelope{ValueKind::kData, 2 * C, bytes_of("not a container")}),
                        milliseconds(0));
  std::vector<uint8_t> flipped = good;
  flipped[flipped.size() - 10] ^= 0x40;  // inside the container: its own CRC catches it
  store_->put_if_absent(kb[2], wrap(kb[2], Envelope{ValueKind::kData, 3 * C, flipped}), milliseconds(0));
  refused.clear();
  hit = find_longest_prefix(*store_, kb, C, check_container, log);
  EXPECT_EQ(hit.chunks, 0u);
  ASSERT_EQ(refused.size(), 3u);
  EXPECT_NE(refused[0].find("payload refused"), std::string::npos) << refused[0];
  EXPECT_NE(refused[1].find("payload refused"), std::string::npos) << refused[1];
  EXPECT_NE(refused[2].find("foreign"), std::string::npos) << refused[2];
  // A value that is not an envelope at all, and a reference whose target is gone.
  const std::string kc = ns_ + "raw";
  store_->put_if_absent(kc, bytes_of("hello"), milliseconds(0));
  refused.clear();
  EXPECT_EQ(find_longest_prefix(*store_, {kc}, C, {}, log).chunks, 0u);
  ASSERT_EQ(refused.size(), 1u);
  std::vector<int32_t> d(2 * C, 9);
  const auto kd = prefix_keys(fp, d.data(), d.size(), C);
  publish_prefix(*store_, kd, C, good, milliseconds(0));
  store_->remove(kd[1]);
  refused.clear();
  EXPECT_EQ(find_longest_prefix(*store_, kd, C, {}, log).chunks, 0u);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("gone"), std::string::npos) << refused[0];
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("unix", "tcp", "memory"));

// ---- store absent or silent: a clear error, quickly ----------------------------------------------

template <class F>
double seconds_to_throw(F f, std::string* message) {
  const auto t0 = Clock::now();
  try {
    f();
  } catch (const e8kv::Error& e) {
    *message = e.what();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  ADD_FAILURE() << "no e8kv::Error";
  return 1e9;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);  // nobody listens there now
  return ntohs(a.sin_port);
}

TEST(StoreAbsent, ClearErrorWithoutHanging) {
  std::string msg;
  double s = seconds_to_throw([] { open_store("unix:///nonexistent/e8kv-test/redis.sock"); }, &msg);
  EXPECT_LT(s, 1.0);
  EXPECT_NE(msg.find("cannot connect"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unix:///nonexistent/e8kv-test/redis.sock"), std::string::npos) << msg;
  const std::string tcp = "redis://127.0.0.1:" + std::to_string(free_port());
  s = seconds_to_throw([&] { open_store(tcp); }, &msg);
  EXPECT_LT(s, 1.0);
  EXPECT_NE(msg.find("cannot connect"), std::string::npos) << msg;
}

TEST(StoreAbsent, SilentServerTimesOut) {
  // Listens but never accepts nor answers: the connect succeeds (kernel backlog), commands time out.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  StoreOptions o;
  o.command_timeout = milliseconds(300);
  auto s = open_store("redis://127.0.0.1:" + std::to_string(ntohs(a.sin_port)), o);
  std::string msg;
  const double t = seconds_to_throw([&] { s->get("k"); }, &msg);
  EXPECT_GT(t, 0.2);
  EXPECT_LT(t, 2.0);
  EXPECT_NE(msg.find("GET failed"), std::string::npos) << msg;
  EXPECT_THROW(s->exists({"a", "b"}), e8kv::Error);  // reconnects, times out again
  close(fd);
}

TEST(StoreAbsent, ServerGoneMidSessionThenBack) {
  const std::string dir = env("E8KV_TEST_REDIS_DIR"), server = env("E8KV_TEST_REDIS_SERVER");
  if (dir.empty()) GTEST_SKIP() << "no redis-server: run through tests/store/with_redis.sh (ctest does)";
  // A second server of our own on another socket, stopped and started again under the store's feet.
  const std::string sock = dir + "/second.sock";
  const std::string start = server + " --port 0 --unixsocket " + sock + " --save '' --appendonly no --dir " + dir +
                            " --daemonize yes --pidfile " + dir + "/second.pid --logfile " + dir + "/second.log";
  const auto wait_for = [&](bool up) {
    for (int i = 0; i < 100; ++i) {
      if ((access(sock.c_str(), F_OK) == 0) == up) return true;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  };
  ASSERT_EQ(std::system(start.c_str()), 0);
  ASSERT_TRUE(wait_for(true));
  auto s = open_store("unix://" + sock);
  ASSERT_TRUE(s->put_if_absent("k", bytes_of("v"), milliseconds(0)));
  ASSERT_EQ(std::system(("kill $(cat " + dir + "/second.pid)").c_str()), 0);
  ASSERT_TRUE(wait_for(false));
  std::string msg;
  EXPECT_LT(seconds_to_throw([&] { s->get("k"); }, &msg), 1.0);
  EXPECT_NE(msg.find("unix://" + sock), std::string::npos) << msg;
  EXPECT_LT(seconds_to_throw([&] { s->exists({"k"}); }, &msg), 1.0);  // reconnect refused: still an error
  ASSERT_EQ(std::system(start.c_str()), 0);
  ASSERT_TRUE(wait_for(true));
  EXPECT_FALSE(s->get("k"));  // reconnected; no persistence, so the value is gone: a miss
  std::system(("kill $(cat " + dir + "/second.pid)").c_str());
}

}  // namespace
