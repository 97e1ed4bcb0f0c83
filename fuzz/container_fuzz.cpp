// libFuzzer target for whole-container reads (scripts/fuzz.sh builds and runs it, with
// fuzz/layer_read_fuzz.cpp for partial reads).
//
// The first input byte selects the options (bit 0: verify checksums; with it off the fuzzer
// reaches the structural checks behind the CRCs; bit 1: reuse codecs of a recent layout instead
// of building fresh ones; bits 2-6: a token range start), the rest is the container. Every entry
// point of the reader must either return or throw e8kv::Error: anything else (a crash, a
// sanitizer report, another exception type, an allocation past -malloc_limit_mb / -rss_limit_mb)
// is a bug. What decodes must also survive a round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "seed_corpus.hpp"

namespace {

namespace ent = e8kv::container;

bool same(const e8kv::CompressedKV::LayerData& a, const e8kv::CompressedKV::LayerData& b) {
  if (a.original_tokens != b.original_tokens || a.pinned != b.pinned || a.positions != b.positions ||
      a.window_positions != b.window_positions || a.tier_positions != b.tier_positions ||
      a.heads.size() != b.heads.size() || a.query_energy != b.query_energy)
    return false;
  for (size_t h = 0; h < a.heads.size(); ++h) {
    const auto& x = a.heads[h];
    const auto& y = b.heads[h];
    if (x.key_codes != y.key_codes || x.value_codes != y.value_codes || x.key_gains != y.key_gains ||
        x.value_gains != y.value_gains || x.window_keys != y.window_keys || x.window_values != y.window_values ||
        x.key_mean != y.key_mean || x.value_mean != y.value_mean || x.key_channel_scale != y.key_channel_scale ||
        x.key_gain_codes != y.key_gain_codes || x.value_gain_codes != y.value_gain_codes ||
        x.key_gain_ref != y.key_gain_ref || x.value_gain_ref != y.value_gain_ref ||
        x.tier_key_codes != y.tier_key_codes || x.tier_value_codes != y.tier_value_codes ||
        x.tier_key_gains != y.tier_key_gains || x.tier_value_gains != y.tier_value_gains)
      return false;
  }
  return true;
}

void check(bool ok) {
  if (!ok) std::abort();
}

// Codecs of recently seen layouts: rebuilding them for every input would dominate the run time
// (mutations mostly keep the layout). Built the same way deserialize builds them.
std::shared_ptr<const e8kv::CacheCodecs> codecs_for(const e8kv::CacheLayout& layout) {
  static std::vector<std::shared_ptr<const e8kv::CacheCodecs>> recent;
  for (const auto& c : recent)
    if (ent::layout_difference(c->layout(), layout).empty()) return c;
  auto made = std::make_shared<const e8kv::CacheCodecs>(layout);
  if (recent.size() >= 8) recent.erase(recent.begin());
  recent.push_back(made);
  return made;
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
  // Below -malloc_limit_mb: a read within this budget is legitimate, one past it is a bug.
  o.max_decoded_bytes = uint64_t{256} << 20;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  try {
    const ent::ContainerInfo info = ent::read_info(p, n, o);
    if (info.kind == ent::ContainerKind::kCompressedCache && (data[0] & 2) != 0) o.codecs = codecs_for(info.layout);
  } catch (const e8kv::Error&) {
  }
  try {
    const ent::PlainCache c = ent::deserialize_plain(p, n, o);
    check(static_cast<int64_t>(c.tensors.size()) >= 0);
  } catch (const e8kv::Error&) {
  }
  try {
    (void)ent::deserialize_tokens(p, n, 0, (data[0] >> 2) & 31, 40, o);
  } catch (const e8kv::Error&) {
  }
  try {
    const e8kv::CompressedKV cache = ent::deserialize(p, n, o);
    // Whatever decodes re-encodes and decodes to the same cache, and can be attended to.
    const std::vector<uint8_t> again = ent::serialize(cache);
    const e8kv::CompressedKV back = ent::deserialize(again.data(), again.size(), o);
    check(back.n_layers() == cache.n_layers());
    for (int l = 0; l < cache.n_layers(); ++l) {
      check(same(cache.layer(l), back.layer(l)));
      check(same(cache.layer(l), ent::deserialize_layer(p, n, l, o)));
    }
    bool attendable = cache.n_layers() > 0;  // attend on a head without tokens is a known bug (compressed_kv.cpp)
    for (int h = 0; attendable && h < cache.layout().n_kv_heads; ++h)
      attendable = cache.stored_tokens(0, h) > 0 && cache.stored_tokens(0, h) < 4096;
    if (attendable) {
      const auto& L = cache.layout();
      std::vector<float> q(static_cast<size_t>(L.n_q_heads) * static_cast<size_t>(L.head_dim), 0.5f), out(q.size());
      e8kv::attend(cache, 0, q.data(), out.data());
    }
  } catch (const e8kv::Error&) {
  }
  return 0;
}
