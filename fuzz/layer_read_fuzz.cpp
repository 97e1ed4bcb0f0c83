// libFuzzer target for partial reads: deserialize_layer and deserialize_tokens (scripts/fuzz.sh).
// They parse the header, check the budget and the chunks a range needs, and decode only those:
// a path of its own beside the full read (fuzz/container_fuzz.cpp), and the one a decode node
// takes for each layer.
//
// Input: an options byte, then the container (the same seeds as container_fuzz). Options: bit 0
// verify checksums; bits 1-2 the layer; bits 3-7 the range start (×3); the range length is the
// input size modulo 97. Every call must return or throw e8kv::Error, and a range read must equal
// the same stored tokens cut from the layer read.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "seed_corpus.hpp"

namespace {

namespace ent = e8kv::container;
using LayerData = e8kv::CompressedKV::LayerData;

void check(bool ok) {
  if (!ok) std::abort();
}

// Rows [a, b) of a per-token vector that holds `rows` rows (element count divisible by rows).
template <class T>
std::vector<T> rows_of(const std::vector<T>& v, size_t rows, size_t a, size_t b) {
  if (rows == 0) return {};
  check(v.size() % rows == 0);
  const size_t w = v.size() / rows;
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(a * w), v.begin() + static_cast<std::ptrdiff_t>(b * w));
}

// The range [begin, end) of every set's stored tokens (coded, then code tier, then window) cut
// from `all`, and compared with what deserialize_tokens returned.
void check_is_slice(const LayerData& all, const LayerData& part, int64_t begin, int64_t end) {
  check(part.original_tokens == all.original_tokens && part.pinned == all.pinned);
  check(part.heads.size() == all.heads.size() && part.positions.size() == all.positions.size());
  check(all.tier_positions.size() == all.positions.size() && part.tier_positions.size() == all.positions.size());
  check(part.query_energy == all.query_energy);
  const size_t sets = all.positions.size();
  for (size_t h = 0; h < all.heads.size(); ++h) {
    const size_t s = sets == 1 ? 0 : h;
    const size_t C = all.positions[s].size(), T = all.tier_positions[s].size(), W = all.window_positions[s].size();
    const size_t CT = C + T;
    const size_t lo = static_cast<size_t>(std::min<int64_t>(begin, static_cast<int64_t>(CT + W)));
    const size_t hi = static_cast<size_t>(std::min<int64_t>(end, static_cast<int64_t>(CT + W)));
    const size_t c0 = std::min(lo, C), c1 = std::min(hi, C);
    const size_t t0 = std::min(std::max(lo, C), CT) - C, t1 = std::min(std::max(hi, C), CT) - C;
    const size_t w0 = std::max(lo, CT) - CT, w1 = std::max(hi, CT) - CT;
    const auto& x = all.heads[h];
    const auto& y = part.heads[h];
    check(y.tier_key_codes == rows_of(x.tier_key_codes, T, t0, t1) &&
          y.tier_value_codes == rows_of(x.tier_value_codes, T, t0, t1));
    check(y.tier_key_gains == rows_of(x.tier_key_gains, T, t0, t1) &&
          y.tier_value_gains == rows_of(x.tier_value_gains, T, t0, t1));
    check(y.key_codes == rows_of(x.key_codes, C, c0, c1) && y.value_codes == rows_of(x.value_codes, C, c0, c1));
    check(y.key_gains == rows_of(x.key_gains, C, c0, c1) && y.value_gains == rows_of(x.value_gains, C, c0, c1));
    check(y.key_gain_codes == rows_of(x.key_gain_codes, C, c0, c1) &&
          y.value_gain_codes == rows_of(x.value_gain_codes, C, c0, c1));
    check(y.window_keys == rows_of(x.window_keys, W, w0, w1) && y.window_values == rows_of(x.window_values, W, w0, w1));
    check(y.key_mean == x.key_mean && y.value_mean == x.value_mean && y.key_channel_scale == x.key_channel_scale);
    check(y.key_gain_ref == x.key_gain_ref && y.value_gain_ref == x.value_gain_ref);
    if (h == s || sets == 1) {
      check(part.positions[s] == rows_of(all.positions[s], C, c0, c1));
      check(part.tier_positions[s] == rows_of(all.tier_positions[s], T, t0, t1));
      check(part.window_positions[s] == rows_of(all.window_positions[s], W, w0, w1));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  e8kv::fuzz::write_seeds_if_asked();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ent::DeserializeOptions o;
  o.verify_checksums = (data[0] & 1) != 0;
  o.max_decoded_bytes = uint64_t{256} << 20;  // below -malloc_limit_mb (see container_fuzz.cpp)
  const int layer = (data[0] >> 1) & 3;
  const int64_t begin = 3 * static_cast<int64_t>(data[0] >> 3);
  const int64_t end = begin + static_cast<int64_t>(size % 97);
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  LayerData all;
  try {
    all = ent::deserialize_layer(p, n, layer, o);
  } catch (const e8kv::Error&) {
    // A range read of a container whose layer read fails may still succeed (it reads fewer
    // chunks); it must not crash.
    try {
      (void)ent::deserialize_tokens(p, n, layer, begin, end, o);
    } catch (const e8kv::Error&) {
    }
    return 0;
  }
  // The layer read worked, so every chunk of the layer is sound: a range read must work too.
  const LayerData part = ent::deserialize_tokens(p, n, layer, begin, end, o);
  check_is_slice(all, part, begin, end);
  return 0;
}
