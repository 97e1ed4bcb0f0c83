// One running softmax over partial results, host and device: every place that merges partial
// attentions (the CPU attend's chunks, the dense attention's tiles, the CUDA split-K reduction)
// keeps its running maximum and sum with SoftmaxRun and scales what it keeps beside them (value
// sums, masses) by the two factors each merge returns.
//
//   SoftmaxRun<double> run;                          // max = −inf, sum = 0: nothing merged yet
//   const MergeScales s = run.add(m_i, l_i, ExpE{}); // a partial: its max and Σ exp(x − m_i)
//   for (i...) acc[i] = acc[i] * s.running + s.partial * part[i];
//
// The merge is exact up to rounding in any order of partials: with m = max(m_run, m_i), the
// running terms are multiplied by exp(m_run − m) and the partial's by exp(m_i − m), so that every
// term is exp(x − m) for the new maximum. ExpE works in natural logarithms (the CPU), Exp2 in
// base 2 (the GPU kernels fold log2(e) into the softmax scale). The sum's type is the caller's:
// the CPU attend sums in double across chunks, the dense attention and the GPU in float.
//
// What stays fused, not written with this type: the online softmax inside one GPU tile
// (cuda/rotated_attention_tile.hpp keeps it in registers per lane pair) and merge_attention
// (attend.hpp: two complete attentions weighed in double from their lse values).
#pragma once

#include <cmath>

#include "e8kv/platform.hpp"

namespace e8kv::attention {

/// exp(x) in natural logarithms.
struct ExpE {
  E8KV_HD float operator()(float x) const {
#ifdef __CUDA_ARCH__
    return expf(x);
#else
    return std::exp(x);
#endif
  }
};

/// 2^x.
struct Exp2 {
  E8KV_HD float operator()(float x) const {
#ifdef __CUDA_ARCH__
    return exp2f(x);
#else
    return std::exp2(x);
#endif
  }
};

/// The factors of one merge: the running state's terms times `running`, the partial's times
/// `partial`.
struct MergeScales {
  float running = 0.f;
  float partial = 0.f;
};

/// A running maximum and the sum of exponentials below it.
template <class Sum>
struct SoftmaxRun {
  float max = -INFINITY;
  Sum sum = Sum(0);

  /// Merges a partial of maximum `partial_max` (finite: an empty partial is the caller's to skip)
  /// and sum `partial_sum` relative to it; returns the factors for what the caller keeps beside
  /// the sum. The first merge gives running = 0.
  template <class Exp>
  E8KV_HD MergeScales add(float partial_max, Sum partial_sum, Exp exp_fn) {
    const float m = max < partial_max ? partial_max : max;
    const MergeScales s{max == -INFINITY ? 0.f : exp_fn(max - m), exp_fn(partial_max - m)};
    sum = sum * Sum(s.running) + partial_sum * Sum(s.partial);
    max = m;
    return s;
  }
};

}  // namespace e8kv::attention
