// KVCompressor::append_attend (compressor.hpp): batches of appended tokens attended as token by
// token. Per round, every request appends its tokens up to its next flush (a token appended before
// a flush sees the window rows that the flush turns into codes, so it must attend before it); then
// all the rounds' segments attend in one attend_batch, each token bounded by its own position:
// later tokens of its segment are stored but masked, so it sees exactly what it would have seen
// attending right after its own append.
#include <vector>

#include "detail/require.hpp"
#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"

namespace e8kv {

void KVCompressor::append_attend(const std::vector<AppendAttendRequest>& requests, Executor* executor) const {
  for (size_t i = 0; i < requests.size(); ++i) {
    const AppendAttendRequest& r = requests[i];
    detail::require(r.cache != nullptr, "append_attend: request {} has no cache", i);
    check_cache(*r.cache, "append_attend");
    detail::require(r.n_tokens >= 0, "append_attend: request {}: n_tokens must be >= 0, got {}", i, r.n_tokens);
    detail::require(r.n_tokens == 0 || (r.k && r.v && r.positions && r.q && r.out),
                    "append_attend: request {}: k, v, positions, q and out must not be null", i);
  }
  const size_t kv_row = static_cast<size_t>(shape_.n_kv_heads) * shape_.head_dim;
  const size_t q_row = static_cast<size_t>(shape_.n_q_heads) * shape_.head_dim;
  std::vector<int> next(requests.size(), 0), segment(requests.size(), 0);
  AttendOptions options;
  options.executor = executor;
  for (;;) {
    std::vector<AttendRequest> round;
    for (size_t i = 0; i < requests.size(); ++i) {
      const AppendAttendRequest& r = requests[i];
      if (next[i] == r.n_tokens) continue;
      segment[i] = next[i];
      do {  // the first token of a segment is appended even when its append flushes
        const size_t t = static_cast<size_t>(next[i]);
        append(*r.cache, r.layer, r.k + t * kv_row, r.v + t * kv_row, r.positions[t]);
        ++next[i];
      } while (next[i] < r.n_tokens && !append_flushes(*r.cache, r.layer));
      const size_t s = static_cast<size_t>(segment[i]);
      AttendRequest a;
      a.cache = r.cache;
      a.layer = r.layer;
      a.n_tokens = next[i] - segment[i];
      a.q = r.q + s * q_row;
      a.out = r.out + s * q_row;
      a.lse = r.lse ? r.lse + s * static_cast<size_t>(shape_.n_q_heads) : nullptr;
      a.token_max_positions = r.positions + s;
      a.token_min_positions = r.token_min_positions ? r.token_min_positions + s : nullptr;
      round.push_back(a);
    }
    if (round.empty()) return;
    attend_batch(round, options);
  }
}

}  // namespace e8kv
