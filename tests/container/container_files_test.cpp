// Files (write_file / read_file / read_file_layer), the golden files of tests/data (read byte
// for byte, digests checked), and a round trip through other processes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "container/container_test_util.hpp"
#include "testing/cache_digest.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/e8kv_container_test_" + std::to_string(getpid()) + "_" + name;
}

TEST(ContainerFiles, WriteReadLayerAndInfo) {
  const Made m = make_cache("preset=high,residual=4", small_spec(2, 2, 4, 64, 70, 91), 4);
  const std::string path = temp_path("files.e8kv");
  ent::write_file(path, m.cache);
  expect_cache_eq(m.cache, ent::read_file(path));
  expect_layer_eq(m.cache.layer(1), ent::read_file_layer(path, 1), "file layer 1");
  EXPECT_EQ(ent::read_file_info(path).total_bytes, ent::serialized_size(m.cache));
  // A truncated file is rejected.
  {
    const auto bytes = ent::serialize(m.cache);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() - 10));
  }
  expect_error([&] { ent::read_file(path); }, "truncated");
  std::remove(path.c_str());
  expect_error([&] { ent::read_file(path); }, "cannot open");
  expect_error([&] { ent::write_file("/nonexistent-dir/x.e8kv", m.cache); }, "cannot open");
}

// Every golden file reads back: header fields as the manifest lists them, the content digest the
// writer took from the in-memory cache before serializing it (files of versions 2-4: including
// the version-2 fields; version 5: the code tier too; version 6: the tier's centring and the RoPE
// frequency factors too), partial reads equal to the full read, and a
// re-serialization that reads back equal. Version-1 files are those written before version 2
// existed.
TEST(ContainerGolden, FilesOfEveryFormatVersionReadBack) {
  std::ifstream manifest(data_dir() + "/golden.txt");
  ASSERT_TRUE(manifest.good()) << "tests/data/golden.txt is missing";
  std::string line;
  int files = 0, files_v2 = 0, files_v5 = 0, files_v6 = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string name, kind, digest, codecs;
    int layers, kv_heads, q_heads, head_dim, per_head, pre_rope;
    ASSERT_TRUE(in >> name >> kind >> digest >> layers >> kv_heads >> q_heads >> head_dim >> per_head >> pre_rope >> codecs)
        << line;
    int version = 1;
    if (!(in >> version)) version = 1;
    SCOPED_TRACE(name);
    const auto bytes = read_all(data_dir() + "/" + name);
    ASSERT_FALSE(bytes.empty());
    const auto info = ent::read_info(bytes.data(), bytes.size());
    EXPECT_EQ(info.format_version, version);
    if (kind == "plain") {
      EXPECT_EQ(info.kind, ent::ContainerKind::kPlain);
      const ent::PlainCache p = ent::deserialize_plain(bytes.data(), bytes.size());
      EXPECT_EQ(test::plain_digest(p), digest);
      EXPECT_EQ(static_cast<int>(p.tensors.size()), layers);
      EXPECT_EQ(p.heads, kv_heads);
      EXPECT_EQ(p.head_dim, head_dim);
    } else {
      EXPECT_EQ(info.kind, ent::ContainerKind::kCompressedCache);
      const CompressedKV c = deser(bytes);
      EXPECT_EQ(test::cache_digest_for_version(c, version), digest);
      const CacheLayout& L = c.layout();
      EXPECT_EQ(L.n_layers, layers);
      EXPECT_EQ(L.n_kv_heads, kv_heads);
      EXPECT_EQ(L.n_q_heads, q_heads);
      EXPECT_EQ(L.head_dim, head_dim);
      EXPECT_EQ(L.per_head_positions ? 1 : 0, per_head);
      EXPECT_EQ(static_cast<int>(L.key_frame), pre_rope);
      std::string got;
      for (int l = 0; l < L.n_layers; ++l)
        got += std::string(l ? "," : "") + quant::to_string(L.key_codec[static_cast<size_t>(l)]) + "/" +
               quant::to_string(L.value_codec[static_cast<size_t>(l)]);
      EXPECT_EQ(got, codecs);
      if (version <= 3) {
        EXPECT_EQ(L.key_frame == transform::KeyFrame::kRopeResidual, version == 3);
      }
      bool interleaved = false;  // the fp16 tier: some pinned token follows a coded one
      for (int l = 0; l < L.n_layers; ++l) {
        const auto& ld = c.layer(l);
        interleaved =
            interleaved || (ld.pinned > 0 && !ld.positions[0].empty() &&
                            ld.window_positions[0][static_cast<size_t>(ld.pinned) - 1] > ld.positions[0].front());
      }
      if (version == 4 || version == 5) {  // the fp16 tier (version 6's file has none)
        EXPECT_TRUE(interleaved);
      }
      // Version 6: a centred tier and RoPE frequency factors, one per rotary pair.
      EXPECT_EQ(L.tier_centered, version >= 6);
      EXPECT_EQ(L.rope.freq_factors.size(), version >= 6 ? static_cast<size_t>(L.head_dim / 2) : 0u);
      if (version >= 6) ++files_v6;
      EXPECT_EQ(L.has_code_tier(), version >= 5);
      if (version >= 5) ++files_v5;
      for (int l = 0; l < L.n_layers; ++l) {
        const auto& ld = c.layer(l);
        ASSERT_EQ(ld.tier_positions.size(), ld.positions.size()) << "one tier set per position set, in every version";
        if (version >= 5) {  // the code tier: tier tokens among the coded ones, rvq4 codes, fp16 gains
          EXPECT_TRUE(L.layer_has_code_tier(l));
          ASSERT_GT(c.tier_tokens(l), 0);
          EXPECT_LT(ld.tier_positions[0].front(), ld.positions[0].back());
          EXPECT_GT(ld.tier_positions[0].back(), ld.positions[0].front());
          EXPECT_EQ(ld.heads[1].tier_key_codes.size(),
                    static_cast<size_t>(c.tier_tokens(l)) * 32);  // rvq4: 8 blocks × 4 bytes
          EXPECT_EQ(ld.heads[1].tier_value_gains.size(), static_cast<size_t>(c.tier_tokens(l)));
        } else {
          EXPECT_EQ(c.tier_tokens(l), 0);
        }
      }
      if (version >= 2) {
        ++files_v2;
        EXPECT_TRUE(L.query_weighted_keys);
        EXPECT_EQ(L.gain_bits, 8);
        // Flushed codes with scales and 8-bit gains, or a pending energy.
        const auto& ld = c.layer(1);
        const bool flushed = !ld.heads[0].key_channel_scale.empty() && !ld.heads[0].key_gain_codes.empty() &&
                             ld.heads[0].key_gain_ref != 0;
        const bool pending = ld.heads[0].key_channel_scale.empty() && ld.query_energy.size() == 2;
        EXPECT_TRUE(flushed != pending) << "the golden files of versions 2-4 have scales + 8-bit gains, or pending energy";
      }
      // Partial reads of golden files agree with the full read, and the cache re-serializes.
      for (int l = 0; l < L.n_layers; ++l)
        expect_layer_eq(c.layer(l), ent::deserialize_layer(bytes.data(), bytes.size(), l), "golden layer");
      expect_cache_eq(c, deser(ent::serialize(c)));
      const LayerData middle = ent::deserialize_tokens(bytes.data(), bytes.size(), 1, 5, 40);
      expect_layer_eq(slice(c, 1, 5, 40), middle, "golden tokens [5, 40) of layer 1");
      std::vector<float> q(static_cast<size_t>(L.n_q_heads * L.head_dim), 0.05f), out(q.size());
      for (int l = 0; l < L.n_layers; ++l)
        if (every_head_has_tokens(c, l)) e8kv::attend(c, l, q.data(), out.data());
    }
    ++files;
  }
  EXPECT_EQ(files, 10);
  EXPECT_EQ(files_v2, 6);
  EXPECT_EQ(files_v5, 2);
  EXPECT_EQ(files_v6, 1);
}

// Writes the cache to a file in one child process, reads it and attends in a second child
// process, and compares that output with the attention of the original cache in this one.
TEST(ContainerFiles, WrittenAndReadBackInOtherProcesses) {
  const Made m = make_cache("preset=high,residual=8,flush=16", small_spec(3, 2, 8, 128, 140, 97), 12);
  const CacheLayout& L = m.cache.layout();
  const size_t n = static_cast<size_t>(L.n_q_heads * L.head_dim);
  std::vector<float> q(n);
  auto rng = test::seeded_rng(98);
  std::normal_distribution<float> g(0.f, 1.f);
  for (auto& x : q) x = g(rng);
  std::vector<float> expected(n * static_cast<size_t>(L.n_layers));
  for (int l = 0; l < L.n_layers; ++l) e8kv::attend(m.cache, l, q.data(), &expected[n * static_cast<size_t>(l)]);

  const std::string file = temp_path("proc.e8kv"), result = temp_path("proc.out");
  std::fflush(stdout);
  pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    int rc = 0;
    try {
      ent::write_file(file, m.cache);
    } catch (...) {
      rc = 3;
    }
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer process failed";

  pid_t reader = fork();
  ASSERT_GE(reader, 0);
  if (reader == 0) {
    int rc = 0;
    try {
      const CompressedKV c = ent::read_file(file);  // fresh codecs from the header
      std::vector<float> out(n * static_cast<size_t>(c.n_layers()));
      for (int l = 0; l < c.n_layers(); ++l) e8kv::attend(c, l, q.data(), &out[n * static_cast<size_t>(l)]);
      std::ofstream f(result, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * sizeof(float)));
      rc = f.good() ? 0 : 4;
    } catch (...) {
      rc = 5;
    }
    _exit(rc);
  }
  ASSERT_EQ(waitpid(reader, &status, 0), reader);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader process failed";
  const auto got = read_all(result);
  ASSERT_EQ(got.size(), expected.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size()), 0) << "attention after the file round trip differs";
  std::remove(file.c_str());
  std::remove(result.c_str());
}

}  // namespace
