// Dense causal attention over uncompressed rows (include/e8kv/attention/dense.hpp), on the decode
// attention's kernels (attend_kernels.hpp): a work item is a block of query tokens × one KV head;
// it walks the rows the block can see in tiles, widens each tile's keys and values to floats once
// for every token and query head of the block, and keeps a running softmax state per (token,
// query head) that each tile's partial state merges into, in tile order.
#include "e8kv/attention/dense.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/attend_kernels.hpp"
#include "detail/finite.hpp"
#include "detail/require.hpp"
#include "e8kv/attention/state.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/parallel.hpp"

namespace e8kv {
namespace {

using attention::ExpE;
using attention::MergeScales;
using attention::SoftmaxRun;

constexpr int64_t kBlockTokens = 16;  // query tokens per work item
constexpr int64_t kTileRows = 64;     // rows widened at once (a multiple of 8: the softmax pads to 8)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Job {
  const DenseRows* kv;
  int H, G, d, blocks;
  float scale;
  int32_t window;
  int64_t row_stride;  // elements
  size_t elem;         // bytes per element
  const float* q;
  const int32_t* qpos;
  int64_t n_tokens;
  float* out;
  float* lse;
};

struct Scratch {
  std::vector<float> k, v;       // [kTileRows][d]
  std::vector<float> logits;     // [token][g][kTileRows]
  std::vector<float> weights;    // [kTileRows][G]
  std::vector<SoftmaxRun<float>> run;  // [token][g]: the softmax so far
  std::vector<float> acc;             // [token][g][d]
  std::vector<int64_t> visible_lo, visible_hi;  // [token]: the rows it sees, [lo, hi)
};

/// Calls f(std::integral_constant<int, NG>) for the kernel group size of `remaining` heads.
template <class F>
int with_group(int remaining, F&& f) {
  if (remaining >= 8) return f(std::integral_constant<int, 8>{}), 8;
  if (remaining >= 4) return f(std::integral_constant<int, 4>{}), 4;
  if (remaining == 3) return f(std::integral_constant<int, 3>{}), 3;
  if (remaining == 2) return f(std::integral_constant<int, 2>{}), 2;
  return f(std::integral_constant<int, 1>{}), 1;
}

/// Rows [r0, r0 + n) of KV head h as float rows for the kernels (Fp32RowDecoder): fp32 rows where
/// they lie (*stride: the engine's row stride), fp16 rows widened once into `widened` (d floats
/// apart) for every token and head of the block.
template <class K>
const uint8_t* tile_rows(const Job& j, const void* base, int64_t r0, int64_t n, int h, float* widened, size_t* stride) {
  const auto* rows = static_cast<const uint8_t*>(base) + (static_cast<size_t>(r0 * j.row_stride) + static_cast<size_t>(h) * j.d) * j.elem;
  *stride = static_cast<size_t>(j.row_stride) * j.elem;
  if (j.kv->dtype == DType::kF32) return rows;
  K::decode_rows(typename K::Fp16RowDecoder{}, rows, *stride, j.blocks, n, widened);
  *stride = static_cast<size_t>(j.d) * sizeof(float);
  return reinterpret_cast<const uint8_t*>(widened);
}

void check_rows_finite(const DenseRows& kv, int64_t row_stride, int64_t width);

template <class K>
void run_block(const Job& j, int64_t block, int h, Scratch& s) {
  const int G = j.G, d = j.d;
  const int64_t t0 = block * kBlockTokens, t1 = std::min(j.n_tokens, t0 + kBlockTokens), nt = t1 - t0;
  const int32_t* pos = j.kv->positions;
  const int64_t n_rows = j.kv->n;
  int32_t qmin = j.qpos[t0], qmax = j.qpos[t0];
  for (int64_t t = t0; t < t1; ++t) {
    qmin = std::min(qmin, j.qpos[t]);
    qmax = std::max(qmax, j.qpos[t]);
  }
  // Rows with position <= p: [0, rows_through(p)); with position >= p: [rows_from(p), n). Without
  // positions, row r is at position r.
  auto rows_through = [&](int64_t p) -> int64_t {
    if (pos == nullptr) return std::clamp<int64_t>(p + 1, 0, n_rows);
    return std::upper_bound(pos, pos + n_rows, p, [](int64_t v, int32_t q) { return v < q; }) - pos;
  };
  auto rows_from = [&](int64_t p) -> int64_t {
    if (pos == nullptr) return std::clamp<int64_t>(p, 0, n_rows);
    return std::lower_bound(pos, pos + n_rows, p, [](int32_t q, int64_t v) { return q < v; }) - pos;
  };
  const int64_t hi = rows_through(qmax);
  const int64_t lo = j.window > 0 ? rows_from(static_cast<int64_t>(qmin) - j.window + 1) : 0;
  s.visible_lo.resize(static_cast<size_t>(nt));
  s.visible_hi.resize(static_cast<size_t>(nt));
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t qp = j.qpos[t];
    s.visible_hi[static_cast<size_t>(t - t0)] = rows_through(qp);
    s.visible_lo[static_cast<size_t>(t - t0)] = j.window > 0 ? rows_from(qp - j.window + 1) : 0;
  }
  const size_t heads = static_cast<size_t>(nt) * G;
  s.run.assign(heads, SoftmaxRun<float>{});
  s.acc.assign(heads * d, 0.f);
  s.k.resize(static_cast<size_t>(kTileRows) * d);
  s.v.resize(static_cast<size_t>(kTileRows) * d);
  s.logits.resize(heads * kTileRows);
  s.weights.resize(static_cast<size_t>(kTileRows) * 8);
  const typename K::Fp32RowDecoder f32{};
  for (int64_t r0 = lo; r0 < hi; r0 += kTileRows) {
    const int64_t n = std::min(kTileRows, hi - r0);
    size_t kstride = 0, vstride = 0;
    const uint8_t* krows = tile_rows<K>(j, j.kv->keys, r0, n, h, s.k.data(), &kstride);
    const uint8_t* vrows = tile_rows<K>(j, j.kv->values, r0, n, h, s.v.data(), &vstride);
    for (int64_t t = t0; t < t1; ++t) {
      // The rows token t sees are one run [seen_a, seen_b) of the tile (positions ascend).
      const int64_t seen_a = std::clamp<int64_t>(s.visible_lo[static_cast<size_t>(t - t0)] - r0, 0, n);
      const int64_t seen_b = std::clamp<int64_t>(s.visible_hi[static_cast<size_t>(t - t0)] - r0, seen_a, n);
      const float* qt = j.q + (static_cast<size_t>(t) * j.H * G + static_cast<size_t>(h) * G) * d;
      float* lg = s.logits.data() + static_cast<size_t>(t - t0) * G * kTileRows;
      for (int g0 = 0; g0 < G;) {
        g0 += with_group(G - g0, [&](auto ng) {
          constexpr int NG = decltype(ng)::value;
          K::template dot_rows<NG>(f32, krows, kstride, j.blocks, qt + static_cast<size_t>(g0) * d, n,
                                   lg + static_cast<size_t>(g0) * kTileRows, kTileRows);
        });
      }
      for (int g = 0; g < G; ++g) {
        float* row = lg + static_cast<size_t>(g) * kTileRows;
        std::fill(row, row + seen_a, kNegInf);
        for (int64_t r = seen_a; r < seen_b; ++r) row[r] *= j.scale;
        const size_t seen = static_cast<size_t>(seen_b - seen_a);
        if (detail::first_non_finite(row + seen_a, seen) < seen) {
          check_rows_finite(*j.kv, j.row_stride, static_cast<int64_t>(j.H) * d);  // a non-finite key, by name
          detail::fail("dense_attention: the scores of query token {} (query head {}) overflow the float range",
                       t, h * G + g);
        }
        std::fill(row + seen_b, row + kTileRows, kNegInf);
      }
      // The tile's softmax per query head, merged into the running state; then its value sums.
      float* acc = s.acc.data() + static_cast<size_t>(t - t0) * G * d;
      for (int g0 = 0; g0 < G;) {
        g0 += with_group(G - g0, [&](auto ng) {
          constexpr int NG = decltype(ng)::value;
          bool any = false;
          for (int g = g0; g < g0 + NG; ++g) {
            float* row = lg + static_cast<size_t>(g) * kTileRows;
            const size_t k = static_cast<size_t>(t - t0) * G + static_cast<size_t>(g);
            float mt = kNegInf, st = 0.f;
            K::softmax_row(row, kTileRows, &mt, &st);
            float b = 0.f;
            if (mt > kNegInf) {
              const MergeScales scales = s.run[k].add(mt, st, ExpE{});
              const float a = scales.running;
              b = scales.partial;
              float* ag = acc + static_cast<size_t>(g) * d;
              if (a != 1.f)
                for (int i = 0; i < d; ++i) ag[i] *= a;
              any = true;
            }
            for (int64_t r = 0; r < n; ++r) s.weights[static_cast<size_t>(r) * NG + static_cast<size_t>(g - g0)] = row[r] * b;
          }
          if (any)
            K::template accumulate_rows<NG>(f32, vrows, vstride, j.blocks, s.weights.data(), n,
                                            acc + static_cast<size_t>(g0) * d);
        });
      }
    }
  }
  for (int64_t t = t0; t < t1; ++t)
    for (int g = 0; g < G; ++g) {
      const size_t k = static_cast<size_t>(t - t0) * G + static_cast<size_t>(g);
      const size_t qh = static_cast<size_t>(h) * G + static_cast<size_t>(g);
      float* o = j.out + (static_cast<size_t>(t) * j.H * G + qh) * d;
      const float* a = s.acc.data() + k * d;
      if (!(s.run[k].sum > 0.f)) {
        std::fill(o, o + d, 0.f);
        if (j.lse) j.lse[static_cast<size_t>(t) * j.H * G + qh] = kNegInf;
        continue;
      }
      const float inv = 1.f / s.run[k].sum;
      for (int i = 0; i < d; ++i) o[i] = a[i] * inv;
      if (j.lse) j.lse[static_cast<size_t>(t) * j.H * G + qh] = s.run[k].max + std::log(s.run[k].sum);
    }
}

void check_rows_finite(const DenseRows& kv, int64_t row_stride, int64_t width) {
  for (int64_t r = 0; r < kv.n; ++r) {
    for (const void* base : {kv.keys, kv.values}) {
      if (kv.dtype == DType::kF16) {
        const auto* x = static_cast<const uint16_t*>(base) + r * row_stride;
        for (int64_t i = 0; i < width; ++i)
          if ((x[i] & 0x7C00u) == 0x7C00u)
            detail::fail("dense_attention: non-finite {} at row {}, element {}", base == kv.keys ? "key" : "value", r, i);
      } else {
        const auto* x = static_cast<const float*>(base) + r * row_stride;
        const size_t i = detail::first_non_finite(x, static_cast<size_t>(width));
        if (i < static_cast<size_t>(width))
          detail::fail("dense_attention: non-finite {} at row {}, element {}", base == kv.keys ? "key" : "value", r, i);
      }
    }
  }
}

}  // namespace

void dense_attention(const DenseRows& kv, const DenseShape& shape, const float* q, const int32_t* q_positions,
                     int64_t n_tokens, float* out, float* lse, const AttendOptions& options) {
  const int H = shape.n_kv_heads, Q = shape.n_q_heads, d = shape.head_dim;
  detail::require(H >= 1 && Q >= H && Q % H == 0, "dense_attention: n_q_heads {} must be a positive multiple of n_kv_heads {}",
                  Q, H);
  detail::require(d >= 8 && d <= 1024 && d % 8 == 0, "dense_attention: head_dim {} must be a multiple of 8 in [8, 1024]", d);
  detail::require(kv.dtype == DType::kF16 || kv.dtype == DType::kF32, "dense_attention: rows must be f16 or f32, got {}",
                  to_string(kv.dtype));
  detail::require(n_tokens >= 0 && kv.n >= 0, "dense_attention: negative counts (tokens {}, rows {})", n_tokens, kv.n);
  detail::require(shape.window >= 0, "dense_attention: window must be >= 0, got {}", shape.window);
  if (n_tokens == 0) return;
  detail::require(q != nullptr && q_positions != nullptr && out != nullptr, "dense_attention: q, q_positions and out must not be null");
  const int64_t width = static_cast<int64_t>(H) * d;
  const int64_t row_stride = kv.row_stride == 0 ? width : kv.row_stride;
  detail::require(row_stride >= width, "dense_attention: row_stride {} is below n_kv_heads·head_dim {}", row_stride, width);
  if (kv.n > 0) {
    detail::require(kv.keys != nullptr && kv.values != nullptr, "dense_attention: keys and values must not be null");
    for (int64_t r = 1; kv.positions != nullptr && r < kv.n; ++r)
      detail::require(kv.positions[r] > kv.positions[r - 1], "dense_attention: row positions must be strictly ascending "
                      "(row {}: {} after {})", r, kv.positions[r], kv.positions[r - 1]);
  }
  const size_t i = detail::first_non_finite(q, static_cast<size_t>(n_tokens) * Q * d);
  if (i < static_cast<size_t>(n_tokens) * Q * d)
    detail::fail("dense_attention: non-finite query value at token {}, query head {}, element {}",
                 i / (static_cast<size_t>(Q) * d), i / d % Q, i % d);
  Job j{&kv, H, Q / H, d, d / 8, shape.scale > 0.f ? shape.scale : 1.f / std::sqrt(static_cast<float>(d)), shape.window,
        row_stride, kv.dtype == DType::kF16 ? sizeof(uint16_t) : sizeof(float), q, q_positions, n_tokens, out, lse};
  const int64_t n_blocks = (n_tokens + kBlockTokens - 1) / kBlockTokens;
  run_tasks(options.executor, n_blocks * H, [&](int64_t item) {
    thread_local Scratch s;
#if E8KV_HOST_AVX2_DISPATCH
    if (cpu_has_avx2_fma()) return run_block<attention::kernels::KernelsAvx2Fma>(j, item / H, static_cast<int>(item % H), s);
#endif
    run_block<attention::kernels::KernelsPortable>(j, item / H, static_cast<int>(item % H), s);
  });
  // Rows are checked where they show: a non-finite key makes a non-finite score (refused above), a
  // non-finite value a non-finite output; only then are the rows searched, to name it. (A full
  // pass over every row on each call would cost a decode step as much as the attention itself.)
  const size_t n_out = static_cast<size_t>(n_tokens) * Q * d;
  if (detail::first_non_finite(out, n_out) < n_out) {
    check_rows_finite(kv, row_stride, width);
    detail::fail("dense_attention: a non-finite output from finite rows and queries");
  }
}

}  // namespace e8kv
