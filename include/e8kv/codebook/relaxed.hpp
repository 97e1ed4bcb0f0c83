// NexusQuant's "relaxed parity" E8 quantizer, reproduced faithfully as a COMPARISON codec only
// (jagmarques/nexusquant, nexusquant/core/e8_lattice.py; see shared/research/nexusquant.md §2).
//
// What the reference code does, per 8-block x:
//   integer candidate  r = round(x) (half to even, as torch.round). If Σr is odd, ONE coordinate
//                      is moved by ±1 toward x — the one with the SMALLEST |x - r| (argmin, first
//                      index on ties; direction +1 when x - r >= 0). Conway–Sloane move the LARGEST
//                      |x - r| (argmax); the argmin is a bug and is reproduced here on purpose
//                      (RelaxedRepair::kArgminAsWritten). kArgmaxCorrect gives the corrected variant.
//   half candidate     h = round(x - ½) + ½ with NO parity repair: the reference's check
//                      round(2·Σh) odd can never fire (Σh is an integer), so h ranges over all of
//                      (Z+½)^8, including the odd-sum points that are not in E8.
//   choice             h if ‖x-h‖² < ‖x-r‖² (strict; a tie keeps the integer candidate).
// The output set is D8 ∪ (Z^8+½): not a lattice (not closed under addition), 1.5x the density of E8,
// and without a fixed-rate index. Its rate is measured as the empirical entropy of its symbols.
//
// Scaling (E8Lattice.quantize / quantize_perhead): amax = max(max|x|, 1e-8) over the scaling group,
// sc = amax / (levels/2), lp = clamp(nearest(x/sc), -levels/2, levels/2), output lp·sc.
//   RelaxedScaling::kPerGroupOf8  one amax per 8 consecutive elements (quantize)
//   RelaxedScaling::kPerVector    one amax per vector of `dim` elements (quantize_perhead)
// The vector is zero-padded to a multiple of 8 before the 8-blocks are formed; padded coordinates
// are dropped from the output. Clamping can leave a block off the point set (a half-integer 2.5
// clamped to 2 gives a "mixed" block); that is the reference's behaviour too.
//
// Codes: code = 2·lp, an integer in [-levels, levels] (2·levels + 1 symbols), one int16 per element.
// Scales are floats here, as in the reference's arithmetic; byte accounting that stores them as
// fp16 adds 16 bits per scale (RelaxedEntropy::scale_bits).
//
// Arithmetic is float32 in index order, unfused, as the reference's float32 torch code up to the
// summation order of the two squared distances (which only matters at exact ties).
// Non-finite input (not handled by the reference): NaN is treated as 0, ±Inf and |x| > 65504 are
// clamped to ±65504 before scaling.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook {

enum class RelaxedRepair {
  kArgminAsWritten,  ///< the reference code: moves the coordinate of SMALLEST rounding error (bug)
  kArgmaxCorrect,    ///< Conway–Sloane: moves the coordinate of LARGEST rounding error
};

enum class RelaxedScaling {
  kPerGroupOf8,  ///< E8Lattice.quantize: one amax scale per 8 elements
  kPerVector,    ///< E8Lattice.quantize_perhead: one amax scale per vector
};

/// Largest accepted input magnitude; larger values and ±Inf are clamped to it, NaN becomes 0.
inline constexpr float kRelaxedMaxAbs = 65504.0f;

/// The integer candidate of the reference quantizer, as integers: round half to even, then, if the
/// sum is odd, one coordinate moved by ±1 toward x, chosen by `repair` (first index on ties).
E8KV_HD inline void relaxed_integer_candidate(const float x[8], int32_t r[8],
                                              RelaxedRepair repair = RelaxedRepair::kArgminAsWritten) {
  int32_t sum = 0;
  int pick = 0;
  float pick_gap = 0.0f;
  for (int i = 0; i < 8; ++i) {
    const float ri = fp::round_half_even(x[i]);
    r[i] = static_cast<int32_t>(ri);
    sum += r[i];
    const float d = x[i] - ri;
    const float gap = d < 0.0f ? -d : d;
    const bool better = repair == RelaxedRepair::kArgminAsWritten ? gap < pick_gap : gap > pick_gap;
    if (i == 0 || better) {  // strict: the first index wins a tie (torch argmin / argmax)
      pick = i;
      pick_gap = gap;
    }
  }
  if (sum & 1) r[pick] += (x[pick] - static_cast<float>(r[pick]) >= 0.0f) ? 1 : -1;
}

/// Nearest point of the reference quantizer (before scaling and clamping), written as twice its
/// coordinates: all even (integer coset, even sum) or all odd (half coset, any sum). x must be
/// finite with |x| <= 2^20 (the scaled path guarantees it). Returns the coset: 0 integer, 1 half.
E8KV_HD inline int relaxed_nearest_twice(const float x[8], int32_t twice[8],
                                         RelaxedRepair repair = RelaxedRepair::kArgminAsWritten) {
  int32_t r[8];
  relaxed_integer_candidate(x, r, repair);
  int32_t h[8];  // h = round(x - ½) as integers; the candidate is h + ½
  float d_int = 0.0f, d_half = 0.0f;
  for (int i = 0; i < 8; ++i) {
    h[i] = static_cast<int32_t>(fp::round_half_even(x[i] - 0.5f));
    const float ei = x[i] - static_cast<float>(r[i]);
    const float eh = x[i] - (static_cast<float>(h[i]) + 0.5f);
    d_int = fp::add(d_int, fp::mul(ei, ei));
    d_half = fp::add(d_half, fp::mul(eh, eh));
  }
  const bool half = d_half < d_int;
  for (int i = 0; i < 8; ++i) twice[i] = half ? 2 * h[i] + 1 : 2 * r[i];
  return half ? 1 : 0;
}

/// Same point as floats.
E8KV_HD inline int relaxed_nearest(const float x[8], float y[8], RelaxedRepair repair = RelaxedRepair::kArgminAsWritten) {
  int32_t t[8];
  const int coset = relaxed_nearest_twice(x, t, repair);
  for (int i = 0; i < 8; ++i) y[i] = static_cast<float>(t[i]) * 0.5f;
  return coset;
}

/// True when twice[] (twice the coordinates) is a point of D8 ∪ (Z^8+½): all even with an even
/// coordinate sum, or all odd (any sum).
E8KV_HD inline bool is_relaxed_point_twice(const int32_t twice[8]) {
  const int32_t p0 = twice[0] & 1;
  int64_t s = 0;
  for (int i = 0; i < 8; ++i) {
    if ((twice[i] & 1) != p0) return false;
    s += twice[i];
  }
  return p0 == 1 || (s % 4) == 0;
}

/// Number of scales relaxed_encode writes for one vector of `dim` elements.
E8KV_HD constexpr int relaxed_scale_count(int dim, RelaxedScaling scaling) {
  return dim <= 0 ? 0 : (scaling == RelaxedScaling::kPerVector ? 1 : (dim + 7) / 8);
}

/// Quantizes one vector x[0..dim) as the reference does, writing dim codes (2·lp, in
/// [-levels, levels]) and relaxed_scale_count(dim, scaling) scales (sc). levels in [2, 16384]
/// (validated by the host wrappers; here it is clamped into that range). dim <= 0 writes nothing.
E8KV_HD inline void relaxed_encode(const float* x, int dim, int levels, RelaxedScaling scaling, RelaxedRepair repair,
                                   int16_t* codes, float* scales) {
  if (dim <= 0) return;
  levels = levels < 2 ? 2 : (levels > 16384 ? 16384 : levels);
  const float half_levels = static_cast<float>(levels) * 0.5f;  // levels / 2 (exact)
  const int blocks = (dim + 7) / 8;
  float sc = 0.0f;
  if (scaling == RelaxedScaling::kPerVector) {
    float amax = 0.0f;
    for (int i = 0; i < dim; ++i) {
      const float v = fp::sanitize(x[i], kRelaxedMaxAbs);
      const float a = v < 0.0f ? -v : v;
      amax = a > amax ? a : amax;
    }
    amax = amax > 1e-8f ? amax : 1e-8f;
    sc = amax / half_levels;
    scales[0] = sc;
  }
  for (int b = 0; b < blocks; ++b) {
    const int n = dim - 8 * b < 8 ? dim - 8 * b : 8;
    float v[8];
    for (int i = 0; i < 8; ++i) v[i] = i < n ? fp::sanitize(x[8 * b + i], kRelaxedMaxAbs) : 0.0f;
    if (scaling == RelaxedScaling::kPerGroupOf8) {
      float amax = 0.0f;
      for (int i = 0; i < 8; ++i) amax = (v[i] < 0.0f ? -v[i] : v[i]) > amax ? (v[i] < 0.0f ? -v[i] : v[i]) : amax;
      amax = amax > 1e-8f ? amax : 1e-8f;
      sc = amax / half_levels;
      scales[b] = sc;
    }
    float s[8];
    for (int i = 0; i < 8; ++i) s[i] = v[i] / sc;
    int32_t t[8];
    relaxed_nearest_twice(s, t, repair);
    for (int i = 0; i < n; ++i) {
      const int32_t c = t[i] > levels ? levels : (t[i] < -levels ? -levels : t[i]);  // clamp ±levels/2
      codes[8 * b + i] = static_cast<int16_t>(c);
    }
  }
}

/// Reconstructs y[0..dim) = (code/2)·sc from relaxed_encode's codes and scales.
E8KV_HD inline void relaxed_decode(const int16_t* codes, const float* scales, int dim, RelaxedScaling scaling,
                                   float* y) {
  for (int i = 0; i < dim; ++i) {
    const float sc = scaling == RelaxedScaling::kPerVector ? scales[0] : scales[i / 8];
    y[i] = fp::mul(static_cast<float>(codes[i]) * 0.5f, sc);
  }
}

// ---- host API ----------------------------------------------------------------------------------

struct RelaxedOptions {
  int levels = 8;  ///< 4 = NexusQuant's "2-bit", 8 = "3-bit", 16 = "4-bit"
  RelaxedScaling scaling = RelaxedScaling::kPerVector;
  RelaxedRepair repair = RelaxedRepair::kArgminAsWritten;
};

/// Codes and scales of `vectors` vectors of `dim` elements (row-major).
struct RelaxedCodes {
  int dim = 0;
  size_t vectors = 0;
  RelaxedOptions options;
  std::vector<int16_t> codes;  ///< vectors·dim, each 2·lp in [-levels, levels]
  std::vector<float> scales;   ///< vectors·relaxed_scale_count(dim, scaling)
};

namespace detail {
inline void relaxed_check(const char* fn, size_t vectors, int dim, const RelaxedOptions& o) {
  const std::string f(fn);
  require(dim >= 1, f + ": dim must be >= 1, got " + std::to_string(dim));
  require(o.levels >= 2 && o.levels <= 16384, f + ": levels must be in [2, 16384], got " + std::to_string(o.levels));
  (void)vectors;
}
}  // namespace detail

/// Quantizes x [vectors, dim] with the reference quantizer. Throws e8kv::Error on dim < 1,
/// levels outside [2, 16384] or a null x with vectors > 0.
inline RelaxedCodes relaxed_quantize(const float* x, size_t vectors, int dim, const RelaxedOptions& options = {}) {
  detail::relaxed_check("relaxed_quantize", vectors, dim, options);
  require(vectors == 0 || x != nullptr, "relaxed_quantize: x must be non-null");
  RelaxedCodes c;
  c.dim = dim;
  c.vectors = vectors;
  c.options = options;
  const size_t per = static_cast<size_t>(relaxed_scale_count(dim, options.scaling));
  c.codes.resize(vectors * dim);
  c.scales.resize(vectors * per);
  for (size_t v = 0; v < vectors; ++v)
    relaxed_encode(x + v * dim, dim, options.levels, options.scaling, options.repair, &c.codes[v * dim],
                   &c.scales[v * per]);
  return c;
}

/// Reconstructs [vectors, dim] floats into out.
inline void relaxed_dequantize(const RelaxedCodes& c, float* out) {
  detail::relaxed_check("relaxed_dequantize", c.vectors, c.dim, c.options);
  const size_t per = static_cast<size_t>(relaxed_scale_count(c.dim, c.options.scaling));
  require(c.codes.size() == c.vectors * c.dim && c.scales.size() == c.vectors * per,
          "relaxed_dequantize: buffer sizes do not match vectors/dim");
  require(c.vectors == 0 || out != nullptr, "relaxed_dequantize: out must be non-null");
  for (size_t v = 0; v < c.vectors; ++v)
    relaxed_decode(&c.codes[v * c.dim], &c.scales[v * per], c.dim, c.options.scaling, out + v * c.dim);
}

// ---- empirical entropy -------------------------------------------------------------------------

/// Plug-in (maximum-likelihood) order-0 entropy in bits per symbol of symbols[0..count):
/// H = -Σ p̂ log2 p̂ with p̂ the observed frequencies. 0 for count = 0.
inline double empirical_entropy_bits(const int16_t* symbols, size_t count) {
  if (count == 0) return 0.0;
  require(symbols != nullptr, "empirical_entropy_bits: symbols must be non-null");
  std::vector<size_t> hist(65536, 0);
  for (size_t i = 0; i < count; ++i) ++hist[static_cast<uint16_t>(symbols[i])];
  double h = 0.0;
  const double n = static_cast<double>(count);
  for (size_t c : hist)
    if (c) h -= (c / n) * std::log2(c / n);
  return h;
}

/// Plug-in entropy of consecutive 8-symbol blocks taken as one joint symbol, in bits per ELEMENT
/// (the block entropy divided by 8). count must be a multiple of 8. The plug-in estimate is biased
/// low when the number of distinct blocks is not small against count/8; `distinct` (optional)
/// receives that number so callers can judge.
inline double empirical_block_entropy_bits(const int16_t* symbols, size_t count, size_t* distinct = nullptr) {
  require(count % 8 == 0, "empirical_block_entropy_bits: count must be a multiple of 8, got " + std::to_string(count));
  if (distinct) *distinct = 0;
  if (count == 0) return 0.0;
  require(symbols != nullptr, "empirical_block_entropy_bits: symbols must be non-null");
  const size_t blocks = count / 8;
  std::vector<std::pair<uint64_t, uint64_t>> keys(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    uint64_t k0 = 0, k1 = 0;
    for (int i = 0; i < 4; ++i) {
      k0 |= static_cast<uint64_t>(static_cast<uint16_t>(symbols[8 * b + i])) << (16 * i);
      k1 |= static_cast<uint64_t>(static_cast<uint16_t>(symbols[8 * b + 4 + i])) << (16 * i);
    }
    keys[b] = {k0, k1};
  }
  std::sort(keys.begin(), keys.end());
  double h = 0.0;
  const double n = static_cast<double>(blocks);
  size_t runs = 0;
  for (size_t i = 0; i < blocks;) {
    size_t j = i;
    while (j < blocks && keys[j] == keys[i]) ++j;
    const double p = (j - i) / n;
    h -= p * std::log2(p);
    ++runs;
    i = j;
  }
  if (distinct) *distinct = runs;
  return h / 8.0;
}

/// Rate measurements of the reference quantizer on a dataset (it has no fixed-rate index).
struct RelaxedEntropy {
  double per_coordinate_bits = 0;  ///< order-0 entropy of the per-element code symbols
  double joint_block_bits = 0;     ///< entropy of whole 8-blocks of codes, per element (padded
                                   ///< coordinates of a partial last block count as code 0)
  double coset_conditional_bits = 0;  ///< H(c)/8 + H(code | c) per element, c = "the 8-block
                                     ///< holds an odd code" (half coset): a well-estimated rate
                                     ///< that a coset flag + per-coordinate coder achieves
  double scale_bits = 0;           ///< 16 bits (fp16) per stored scale, per element
  size_t blocks = 0;               ///< 8-blocks measured
  size_t distinct_blocks = 0;      ///< distinct 8-block symbols seen (plug-in bias indicator)
  double fixed_rate_bits = 0;      ///< log2(2·levels + 1): a per-element fixed-length code's rate
};

/// Quantizes x [vectors, dim] and measures the entropies of its codes.
inline RelaxedEntropy relaxed_empirical_entropy(const float* x, size_t vectors, int dim,
                                                const RelaxedOptions& options = {}) {
  const RelaxedCodes c = relaxed_quantize(x, vectors, dim, options);
  RelaxedEntropy e;
  e.per_coordinate_bits = empirical_entropy_bits(c.codes.data(), c.codes.size());
  const size_t padded = static_cast<size_t>((dim + 7) / 8 * 8);
  std::vector<int16_t> blocks(vectors * padded, 0);
  for (size_t v = 0; v < vectors; ++v)
    std::copy(c.codes.begin() + v * dim, c.codes.begin() + (v + 1) * dim, blocks.begin() + v * padded);
  // Bits per padded element, rescaled to bits per real element.
  e.joint_block_bits = empirical_block_entropy_bits(blocks.data(), blocks.size(), &e.distinct_blocks) *
                       static_cast<double>(padded) / static_cast<double>(dim);
  e.blocks = blocks.size() / 8;
  {
    // Coset flag per block, then the code histogram of each class over the real coordinates.
    std::vector<size_t> flag_count(2, 0);
    std::vector<std::vector<size_t>> hist(2, std::vector<size_t>(65536, 0));
    std::vector<size_t> class_elems(2, 0);
    for (size_t b = 0; b < e.blocks; ++b) {
      const size_t v = b / (padded / 8), first = (b % (padded / 8)) * 8;
      int odd = 0;
      for (int i = 0; i < 8; ++i) odd |= blocks[8 * b + i] & 1;
      ++flag_count[odd];
      for (size_t i = first; i < first + 8 && i < static_cast<size_t>(dim); ++i) {
        ++hist[odd][static_cast<uint16_t>(c.codes[v * dim + i])];
        ++class_elems[odd];
      }
    }
    const double nb = static_cast<double>(e.blocks), ne = static_cast<double>(vectors) * dim;
    double bits = 0.0;
    for (int k = 0; k < 2; ++k) {
      if (flag_count[k]) bits -= flag_count[k] * std::log2(flag_count[k] / nb);
      for (size_t n : hist[k])
        if (n) bits -= n * std::log2(static_cast<double>(n) / class_elems[k]);
    }
    e.coset_conditional_bits = ne > 0 ? bits / ne : 0.0;
  }
  e.scale_bits = 16.0 * relaxed_scale_count(dim, options.scaling) / dim;
  e.fixed_rate_bits = std::log2(2.0 * options.levels + 1.0);
  return e;
}

/// Per-element empirical entropy of the reference quantizer's code symbols over a dataset x
/// [vectors, dim]: the order-0 (per-coordinate) entropy, codes only. Add RelaxedEntropy::scale_bits
/// for the fp16 scales; see relaxed_empirical_entropy for the joint 8-block figure.
inline double relaxed_empirical_entropy_bits(const float* x, size_t vectors, int dim,
                                             const RelaxedOptions& options = {}) {
  return relaxed_empirical_entropy(x, vectors, dim, options).per_coordinate_bits;
}

}  // namespace e8kv::codebook
