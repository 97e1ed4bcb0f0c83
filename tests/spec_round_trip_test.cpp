// Every spec a user can type round-trips (issue 40, item 1): for every preset of
// Config::preset_names() and a set of typed specs (budgets, the spread, shared and per-head sets,
// protected layers, tiers), a cache made through the C ABI and one made through C++ are the same
// container; serialized and read back through the C ABI with the compressor that made it (which
// the budget's per-layer codes once failed: "another configuration ... key_codec[0]"), through C++
// without it, and through C++ with it (append), each attends bit for bit like the cache that was
// written, before and after appending tokens with the same compressor. Fixed seeds, printed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/c_api.h"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/test_util.hpp"

namespace e8kv {
namespace {

std::vector<std::string> specs() {
  std::vector<std::string> out;
  std::stringstream names(Config::preset_names());
  std::string name;
  while (std::getline(names, name, ',')) {
    name.erase(0, name.find_first_not_of(' '));
    out.push_back("preset=" + name);
  }
  for (const char* s : {"", "budget=3.2", "preset=quant-k3v2,budget=2.5,residual=0", "preset=quant-k3v2,index_budget=2.5",
                        "preset=quant-k2v2,index_budget=3,code_tier=0.05", "preset=quant-k3v2,budget=3.4,evict=0.3,evict_layers=1",
                        "preset=high,shared=1", "preset=high,per_head=1", "preset=tier-k3v2,per_head=1",
                        "preset=quant-k3v2,protect=1", "preset=quant-k2v2,fp16_tier=0.02", "preset=quant-k3v2,rope=post",
                        "preset=quant-k3v2,gain_bits=16", "preset=quant-k4v2,key=ball3"})
    out.push_back(s);
  return out;
}

class Check {
 public:
  explicit Check(const std::string& what) : what_(what) {}
  void ok(e8kv_status s, const char* call) const {
    ASSERT_EQ(s, E8KV_OK) << what_ << ": " << call << ": " << e8kv_last_error();
  }

 private:
  std::string what_;
};

std::vector<uint8_t> c_serialize(const e8kv_cache* cache, const Check& check) {
  void* buffer = nullptr;
  size_t size = 0;
  check.ok(e8kv_serialize_alloc(cache, &buffer, &size), "e8kv_serialize_alloc");
  std::vector<uint8_t> out(static_cast<const uint8_t*>(buffer), static_cast<const uint8_t*>(buffer) + size);
  e8kv_free(buffer);
  return out;
}

/// Attention of `n` query rows at `position` over every layer, through the C ABI.
std::vector<float> c_attend_all(const e8kv_cache* cache, const testkit::Fixture& fx, int32_t position, const Check& check) {
  const size_t row = static_cast<size_t>(fx.shape.n_q_heads) * fx.shape.head_dim;
  std::vector<float> out(row * fx.shape.n_layers * 2), lse(static_cast<size_t>(fx.shape.n_q_heads));
  for (int l = 0; l < fx.shape.n_layers; ++l)
    for (int w = 0; w < 2; ++w)
      check.ok(e8kv_attend(cache, l, fx.query(l, w), position, &out[(static_cast<size_t>(l) * 2 + w) * row], lse.data(),
                           nullptr),
               "e8kv_attend");
  return out;
}
std::vector<float> cpp_attend_all(const CompressedKV& cache, const testkit::Fixture& fx) {
  const size_t row = static_cast<size_t>(fx.shape.n_q_heads) * fx.shape.head_dim;
  std::vector<float> out(row * fx.shape.n_layers * 2), lse(static_cast<size_t>(fx.shape.n_q_heads));
  for (int l = 0; l < fx.shape.n_layers; ++l)
    for (int w = 0; w < 2; ++w) attend(cache, l, fx.query(l, w), &out[(static_cast<size_t>(l) * 2 + w) * row], lse.data());
  return out;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SpecRoundTrip, EveryPresetAndTypedSpecThroughCAndCpp) {
  synth::SyntheticSpec spec;
  spec.n_layers = 3;
  spec.tokens = 700;
  spec.seed = 4001;
  std::printf("[seed] SpecRoundTrip: %llu\n", static_cast<unsigned long long>(spec.seed));
  testkit::Fixture fx(spec);
  const int L = spec.n_layers, H = spec.n_kv_heads, d = spec.head_dim;
  const int appended = 20;  // tokens [tokens - appended, tokens) are appended after the round trip
  const int n = spec.tokens - appended;
  const e8kv_model_shape shape{L, H, spec.n_q_heads, d};
  std::vector<const void*> keys(static_cast<size_t>(L)), values(keys.size()), queries(keys.size());
  for (int l = 0; l < L; ++l) {
    keys[static_cast<size_t>(l)] = fx.data.keys[static_cast<size_t>(l)].data();
    values[static_cast<size_t>(l)] = fx.data.values[static_cast<size_t>(l)].data();
    queries[static_cast<size_t>(l)] = fx.data.queries[static_cast<size_t>(l)].data();
  }
  e8kv_kv_input kv{};
  kv.dtype = E8KV_DTYPE_F32;
  kv.n_tokens = n;
  kv.keys = keys.data();
  kv.values = values.data();
  e8kv_query_input qin{};
  qin.dtype = E8KV_DTYPE_F32;
  qin.n_queries = static_cast<int64_t>(fx.data.query_positions.size());
  qin.queries = queries.data();
  qin.positions = fx.data.query_positions.data();
  SequenceKV prefix;
  for (const auto& layer : fx.seq.layers) prefix.layers.push_back({layer.keys.token_slice(0, n), layer.values.token_slice(0, n)});

  for (const std::string& s : specs()) {
    SCOPED_TRACE(s);
    const Check check(s);
    e8kv_compressor* c = nullptr;
    check.ok(e8kv_compressor_create(&shape, s.c_str(), &c), "e8kv_compressor_create");
    if (c == nullptr) continue;
    const KVCompressor cpp(fx.shape, Config::parse(s));
    e8kv_cache* made = nullptr;
    check.ok(e8kv_compress(c, &kv, &qin, nullptr, &made), "e8kv_compress");
    if (made == nullptr) {
      e8kv_compressor_destroy(c);
      continue;
    }
    const CompressedKV direct = cpp.compress(prefix, &fx.queries);
    const std::vector<uint8_t> blob = c_serialize(made, check);
    ASSERT_EQ(blob, container::serialize(direct)) << "the C ABI and C++ compress differently";
    const std::vector<float> want = c_attend_all(made, fx, spec.tokens, check);
    ASSERT_TRUE(bit_identical(want, cpp_attend_all(direct, fx)));

    // Read back: C with the compressor, C without, C++ without (then appended with the compressor).
    e8kv_cache *with = nullptr, *without = nullptr;
    check.ok(e8kv_deserialize(blob.data(), blob.size(), c, &with), "e8kv_deserialize (with the compressor)");
    check.ok(e8kv_deserialize(blob.data(), blob.size(), nullptr, &without), "e8kv_deserialize");
    CompressedKV back = container::deserialize(blob.data(), blob.size());
    ASSERT_NE(with, nullptr);
    ASSERT_NE(without, nullptr);
    EXPECT_TRUE(bit_identical(c_attend_all(with, fx, spec.tokens, check), want));
    EXPECT_TRUE(bit_identical(c_attend_all(without, fx, spec.tokens, check), want));
    EXPECT_TRUE(bit_identical(cpp_attend_all(back, fx), want));

    // Appending continues every copy alike (the compressor accepts each).
    CompressedKV grown = direct;
    for (int t = n; t < spec.tokens; ++t)
      for (int l = 0; l < L; ++l) {
        const float* k = &fx.data.keys[static_cast<size_t>(l)][static_cast<size_t>(t) * H * d];
        const float* v = &fx.data.values[static_cast<size_t>(l)][static_cast<size_t>(t) * H * d];
        cpp.append(grown, l, k, v, t);
        cpp.append(back, l, k, v, t);
        check.ok(e8kv_append(c, made, l, E8KV_DTYPE_F32, k, v, t), "e8kv_append (made)");
        check.ok(e8kv_append(c, with, l, E8KV_DTYPE_F32, k, v, t), "e8kv_append (read back with the compressor)");
        check.ok(e8kv_append(c, without, l, E8KV_DTYPE_F32, k, v, t), "e8kv_append (read back without it)");
      }
    const std::vector<float> after = cpp_attend_all(grown, fx);
    EXPECT_TRUE(bit_identical(c_attend_all(made, fx, spec.tokens, check), after));
    EXPECT_TRUE(bit_identical(c_attend_all(with, fx, spec.tokens, check), after));
    EXPECT_TRUE(bit_identical(c_attend_all(without, fx, spec.tokens, check), after));
    EXPECT_TRUE(bit_identical(cpp_attend_all(back, fx), after));
    EXPECT_EQ(c_serialize(with, check), container::serialize(grown));
    std::printf("%-55s %zu bytes, %.3f bits per element\n", s.empty() ? "(default)" : s.c_str(), blob.size(),
                direct.bits_per_element());

    // Another configuration's compressor still refuses the container.
    e8kv_compressor* other = nullptr;
    check.ok(e8kv_compressor_create(&shape, (s + (s.empty() ? "" : ",") + "seed=77").c_str(), &other), "create other");
    e8kv_cache* refused = nullptr;
    EXPECT_EQ(e8kv_deserialize(blob.data(), blob.size(), other, &refused), E8KV_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(refused, nullptr);
    e8kv_compressor_destroy(other);
    e8kv_cache_destroy(with);
    e8kv_cache_destroy(without);
    e8kv_cache_destroy(made);
    e8kv_compressor_destroy(c);
  }
}

}  // namespace
}  // namespace e8kv
