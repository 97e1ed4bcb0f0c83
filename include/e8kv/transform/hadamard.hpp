// Orthonormal fast Walsh-Hadamard transform (FWHT) and the randomized Hadamard rotation
// y = H·D·x/√d that spreads outliers before lattice quantization.
//
// Supported dimensions and the Hadamard matrix used for each (H_D = H_m ⊗ H_p, p = 2^k):
//
//   d    factorization   small factor H_m
//   32   H32             -
//   64   H64             -
//   80   H20 ⊗ H4        Paley I, q = 19
//   96   H12 ⊗ H8        Paley I, q = 11
//   112  H28 ⊗ H4        Paley II, q = 13
//   128  H128            -
//   160  H20 ⊗ H8        Paley I, q = 19
//   192  H12 ⊗ H16       Paley I, q = 11
//   256  H256            -
//   512  H512            -
//
// H_p is Sylvester's matrix, H_p[i][j] = (-1)^popcount(i & j) (symmetric). The Paley I factors
// are not symmetric, so the inverse uses the transpose: H_D^{-1} = H_m^T ⊗ H_p / d.
// A coordinate index i of a d-vector splits as i = a·p + b, a ∈ [0, m), b ∈ [0, p), so
// (H_m ⊗ H_p)[a·p + b][a'·p + b'] = H_m[a][a'] · H_p[b][b'].
//
// Operation order (fixed, so any implementation that follows it matches bit for bit):
//   1. signs (randomized transform only): coordinate i is negated when sign bit i is set;
//   2. radix-2 butterflies (u, v) -> (u + v, u - v) on each length-p chunk, lowest index bit
//      first (stride 1, 2, 4, ...);
//   3. when m > 1, the dense m-point step: out[a] = ±in[0] ± in[1] ... ± in[m-1], summed in
//      increasing order of the input index, for every b;
//   4. multiply every coordinate by float(1/√d).
// The inverse runs 2 (same butterflies), 3 (with H_m^T), 4, then 1.
//
// Non-finite input follows IEEE arithmetic: a NaN or ±Inf coordinate spreads to every output
// coordinate (as NaN or ±Inf); finite inputs near FLT_MAX may overflow to ±Inf. No UB.
//
// Sign mask: d bits packed little-endian into ceil(d/32) uint32 words (bit i of the mask is bit
// i % 32 of word i / 32; bits past d are zero). They come from splitmix64 seeded with `seed`:
// output j fills words 2j (low half) and 2j+1 (high half).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/fp.hpp"

// The lowest two butterfly stages use SSE2 on x86 hosts (see fwht_pass); every other stage is
// plain code that compilers vectorize. Define E8KV_HADAMARD_SSE2=0 to force the scalar code.
#ifndef E8KV_HADAMARD_SSE2
#if !E8KV_ON_DEVICE && (defined(__SSE2__) || defined(_M_X64))
#define E8KV_HADAMARD_SSE2 1
#else
#define E8KV_HADAMARD_SSE2 0
#endif
#endif
#if E8KV_HADAMARD_SSE2
#include <emmintrin.h>
#endif

namespace e8kv::transform {

/// True for the head dimensions the FWHT supports (see the table above).
E8KV_HD constexpr bool is_supported_hadamard_dim(int d) {
  switch (d) {
    case 32: case 64: case 80: case 96: case 112: case 128: case 160: case 192: case 256: case 512:
      return true;
    default:
      return false;
  }
}

/// The supported dimensions as text, for error messages: "32, 64, 80, ...".
inline std::string supported_hadamard_dims() {
  return "32, 64, 80, 96, 112, 128, 160, 192, 256, 512";
}

/// The small non-power-of-two factor m of d = m·2^k (1 for powers of two, 0 when unsupported).
E8KV_HD constexpr int hadamard_small_factor(int d) {
  switch (d) {
    case 80: case 160: return 20;
    case 96: case 192: return 12;
    case 112: return 28;
    default: return is_supported_hadamard_dim(d) ? 1 : 0;
  }
}

/// Number of uint32 words of a packed d-bit sign mask.
E8KV_HD constexpr int hadamard_sign_words(int d) { return d <= 0 ? 0 : (d + 31) / 32; }

namespace detail {

/// splitmix64 (Steele, Lea & Flood 2014; standard constants): advances `state`, returns 64 bits.
E8KV_HD constexpr uint64_t splitmix64(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Bit v set when v is a nonzero square modulo the prime q (q < 32).
E8KV_HD constexpr uint32_t quadratic_residue_mask(int q) {
  uint32_t mask = 0;
  for (int v = 1; v < q; ++v) mask |= 1u << ((v * v) % q);
  return mask;
}

/// Legendre symbol of v modulo q as "is it -1", for 0 < |v| < q: true when v mod q is a
/// non-residue. (v == 0 never reaches here: the constructions handle the diagonal themselves.)
E8KV_HD constexpr bool legendre_is_negative(int v, int q, uint32_t residues) {
  const int r = v < 0 ? v + q : v;
  return ((residues >> r) & 1u) == 0;
}

/// Paley construction I, q ≡ 3 (mod 4), order q + 1: H = I + S with the skew conference
/// matrix S = [[0, 1ᵀ], [-1, Q]], Q[i][j] = χ(j - i).
E8KV_HD constexpr bool paley1_negative(int q, uint32_t residues, int row, int col) {
  if (row == 0) return false;         // first row: all +1
  if (col == 0) return true;          // first column below the corner: -1
  if (row == col) return false;       // I contributes +1 where Q is 0
  return legendre_is_negative(col - row, q, residues);
}

/// Paley construction II, q ≡ 1 (mod 4), order 2(q + 1): H = C ⊗ [[1,-1],[-1,-1]] + I ⊗ [[1,1],[1,-1]]
/// with the symmetric conference matrix C = [[0, 1ᵀ], [1, Q]], Q[i][j] = χ(j - i).
E8KV_HD constexpr bool paley2_negative(int q, uint32_t residues, int row, int col) {
  const int r = row >> 1, c = col >> 1, s = row & 1, t = col & 1;
  if (r == c) return (s & t) != 0;    // [[1,1],[1,-1]]
  const bool conference_negative = (r != 0 && c != 0) && legendre_is_negative(c - r, q, residues);
  const bool block_negative = (s | t) != 0;  // [[1,-1],[-1,-1]]
  return conference_negative != block_negative;
}

}  // namespace detail

/// Entry (row, col) of the small Hadamard factor H_m, m ∈ {1, 12, 20, 28}: true when it is -1.
/// H12: Paley I (q = 11); H20: Paley I (q = 19); H28: Paley II (q = 13). Out of range: false.
E8KV_HD constexpr bool small_hadamard_negative(int m, int row, int col) {
  if (row < 0 || col < 0 || row >= m || col >= m) return false;
  switch (m) {
    case 12: {
      constexpr uint32_t residues = detail::quadratic_residue_mask(11);
      return detail::paley1_negative(11, residues, row, col);
    }
    case 20: {
      constexpr uint32_t residues = detail::quadratic_residue_mask(19);
      return detail::paley1_negative(19, residues, row, col);
    }
    case 28: {
      constexpr uint32_t residues = detail::quadratic_residue_mask(13);
      return detail::paley2_negative(13, residues, row, col);
    }
    default:
      return false;  // H1 = [1]
  }
}

/// Fills `words` (hadamard_sign_words(d) of them) with the sign mask for (d, seed).
E8KV_HD inline void make_hadamard_sign_bits(int d, uint64_t seed, uint32_t* words) {
  const int n_words = hadamard_sign_words(d);
  uint64_t state = seed;
  for (int w = 0; w < n_words; w += 2) {
    const uint64_t r = detail::splitmix64(state);
    words[w] = static_cast<uint32_t>(r);
    if (w + 1 < n_words) words[w + 1] = static_cast<uint32_t>(r >> 32);
  }
  if (d % 32 != 0 && n_words > 0) words[n_words - 1] &= (1u << (d % 32)) - 1u;
}

namespace detail {

/// float(1/√d) via Newton's iteration in double (constexpr, so it is folded at compile time).
E8KV_HD constexpr float inverse_sqrt_dim(int d) {
  double s = d > 1 ? static_cast<double>(d) : 1.0;
  for (int it = 0; it < 64; ++it) s = 0.5 * (s + static_cast<double>(d) / s);
  return static_cast<float>(1.0 / s);
}

/// One pass of the Sylvester FWHT of length P over index bits log2(H) and log2(H)+1 (a
/// radix-4 pass: exactly the operations of two radix-2 stages), or over bit log2(H) alone
/// when 2H == P. H is a compile-time constant so the compiler knows the distances between
/// the streams and vectorizes over j without aliasing checks. When Scaled, the final pass
/// multiplies its outputs by `scale` (the same operations as a separate scaling pass).
template <int P, int H, bool Scaled, bool Portable>
E8KV_HD E8KV_FORCE_INLINE void fwht_pass(float* x, float scale) {
#if E8KV_HADAMARD_SSE2
  if constexpr (H == 1 && !Portable) {
    // Bits 0 and 1 live inside one 4-float register: (u, v) -> (v + u, u + (-v)) via a swap
    // and a sign flip, twice. a + b == b + a and a + (-b) == a - b exactly, so this is the same
    // arithmetic as the scalar code; compilers only manage it with many more shuffles.
    const __m128 neg_odd = _mm_castsi128_ps(_mm_set_epi32(INT32_MIN, 0, INT32_MIN, 0));
    const __m128 neg_high = _mm_castsi128_ps(_mm_set_epi32(INT32_MIN, INT32_MIN, 0, 0));
    for (int g = 0; g < P; g += 4) {
      const __m128 a = _mm_loadu_ps(x + g);
      const __m128 b = _mm_add_ps(_mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 3, 0, 1)), _mm_xor_ps(a, neg_odd));
      __m128 c = _mm_add_ps(_mm_shuffle_ps(b, b, _MM_SHUFFLE(1, 0, 3, 2)), _mm_xor_ps(b, neg_high));
      if constexpr (Scaled && P == 4) c = _mm_mul_ps(c, _mm_set1_ps(scale));
      _mm_storeu_ps(x + g, c);
    }
    if constexpr (P > 4) fwht_pass<P, 4, Scaled, Portable>(x, scale);
    return;
  }
#endif
  if constexpr (4 * H <= P) {
    constexpr bool kLast = 4 * H == P;
    for (int g = 0; g < P; g += 4 * H) {
      for (int j = g; j < g + H; ++j) {
        const float s01 = x[j] + x[j + H], d01 = x[j] - x[j + H];
        const float s23 = x[j + 2 * H] + x[j + 3 * H], d23 = x[j + 2 * H] - x[j + 3 * H];
        float y0 = s01 + s23, y1 = d01 + d23, y2 = s01 - s23, y3 = d01 - d23;
        if (Scaled && kLast) {
          y0 = fp::mul(y0, scale);
          y1 = fp::mul(y1, scale);
          y2 = fp::mul(y2, scale);
          y3 = fp::mul(y3, scale);
        }
        x[j] = y0;
        x[j + H] = y1;
        x[j + 2 * H] = y2;
        x[j + 3 * H] = y3;
      }
    }
    fwht_pass<P, 4 * H, Scaled, Portable>(x, scale);
  } else if constexpr (2 * H <= P) {
    for (int j = 0; j < H; ++j) {
      const float u = x[j], v = x[j + H];
      float y0 = u + v, y1 = u - v;
      if (Scaled) {
        y0 = fp::mul(y0, scale);
        y1 = fp::mul(y1, scale);
      }
      x[j] = y0;
      x[j + H] = y1;
    }
  }
}

/// Sylvester FWHT of length P in place, lowest index bit first; outputs times `scale` when Scaled.
/// Portable selects the plain-C++ code everywhere (what device code runs; tests compare both).
template <int P, bool Scaled, bool Portable>
E8KV_HD E8KV_FORCE_INLINE void fwht_pow2(float* x, float scale) {
  static_assert(P >= 4 && (P & (P - 1)) == 0, "P must be a power of two >= 4");
  fwht_pass<P, 1, Scaled, Portable>(x, scale);
}

/// Entry (A, C) of H_M, or of H_M^T when Transpose, as a compile-time "is it -1".
template <int M, bool Transpose, int A, int C>
inline constexpr bool kSmallNegative =
    Transpose ? small_hadamard_negative(M, C, A) : small_hadamard_negative(M, A, C);

/// acc (+|-)= in[C·P + b] for every b; the sign is a compile-time constant.
template <int M, int P, bool Transpose, int A, int C>
E8KV_HD E8KV_FORCE_INLINE void small_hadamard_term(float* acc, const float* in) {
  const float* i = in + C * P;
  if constexpr (C == 0) {
    for (int b = 0; b < P; ++b) acc[b] = kSmallNegative<M, Transpose, A, 0> ? -i[b] : i[b];
  } else if constexpr (kSmallNegative<M, Transpose, A, C>) {
    for (int b = 0; b < P; ++b) acc[b] = acc[b] - i[b];
  } else {
    for (int b = 0; b < P; ++b) acc[b] = acc[b] + i[b];
  }
}

/// Output row A of the dense step; the comma fold runs the terms in order C = 0, 1, ..., M-1.
template <int M, int P, bool Transpose, int A, int... C>
E8KV_HD E8KV_FORCE_INLINE void small_hadamard_row(const float* in, float* out, float scale,
                                                  std::integer_sequence<int, C...>) {
  float acc[P];
  (small_hadamard_term<M, P, Transpose, A, C>(acc, in), ...);
  for (int b = 0; b < P; ++b) out[A * P + b] = fp::mul(acc[b], scale);
}

template <int M, int P, bool Transpose, int... A>
E8KV_HD E8KV_FORCE_INLINE void small_hadamard_rows(const float* in, float* out, float scale,
                                                   std::integer_sequence<int, A...>) {
  (small_hadamard_row<M, P, Transpose, A>(in, out, scale, std::make_integer_sequence<int, M>{}), ...);
}

/// out[a·P + b] = scale · Σ_c H_M[a][c] · in[c·P + b] (H_M[c][a] when Transpose), summed in
/// c order starting from ±in[b]. Signs are compile-time constants (additions and subtractions
/// only), fully unrolled over (a, c), vectorized over b.
template <int M, int P, bool Transpose>
E8KV_HD E8KV_FORCE_INLINE void small_hadamard_step(const float* in, float* out, float scale) {
  small_hadamard_rows<M, P, Transpose>(in, out, scale, std::make_integer_sequence<int, M>{});
}

/// H_D·x/√D (or H_D^T·x/√D) in place, D supported.
template <int D, bool Transpose, bool Portable = false>
E8KV_HD E8KV_FORCE_INLINE void hadamard_orthonormal(float* x) {
  static_assert(is_supported_hadamard_dim(D), "unsupported Hadamard dimension");
  constexpr int M = hadamard_small_factor(D);
  constexpr int P = D / M;
  constexpr float scale = inverse_sqrt_dim(D);
  if constexpr (M > 1) {
    float tmp[D];
    for (int i = 0; i < D; ++i) tmp[i] = x[i];
    for (int a = 0; a < M; ++a) fwht_pow2<P, false, Portable>(tmp + a * P, 1.0f);
    small_hadamard_step<M, P, Transpose>(tmp, x, scale);
  } else {
    fwht_pow2<P, true, Portable>(x, scale);
  }
}

E8KV_HD E8KV_FORCE_INLINE void apply_sign_bits(int d, const uint32_t* sign_bits, float* x) {
  for (int i = 0; i < d; ++i)
    if ((sign_bits[i >> 5] >> (i & 31)) & 1u) x[i] = -x[i];
}

}  // namespace detail

/// Orthonormal FWHT in place: x <- H_D·x/√D, with H_D as in the table above.
template <int D>
E8KV_HD inline void fwht_orthonormal(float* x) {
  detail::hadamard_orthonormal<D, false>(x);
}

/// Its inverse in place: x <- H_D^T·x/√D.
template <int D>
E8KV_HD inline void fwht_orthonormal_inverse(float* x) {
  detail::hadamard_orthonormal<D, true>(x);
}

// Closed runtime -> compile-time dispatch over the supported dims (undefined at the end).
#define E8KV_HADAMARD_DISPATCH_CASES(CASE) \
  CASE(32) CASE(64) CASE(80) CASE(96) CASE(112) CASE(128) CASE(160) CASE(192) CASE(256) CASE(512)

/// Device-usable randomized forward transform in place: x <- H·D·x/√d, D from sign_bits
/// (hadamard_sign_words(d) words). Returns false and leaves x untouched when d is unsupported.
E8KV_HD inline bool randomized_hadamard_forward(int d, const uint32_t* sign_bits, float* x) {
  if (!is_supported_hadamard_dim(d)) return false;
  detail::apply_sign_bits(d, sign_bits, x);
  switch (d) {
#define E8KV_HADAMARD_CASE(N) \
  case N: fwht_orthonormal<N>(x); break;
    E8KV_HADAMARD_DISPATCH_CASES(E8KV_HADAMARD_CASE)
#undef E8KV_HADAMARD_CASE
    default: break;
  }
  return true;
}

/// Device-usable exact inverse in place: y <- D·H^T·y/√d. Returns false for unsupported d.
E8KV_HD inline bool randomized_hadamard_inverse(int d, const uint32_t* sign_bits, float* y) {
  if (!is_supported_hadamard_dim(d)) return false;
  switch (d) {
#define E8KV_HADAMARD_CASE(N) \
  case N: fwht_orthonormal_inverse<N>(y); break;
    E8KV_HADAMARD_DISPATCH_CASES(E8KV_HADAMARD_CASE)
#undef E8KV_HADAMARD_CASE
    default: break;
  }
  detail::apply_sign_bits(d, sign_bits, y);
  return true;
}

/// Randomized Hadamard rotation of one dimension with a seeded sign diagonal. Host API.
/// Every transform may run in place (input == output); otherwise input and output must not
/// overlap. Batches address vector v at pointer + v·stride (stride in floats, >= dim).
class RandomizedHadamard {
 public:
  /// Throws e8kv::Error naming the supported dimensions when dim is not one of them.
  RandomizedHadamard(int dim, uint64_t seed) : dim_(dim), seed_(seed) {
    require(is_supported_hadamard_dim(dim), "RandomizedHadamard: dim = " + std::to_string(dim) +
                                                " is not supported; supported dims: " + supported_hadamard_dims());
    bits_.assign(static_cast<size_t>(hadamard_sign_words(dim)), 0u);
    make_hadamard_sign_bits(dim, seed, bits_.data());
    multipliers_.resize(static_cast<size_t>(dim));
    for (int i = 0; i < dim; ++i) multipliers_[static_cast<size_t>(i)] = negates(i) ? -1.0f : 1.0f;
  }

  int dim() const noexcept { return dim_; }
  uint64_t seed() const noexcept { return seed_; }
  /// The sign mask: hadamard_sign_words(dim()) words; bit i set = coordinate i is negated.
  const uint32_t* sign_bits() const noexcept { return bits_.data(); }
  size_t sign_word_count() const noexcept { return bits_.size(); }
  /// True when coordinate i is negated by D (false for i outside [0, dim())).
  bool negates(int i) const noexcept {
    if (i < 0 || i >= dim_) return false;
    return (bits_[static_cast<size_t>(i >> 5)] >> (i & 31)) & 1u;
  }

  /// y = H·D·x/√d. x == y is allowed.
  void forward(const float* x, float* y) const { forward_batch(x, y, 1, static_cast<size_t>(dim_)); }
  /// x = D·H^T·y/√d, the exact inverse of forward up to float rounding. y == x is allowed.
  void inverse(const float* y, float* x) const { inverse_batch(y, x, 1, static_cast<size_t>(dim_)); }

  /// forward on n vectors: vector v is x + v·stride -> y + v·stride.
  void forward_batch(const float* x, float* y, size_t n, size_t stride) const;
  /// inverse on n vectors: vector v is y + v·stride -> x + v·stride.
  void inverse_batch(const float* y, float* x, size_t n, size_t stride) const;

 private:
  // Defined in src/transform/hadamard.cpp: the batch loop is instantiated for every supported
  // dim, direction and ISA (40 fully unrolled bodies), compiled once in the library instead of
  // in every file that rotates vectors. The inline E8KV_HD functions above stay for device code.
  void check_batch(const char* what, const float* in, const float* out, size_t n, size_t stride) const;

  int dim_;
  uint64_t seed_;
  std::vector<uint32_t> bits_;
  std::vector<float> multipliers_;  // ±1 per coordinate: the vectorizable form of bits_
};

}  // namespace e8kv::transform

#undef E8KV_HADAMARD_DISPATCH_CASES
