// The fleet's push / pull (tools/fleet.hpp) on synthetic llama-server slot files, through the
// in-process store and, under tests/store/with_redis.sh, a real redis-server on a Unix socket.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/seq_state.hpp"
#include "e8kv/llama_cpp/state_codec.hpp"
#include "e8kv/numeric/half.hpp"
#include "fleet.hpp"
#include "synthetic_state.hpp"

namespace e8kv::llama_cpp::fleet {
namespace {

const ModelShape kShape{2, 2, 4, 64};

Config config(const std::string& spec) {
  Config c = Config::parse_at_rest(spec);
  c.rope.layout = transform::RopeLayout::kInterleaved;
  c.rope.head_dim = 64;
  c.rope.theta = 10000.0;
  return c;
}

// A slot file of `tokens` whose f16 cells hold positions 0..n-1 in a shuffled order.
std::vector<uint8_t> make_slot(const std::vector<int32_t>& tokens, uint32_t seed, bool v_trans) {
  synthetic::Gaussian g(seed);
  std::vector<int32_t> positions = synthetic::positions(0, tokens.size());
  std::shuffle(positions.begin(), positions.end(), g.rng);
  const SeqState st = synthetic::make_f16_state(kShape.n_layers, kShape.n_kv_heads, kShape.head_dim,
                                                std::move(positions), v_trans, 0.5f, g);
  return synthetic::slot_file(tokens, write_seq_state(st));
}

std::vector<int32_t> token_run(size_t n, int32_t first) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<int32_t>(i * 3 % 1000);
  return t;
}

// llama-server writes its prompt's packed form into slot files (-1, version 1, count, tokens,
// media count): read as bare tokens, every prefix key missed (found by scripts/llama-fleet.sh).
TEST(FleetSlot, ServerPackedTokenListIsReadAsItsTokens) {
  const std::vector<int32_t> tokens = token_run(11, 7);
  auto file_with = [](const std::vector<int32_t>& words) { return synthetic::slot_file(words, {}); };
  std::vector<int32_t> packed = {-1, 1, static_cast<int32_t>(tokens.size())};
  packed.insert(packed.end(), tokens.begin(), tokens.end());
  packed.push_back(0);  // no media chunks
  const auto f = file_with(packed);
  EXPECT_EQ(parse_slot_file(f.data(), f.size()).tokens, tokens);
  const auto bare = file_with(tokens);
  EXPECT_EQ(parse_slot_file(bare.data(), bare.size()).tokens, tokens);
  packed[1] = 2;  // another version of the packed form
  const auto v2 = file_with(packed);
  EXPECT_THROW(parse_slot_file(v2.data(), v2.size()), Error);
  packed[1] = 1;
  packed.back() = 1;  // a media chunk (multimodal prompt)
  const auto media = file_with(packed);
  EXPECT_THROW(parse_slot_file(media.data(), media.size()), Error);
}

TEST(FleetSlot, TruncateKeepsThePrefixCells) {
  for (bool v_trans : {false, true}) {
    const auto tokens = token_run(37, 5);
    const auto file = make_slot(tokens, 3, v_trans);
    const auto cut = truncate_slot_file(file.data(), file.size(), 20);
    const SlotFile s = parse_slot_file(cut.data(), cut.size());
    EXPECT_EQ(s.tokens, std::vector<int32_t>(tokens.begin(), tokens.begin() + 20));
    const SeqState a = parse_seq_state(file.data() + parse_slot_file(file.data(), file.size()).state_offset,
                                       file.size() - parse_slot_file(file.data(), file.size()).state_offset);
    const SeqState b = parse_seq_state(cut.data() + s.state_offset, cut.size() - s.state_offset);
    ASSERT_EQ(b.streams[0].cells(), 20u);
    // Every kept cell's K row and V elements are those of the same position in the original.
    const auto& A = a.streams[0];
    const auto& B = b.streams[0];
    const size_t row = A.layers[0].k_row_bytes, na = A.cells(), nb = B.cells();
    for (size_t cb = 0; cb < nb; ++cb) {
      const size_t ca = std::find(A.positions.begin(), A.positions.end(), B.positions[cb]) - A.positions.begin();
      ASSERT_LT(B.positions[cb], 20);
      for (size_t l = 0; l < A.layers.size(); ++l) {
        EXPECT_EQ(0, std::memcmp(&A.layers[l].keys[ca * row], &B.layers[l].keys[cb * row], row));
        if (v_trans) {
          for (size_t ch = 0; ch < A.layers[l].v_embd; ch += 17)
            EXPECT_EQ(0, std::memcmp(&A.layers[l].values[(ch * na + ca) * 2], &B.layers[l].values[(ch * nb + cb) * 2], 2));
        } else {
          EXPECT_EQ(0, std::memcmp(&A.layers[l].values[ca * row], &B.layers[l].values[cb * row], row));
        }
      }
    }
    EXPECT_EQ(truncate_slot_file(file.data(), file.size(), 37), file);
    EXPECT_THROW(truncate_slot_file(file.data(), file.size(), 38), Error);
  }
}

class FleetTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string which = GetParam();
    const char* a = std::getenv("E8KV_TEST_REDIS_UNIX");
    if (which == "redis" && !a) GTEST_SKIP() << "no redis-server: run through tests/store/with_redis.sh (ctest does)";
    store_ = store::open_store(which == "redis" ? a : "memory:");
  }
  FleetModel model(const KVCompressor& c, const std::string& salt) {
    FleetModel m;
    m.caches = {&c};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    m.fingerprint = store::model_fingerprint({{salt + info->name() + GetParam(), {64}, 1}}, layout_string(m.caches));
    m.chunk_tokens = 16;
    return m;
  }
  std::unique_ptr<store::Store> store_;
};

TEST_P(FleetTest, PushPullRoundTripLossless) {
  const KVCompressor c(kShape, config("preset=lossless"));
  const FleetModel m = model(c, "a");
  const auto tokens = token_run(16 * 3 + 9, 100);
  const auto slot = make_slot(tokens, 11, true);
  const PushResult p = push_slot(*store_, m, slot.data(), slot.size(), std::chrono::minutes(5));
  EXPECT_EQ(p.file_tokens, tokens.size());
  EXPECT_EQ(p.published_tokens, 48u);
  EXPECT_EQ(p.stored.data_stored, 1u);
  EXPECT_EQ(p.stored.references_stored, 2u);

  // The whole prompt and more: 3 chunks, the slot cut to 48 tokens, byte for byte (lossless, f16).
  auto prompt = tokens;
  prompt.push_back(7);
  PullResult r = pull_slot(*store_, m, prompt);
  EXPECT_EQ(r.n_tokens, 48u);
  EXPECT_EQ(r.slot_file, truncate_slot_file(slot.data(), slot.size(), 48));
  EXPECT_EQ(r.round_trips, 2u);
  // A prompt sharing 2 chunks and 5 tokens: 2 chunks, through a reference.
  prompt.assign(tokens.begin(), tokens.begin() + 37);
  prompt.insert(prompt.end(), 40, 1);
  r = pull_slot(*store_, m, prompt);
  EXPECT_EQ(r.n_tokens, 32u);
  EXPECT_EQ(r.slot_file, truncate_slot_file(slot.data(), slot.size(), 32));
  EXPECT_EQ(r.round_trips, 3u);
  // Another first chunk, too short a prompt, another preset (fingerprint): misses.
  prompt[0] += 1;
  EXPECT_EQ(pull_slot(*store_, m, prompt).n_tokens, 0u);
  EXPECT_EQ(pull_slot(*store_, m, std::vector<int32_t>(tokens.begin(), tokens.begin() + 15)).n_tokens, 0u);
  const KVCompressor c2(kShape, config("preset=quant-k3v2"));
  FleetModel m2 = model(c2, "a");
  EXPECT_NE(m2.fingerprint, m.fingerprint);
  EXPECT_EQ(pull_slot(*store_, m2, tokens).n_tokens, 0u);
  // Shorter than a chunk: nothing published.
  const auto small = make_slot(token_run(10, 1), 2, false);
  EXPECT_EQ(push_slot(*store_, m, small.data(), small.size(), std::chrono::minutes(5)).published_tokens, 0u);
}

TEST_P(FleetTest, QuantizedPresetRestoresTheCellsApproximately) {
  const KVCompressor c(kShape, config("preset=quant-k3v2"));
  const FleetModel m = model(c, "b");
  const auto tokens = token_run(16 * 16, 7);
  const auto slot = make_slot(tokens, 5, false);
  const PushResult p = push_slot(*store_, m, slot.data(), slot.size(), std::chrono::minutes(5));
  EXPECT_LT(p.value_bytes * 3, p.slot_bytes);  // ~3 bits/element against 16 (+ token list)
  const PullResult r = pull_slot(*store_, m, tokens);
  ASSERT_EQ(r.n_tokens, 256u);
  const SlotFile s = parse_slot_file(r.slot_file.data(), r.slot_file.size());
  EXPECT_EQ(s.tokens, tokens);
  const SeqState a = parse_seq_state(slot.data() + s.state_offset, slot.size() - s.state_offset);
  const SeqState b = parse_seq_state(r.slot_file.data() + s.state_offset, r.slot_file.size() - s.state_offset);
  ASSERT_EQ(b.streams[0].positions, a.streams[0].positions);
  double err = 0, energy = 0;
  const auto& ka = a.streams[0].layers[1].keys;
  const auto& kb = b.streams[0].layers[1].keys;
  for (size_t i = 0; i + 1 < ka.size(); i += 2) {
    uint16_t x, y;
    std::memcpy(&x, &ka[i], 2);
    std::memcpy(&y, &kb[i], 2);
    const double fx = fp16_bits_to_float(x), fy = fp16_bits_to_float(y);
    err += (fx - fy) * (fx - fy);
    energy += fx * fx;
  }
  EXPECT_LT(err / energy, 0.05);  // 3-bit keys: ~2 % relative error
  EXPECT_GT(err, 0.0);
}

TEST_P(FleetTest, CorruptValueIsALoggedMiss) {
  const KVCompressor c(kShape, config("preset=lossless"));
  const FleetModel m = model(c, "c");
  const auto tokens = token_run(32, 9);
  const auto slot = make_slot(tokens, 8, false);
  push_slot(*store_, m, slot.data(), slot.size(), std::chrono::minutes(5));
  const auto keys = store::prefix_keys(m.fingerprint, tokens.data(), tokens.size(), 16);
  // Replace the data with an envelope that is intact but whose compressed state has a flipped byte.
  auto value = *store_->get(keys[1]);
  auto env = *store::unwrap(keys[1], value.data(), value.size(), nullptr);
  env.payload[env.payload.size() - 20] ^= 4;
  store_->remove(keys[1]);
  store_->put_if_absent(keys[1], store::wrap(keys[1], env), std::chrono::minutes(5));
  std::vector<std::string> log;
  const store::MissLog ml = [&](const std::string& k, const std::string& why) { log.push_back(k + ": " + why); };
  const PullResult r = pull_slot(*store_, m, tokens, ml);
  EXPECT_EQ(r.n_tokens, 0u);  // the 2-chunk value refused; the 1-chunk reference points at it: refused too
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[0].find("payload refused"), std::string::npos) << log[0];
}

INSTANTIATE_TEST_SUITE_P(Stores, FleetTest, ::testing::Values("memory", "redis"));

}  // namespace
}  // namespace e8kv::llama_cpp::fleet
