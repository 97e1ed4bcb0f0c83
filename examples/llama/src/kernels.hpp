// Internal compute kernels of the engine (not installed): packed matrix product, RMSNorm and
// SwiGLU, each with an AVX2/FMA version chosen at run time and a portable version. Attention is
// the library's (e8kv::dense_attention, e8kv::attend).
#pragma once

#include <cstdint>
#include <vector>

namespace e8kv::llama {

class ThreadPool;

/// A weight matrix W [n_out][n_in] stored in panels of 16 output rows, k-major inside a panel
/// (panel p, input k -> 16 contiguous floats), zero-padded to a multiple of 16 rows.
struct PackedMatrix {
  static constexpr int kPanel = 16;
  int64_t n_out = 0, n_in = 0;
  std::vector<float> data;
  int64_t n_panels() const { return (n_out + kPanel - 1) / kPanel; }
  const float* panel(int64_t p) const { return data.data() + p * kPanel * n_in; }
  float at(int64_t out, int64_t in) const { return data[(out / kPanel) * kPanel * n_in + in * kPanel + out % kPanel]; }
  void row(int64_t out, float* dst) const;
};

/// Packs row-major rows: w [n_out][n_in].
PackedMatrix pack_matrix(const float* w, int64_t n_out, int64_t n_in);
/// Packs several row blocks stacked (e.g. Q, K and V weights into one matrix).
PackedMatrix pack_stacked(const std::vector<const std::vector<float>*>& blocks, int64_t n_in);

/// y[i][o] (+)= sum_k x[i][k] * W[o][k] for i < n; x rows ldx apart, y rows ldy apart.
void matmul(const float* x, int64_t n, int64_t ldx, const PackedMatrix& w, float* y, int64_t ldy, bool accumulate,
            ThreadPool& pool);

/// y = x / sqrt(mean(x^2) + eps) * w over n elements (sum of squares in fp64).
void rms_norm(const float* x, const float* w, int64_t n, double eps, float* y);

/// out[i] = silu(gate[i]) * up[i].
void swiglu(const float* gate, const float* up, int64_t n, float* out);

bool cpu_has_avx2_fma();

}  // namespace e8kv::llama
