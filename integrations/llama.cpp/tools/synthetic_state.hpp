// Synthetic llama.cpp sequence states and slot files, for what needs one without running a model:
// e8kv-fleet-bench --synthetic (tools/fleet_bench.cpp), the fleet tests (tests/fleet_test.cpp) and
// the fuzzer's seeds (fuzz/llama_state_fuzz.cpp). Header-only, on the adapter's public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/seq_state.hpp"
#include "e8kv/llama_cpp/state_codec.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv::llama_cpp::synthetic {

/// N(0, 1) draws from a seeded mt19937. The distribution keeps a spare draw between calls: what
/// draws before a state is built (a bias through operator(), a shuffle through `rng`) passes this
/// same object on, so that the draws go on where they stopped.
struct Gaussian {
  explicit Gaussian(uint32_t seed) : rng(seed) {}
  float operator()() { return g(rng); }
  std::mt19937 rng;
  std::normal_distribution<float> g{0.f, 1.f};
};

/// first, first + 1, ..., first + n - 1.
inline std::vector<int32_t> positions(int32_t first, size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = first + static_cast<int32_t>(i);
  return p;
}

/// One stream of `layers` f16 layers of heads × dim channels, its cells at `positions` (in that
/// order) of sequence 0, V in rows or, with `v_trans`, transposed. A layer's elements are drawn one
/// after the other, K then V: K = key_bias[channel] + N(0, 1), V = N(0, 1); both are stored in
/// that order, V too when transposed (noise has no layout to keep).
inline SeqState make_f16_state(int layers, int heads, int dim, std::vector<int32_t> positions, bool v_trans,
                               const std::vector<float>& key_bias, Gaussian& gauss) {
  const size_t embd = static_cast<size_t>(heads * dim), n = positions.size();
  if (key_bias.size() != embd)
    throw Error("make_f16_state: " + std::to_string(key_bias.size()) + " key biases for " + std::to_string(embd) +
                " channels");
  SeqState st;
  st.streams.resize(1);
  SeqStateStream& S = st.streams[0];
  S.positions = std::move(positions);
  S.seq_ids.assign(n, 0);
  S.v_trans = v_trans;
  for (int l = 0; l < layers; ++l) {
    SeqStateLayer L;
    L.k_type = L.v_type = kGgmlF16;
    L.k_row_bytes = embd * 2;
    if (v_trans) {
      L.v_element_bytes = 2;
      L.v_embd = static_cast<uint32_t>(embd);
    } else {
      L.v_row_bytes = embd * 2;
    }
    L.keys.resize(n * embd * 2);
    L.values.resize(n * embd * 2);
    for (size_t i = 0; i < n * embd; ++i) {
      const uint16_t k = float_to_fp16_bits(key_bias[i % embd] + gauss()), v = float_to_fp16_bits(gauss());
      std::memcpy(&L.keys[2 * i], &k, 2);
      std::memcpy(&L.values[2 * i], &v, 2);
    }
    S.layers.push_back(std::move(L));
  }
  return st;
}

/// The same with one key bias for every channel.
inline SeqState make_f16_state(int layers, int heads, int dim, std::vector<int32_t> positions, bool v_trans,
                               float key_bias, Gaussian& gauss) {
  return make_f16_state(layers, heads, dim, std::move(positions), v_trans,
                        std::vector<float>(static_cast<size_t>(heads * dim), key_bias), gauss);
}

/// A slot file (llama_state_seq_save_file, llama-server's --slot-save-path) of bare tokens: the
/// header, `tokens`, then `state` (a sequence state's bytes, write_seq_state; may be empty).
inline std::vector<uint8_t> slot_file(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& state) {
  std::vector<uint8_t> file(12 + 4 * tokens.size());
  const uint32_t head[3] = {kSeqFileMagic, kSeqFileVersion, static_cast<uint32_t>(tokens.size())};
  std::memcpy(file.data(), head, 12);
  if (!tokens.empty()) std::memcpy(file.data() + 12, tokens.data(), 4 * tokens.size());
  file.insert(file.end(), state.begin(), state.end());
  return file;
}

}  // namespace e8kv::llama_cpp::synthetic
