// Hostile input: containers whose checksums pass (recomputed by whoever crafted them, or not
// verified) but whose sizes lie. The reader must reject them with e8kv::Error before it allocates
// what the lies ask for (issue 18, class 1). This binary replaces the global operator new to
// record the largest single allocation made while a read runs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "e8kv/entropy/checksum.hpp"
#include "e8kv/entropy/container.hpp"
#include "e8kv/error.hpp"

namespace {

std::atomic<bool> g_probing{false};
std::atomic<size_t> g_largest{0};

void* counted_alloc(size_t n) {
  if (g_probing.load(std::memory_order_relaxed)) {
    size_t prev = g_largest.load(std::memory_order_relaxed);
    while (n > prev && !g_largest.compare_exchange_weak(prev, n)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(size_t n) { return counted_alloc(n); }
void* operator new[](size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

using namespace e8kv;
namespace ent = e8kv::entropy;

// Runs f and returns the largest single allocation it made (through operator new).
template <class F>
size_t largest_allocation(F&& f) {
  g_largest = 0;
  g_probing = true;
  try {
    f();
  } catch (...) {
    g_probing = false;
    throw;
  }
  g_probing = false;
  return g_largest;
}

std::string data_dir() {
  std::string f = __FILE__;  // .../tests/entropy/container_hostile_test.cpp
  return f.substr(0, f.rfind('/')) + "/../data";
}

std::vector<uint8_t> read_golden(const std::string& name) {
  std::ifstream f(data_dir() + "/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read tests/data/" << name;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

template <class T>
T get_at(const std::vector<uint8_t>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
template <class T>
void put_at(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

void fix_header_crc(std::vector<uint8_t>& b) {
  const size_t hb = static_cast<size_t>(get_at<uint64_t>(b, 16));
  put_at<uint32_t>(b, hb - 4, ent::crc32c(b.data(), hb - 4));
}

// Reads `bytes` as the kind it holds, through every full and partial entry point.
void read_everything(const std::vector<uint8_t>& bytes, const ent::DeserializeOptions& o) {
  const ent::ContainerInfo info = ent::read_info(bytes.data(), bytes.size(), o);
  if (info.kind == ent::ContainerKind::kPlain) {
    (void)ent::deserialize_plain(bytes.data(), bytes.size(), o);
    return;
  }
  (void)ent::deserialize(bytes.data(), bytes.size(), o);
  for (int l = 0; l < info.layout.n_layers; ++l) {
    (void)ent::deserialize_layer(bytes.data(), bytes.size(), l, o);
    (void)ent::deserialize_tokens(bytes.data(), bytes.size(), l, 3, 40, o);
  }
}

// The reported case: a 10 KB plain container (2 bf16 tensors [24, 2, 64]) whose head_dim has a
// high bit set asks for 2 × 1.6 GB. It must be refused from its header, before any allocation
// of that size, whether the CRC was recomputed or not verified.
TEST(ContainerHostile, PlainContainerWithCorruptedHeadDimIsRejectedBeforeAllocating) {
  const std::vector<uint8_t> golden = read_golden("plain_bf16.e8kv");
  ASSERT_EQ(get_at<uint64_t>(golden, 80), 64u) << "head_dim sits at offset 80 (docs/format.md 2.3)";
  for (uint64_t head_dim : {uint64_t{64} | (uint64_t{1} << 24), uint64_t{64} | (uint64_t{1} << 20), uint64_t{65536}}) {
    for (bool verify : {true, false}) {
      std::vector<uint8_t> t = golden;
      put_at<uint64_t>(t, 80, head_dim);
      if (verify) fix_header_crc(t);
      ent::DeserializeOptions o;
      o.verify_checksums = verify;
      const auto start = std::chrono::steady_clock::now();
      std::string message;
      const size_t largest = largest_allocation([&] {
        try {
          (void)ent::deserialize_plain(t.data(), t.size(), o);
        } catch (const Error& e) {
          message = e.what();
        }
      });
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_FALSE(message.empty()) << "head_dim " << head_dim << " was accepted";
      EXPECT_LE(largest, size_t{1} << 20) << "head_dim " << head_dim << ": allocated " << largest
                                          << " bytes for a " << t.size() << "-byte input (" << message << ")";
      std::printf("head_dim %llu, checksums %s: rejected after %.3f s, largest allocation %zu bytes: %s\n",
                  static_cast<unsigned long long>(head_dim), verify ? "recomputed" : "off", seconds, largest,
                  message.c_str());
    }
  }
}

// A compressed-cache header (CRC recomputed) whose layer table claims 2^20 coded tokens in one
// chunk of a 30 KB container: refused from the header, before the layer's vectors are reserved.
TEST(ContainerHostile, CacheHeaderClaimingMoreTokensThanItsChunksHoldIsRejectedBeforeAllocating) {
  const std::vector<uint8_t> golden = read_golden("k3v2_evict_window.e8kv");
  const size_t table = 48 + 128 + 2 * 2;  // layer table of layer 0 (after the per-layer codecs)
  for (uint64_t coded : {uint64_t{1} << 20, uint64_t{1} << 24, (uint64_t{1} << 31) - 64}) {
    std::vector<uint8_t> t = golden;
    put_at<int64_t>(t, table, int64_t{1} << 40);  // original_tokens
    put_at<uint64_t>(t, table + 32, coded);        // coded tokens of set 0
    fix_header_crc(t);
    std::string message;
    const size_t largest = largest_allocation([&] {
      try {
        read_everything(t, ent::DeserializeOptions{});
      } catch (const Error& e) {
        message = e.what();
      }
    });
    EXPECT_FALSE(message.empty()) << coded << " coded tokens were accepted";
    EXPECT_LE(largest, size_t{1} << 20) << coded << " coded tokens: allocated " << largest << " bytes (" << message
                                        << ")";
  }
}

// Every header byte of every golden file set to a few values, the CRC recomputed: each read
// either succeeds or throws e8kv::Error, and no single allocation exceeds a bound proportional
// to the input (the codecs a valid read rebuilds stay far below it).
TEST(ContainerHostile, HeaderFieldLiesNeverCauseLargeAllocations) {
  for (const char* name : {"k3v2_evict_window.e8kv", "perhead_ball_vor.e8kv", "lossless_fp16.e8kv", "plain_bf16.e8kv"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> golden = read_golden(name);
    const size_t hb = static_cast<size_t>(get_at<uint64_t>(golden, 16));
    const size_t bound = std::max<size_t>(size_t{8} << 20, 64 * golden.size());
    size_t worst = 0, worst_at = 0;
    int rejected = 0, accepted = 0;
    for (size_t at = 8; at + 4 < hb; ++at) {
      if (at >= 16 && at < 32) continue;  // header_bytes / total_bytes: checked against the input size
      for (uint8_t value : {uint8_t(golden[at] ^ 0x01), uint8_t(golden[at] ^ 0x10), uint8_t(golden[at] ^ 0x80),
                            uint8_t{0xFF}}) {
        std::vector<uint8_t> t = golden;
        t[at] = value;
        fix_header_crc(t);
        const size_t largest = largest_allocation([&] {
          try {
            read_everything(t, ent::DeserializeOptions{});
            ++accepted;
          } catch (const Error&) {
            ++rejected;
          }
        });
        if (largest > worst) {
          worst = largest;
          worst_at = at;
        }
      }
    }
    EXPECT_LE(worst, bound) << "largest allocation " << worst << " bytes after a change of header byte " << worst_at;
    EXPECT_GT(rejected, 0);
    std::printf("%s: %d header changes rejected, %d accepted, largest allocation %zu bytes (byte %zu)\n", name,
                rejected, accepted, worst, worst_at);
  }
}

}  // namespace
