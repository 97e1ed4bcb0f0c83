// Compute kernels. The AVX2/FMA versions are compiled with a function-level target attribute
// so the rest of the build stays portable; dispatch checks the CPU once.
#include "kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "e8kv/error.hpp"
#include "e8kv/llama/model.hpp"
#include "e8kv/llama/thread_pool.hpp"

#if defined(__x86_64__) || defined(__i386__)
#define E8KV_LLAMA_X86 1
#include <immintrin.h>
#else
#define E8KV_LLAMA_X86 0
#endif

namespace e8kv::llama {

namespace {
std::atomic<bool> g_simd_enabled{true};
}

bool cpu_has_avx2_fma() {
#if E8KV_LLAMA_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

void set_simd_enabled(bool enabled) { g_simd_enabled = enabled; }
bool simd_enabled() { return g_simd_enabled.load() && cpu_has_avx2_fma(); }

// ---- packing ----------------------------------------------------------------------------

void PackedMatrix::row(int64_t out, float* dst) const {
  const float* p = panel(out / kPanel) + out % kPanel;
  for (int64_t k = 0; k < n_in; ++k) dst[k] = p[k * kPanel];
}

PackedMatrix pack_matrix(const float* w, int64_t n_out, int64_t n_in) {
  PackedMatrix m;
  m.n_out = n_out;
  m.n_in = n_in;
  m.data.assign(static_cast<size_t>(m.n_panels() * PackedMatrix::kPanel * n_in), 0.0f);
  for (int64_t o = 0; o < n_out; ++o) {
    float* p = m.data.data() + (o / PackedMatrix::kPanel) * PackedMatrix::kPanel * n_in + o % PackedMatrix::kPanel;
    const float* src = w + o * n_in;
    for (int64_t k = 0; k < n_in; ++k) p[k * PackedMatrix::kPanel] = src[k];
  }
  return m;
}

PackedMatrix pack_stacked(const std::vector<const std::vector<float>*>& blocks, int64_t n_in) {
  std::vector<float> all;
  for (const auto* b : blocks) all.insert(all.end(), b->begin(), b->end());
  return pack_matrix(all.data(), static_cast<int64_t>(all.size()) / n_in, n_in);
}

// ---- matrix product ---------------------------------------------------------------------

namespace {

constexpr int kMr = 6;       // rows of x per micro tile
constexpr int64_t kMc = 48;  // rows of x per task chunk (kept in L2 while panels stream)

inline void store_tile(const float* tile, int rows, float* y, int64_t ldy, int n_valid, bool accumulate) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < n_valid; ++c) {
      float& dst = y[r * ldy + c];
      dst = accumulate ? dst + tile[r * 16 + c] : tile[r * 16 + c];
    }
}

template <int MR>
void micro_scalar(const float* x, int64_t ldx, const float* panel, int64_t K, float* y, int64_t ldy, int n_valid,
                  bool accumulate) {
  float acc[MR][16] = {};
  for (int64_t k = 0; k < K; ++k) {
    const float* w = panel + k * 16;
    for (int r = 0; r < MR; ++r) {
      const float a = x[r * ldx + k];
      for (int c = 0; c < 16; ++c) acc[r][c] += a * w[c];
    }
  }
  store_tile(&acc[0][0], MR, y, ldy, n_valid, accumulate);
}

#if E8KV_LLAMA_X86
__attribute__((target("avx2,fma"))) inline void store_row_avx2(float* dst, __m256 lo, __m256 hi, int n_valid,
                                                               bool accumulate) {
  if (n_valid == 16) {
    if (accumulate) {
      lo = _mm256_add_ps(_mm256_loadu_ps(dst), lo);
      hi = _mm256_add_ps(_mm256_loadu_ps(dst + 8), hi);
    }
    _mm256_storeu_ps(dst, lo);
    _mm256_storeu_ps(dst + 8, hi);
    return;
  }
  alignas(32) float tile[16];
  _mm256_store_ps(tile, lo);
  _mm256_store_ps(tile + 8, hi);
  store_tile(tile, 1, dst, 0, n_valid, accumulate);
}

// MR rows of x times one 16-wide panel. The accumulators are named variables (not an array)
// so that they stay in registers: 12 accumulators + 2 weight vectors + 1 broadcast.
template <int MR>
__attribute__((target("avx2,fma"))) void micro_avx2(const float* x, int64_t ldx, const float* panel, int64_t K,
                                                    float* y, int64_t ldy, int n_valid, bool accumulate) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* x0 = x;
  const float* x1 = x + (MR > 1 ? ldx : 0);
  const float* x2 = x + (MR > 2 ? 2 * ldx : 0);
  const float* x3 = x + (MR > 3 ? 3 * ldx : 0);
  const float* x4 = x + (MR > 4 ? 4 * ldx : 0);
  const float* x5 = x + (MR > 5 ? 5 * ldx : 0);
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(panel + k * 16);
    const __m256 w1 = _mm256_loadu_ps(panel + k * 16 + 8);
#define E8KV_LLAMA_ROW(r)                           \
  if constexpr (MR > r) {                           \
    const __m256 a = _mm256_broadcast_ss(x##r + k); \
    c##r##0 = _mm256_fmadd_ps(a, w0, c##r##0);      \
    c##r##1 = _mm256_fmadd_ps(a, w1, c##r##1);      \
  }
    E8KV_LLAMA_ROW(0)
    E8KV_LLAMA_ROW(1)
    E8KV_LLAMA_ROW(2)
    E8KV_LLAMA_ROW(3)
    E8KV_LLAMA_ROW(4)
    E8KV_LLAMA_ROW(5)
#undef E8KV_LLAMA_ROW
  }
  store_row_avx2(y, c00, c01, n_valid, accumulate);
  if constexpr (MR > 1) store_row_avx2(y + ldy, c10, c11, n_valid, accumulate);
  if constexpr (MR > 2) store_row_avx2(y + 2 * ldy, c20, c21, n_valid, accumulate);
  if constexpr (MR > 3) store_row_avx2(y + 3 * ldy, c30, c31, n_valid, accumulate);
  if constexpr (MR > 4) store_row_avx2(y + 4 * ldy, c40, c41, n_valid, accumulate);
  if constexpr (MR > 5) store_row_avx2(y + 5 * ldy, c50, c51, n_valid, accumulate);
}
#endif

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int, bool);

MicroFn micro_for(int rows, bool simd) {
#if E8KV_LLAMA_X86
  if (simd) {
    static constexpr MicroFn t[kMr + 1] = {nullptr,       micro_avx2<1>, micro_avx2<2>, micro_avx2<3>,
                                           micro_avx2<4>, micro_avx2<5>, micro_avx2<6>};
    return t[rows];
  }
#endif
  (void)simd;
  static constexpr MicroFn t[kMr + 1] = {nullptr,         micro_scalar<1>, micro_scalar<2>, micro_scalar<3>,
                                         micro_scalar<4>, micro_scalar<5>, micro_scalar<6>};
  return t[rows];
}

}  // namespace

void matmul(const float* x, int64_t n, int64_t ldx, const PackedMatrix& w, float* y, int64_t ldy, bool accumulate,
            ThreadPool& pool) {
  if (n <= 0 || w.n_out == 0) return;
  const bool simd = simd_enabled();
  const int64_t n_panels = w.n_panels();
  const int64_t chunks = (n + kMc - 1) / kMc;
  // Enough tasks for dynamic balancing (~4 per thread); panels are split only when the row
  // chunks alone are too few (decode batches), so each panel is read once per chunk.
  const int64_t want_groups = std::clamp<int64_t>((4 * pool.size() + chunks - 1) / chunks, 1, n_panels);
  const int64_t group = (n_panels + want_groups - 1) / want_groups;
  const int64_t groups = (n_panels + group - 1) / group;
  pool.run(chunks * groups, [&](int64_t task, int) {
    const int64_t chunk = task / groups, g = task % groups;
    const int64_t row_begin = chunk * kMc, row_end = std::min(n, row_begin + kMc);
    const int64_t p_end = std::min(n_panels, (g + 1) * group);
    for (int64_t p = g * group; p < p_end; ++p) {
      const int n_valid = static_cast<int>(std::min<int64_t>(16, w.n_out - p * 16));
      for (int64_t r = row_begin; r < row_end; r += kMr) {
        const int rows = static_cast<int>(std::min<int64_t>(kMr, row_end - r));
        micro_for(rows, simd)(x + r * ldx, ldx, w.panel(p), w.n_in, y + r * ldy + p * 16, ldy, n_valid, accumulate);
      }
    }
  });
}

// ---- element-wise ----------------------------------------------------------------------

namespace {

#if E8KV_LLAMA_X86
// exp(x) for x in [-87, 88]: x = n·ln2 + r with |r| <= ln2/2, exp(r) by a degree-7 polynomial
// (Cephes expf coefficients), 2^n through the exponent bits. Relative error ~2e-7.
__attribute__((target("avx2,fma"))) inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

__attribute__((target("avx2,fma"))) void swiglu_avx2(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp256(_mm256_sub_ps(zero, gv));
    _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_mul_ps(gv, _mm256_loadu_ps(u + i)), _mm256_add_ps(one, e)));
  }
  for (; i < n; ++i) out[i] = g[i] * u[i] / (1.0f + std::exp(-g[i]));
}
#endif

}  // namespace

void rms_norm(const float* x, const float* w, int64_t n, double eps, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
#if E8KV_LLAMA_X86
  if (simd_enabled()) {
    swiglu_avx2(gate, up, n, out);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * up[i] / (1.0f + std::exp(-gate[i]));
}

}  // namespace e8kv::llama
