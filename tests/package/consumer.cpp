// Minimal consumer: links e8kv through find_package and checks a lattice decode works, and the
// llama.cpp adapter (e8kv::llama_cpp) writes and reads back a sequence state.
#include <cstdio>
#include <cstring>

#include "e8kv/e8kv.hpp"
#include "e8kv/llama_cpp/seq_state.hpp"

namespace e8kv { const char* version_string(); }

int main() {
  const float x[8] = {0.9f, 0.1f, -1.2f, 0.2f, 0.0f, 0.4f, 2.6f, -0.1f};
  float y[8];
  e8kv::lattice::nearest_e8(x, y);
  int sum2 = 0;  // 2*sum must be a multiple of 4 for a point of E8
  for (float v : y) sum2 += static_cast<int>(2 * v);
  if (sum2 % 4 != 0) { std::printf("not an E8 point\n"); return 1; }
  if (std::strcmp(e8kv::version_string(), E8KV_VERSION_STRING) != 0) return 1;
  e8kv::llama_cpp::SeqState st;
  st.streams.resize(1);  // one stream, no cells
  const auto bytes = e8kv::llama_cpp::write_seq_caches({st, st});
  if (e8kv::llama_cpp::parse_seq_caches(bytes.data(), bytes.size(), 2).size() != 2) return 1;
  std::printf("e8kv %s consumer OK\n", e8kv::version_string());
  return 0;
}
