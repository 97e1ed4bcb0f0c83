// Split-K planning and the lse merge of paged decode attention (flash-decoding), as pure
// host/device math: the launcher (kernels/decode_attention.cu) plans with it, the reduction
// kernel merges with it, and tests/cache/cuda_split_plan_test.cpp checks both on the CPU.
// No CUDA header is needed: g++ compiles this file as it is.
//
// Planning. A launch has `rows` independent (sequence, KV head, query chunk) rows; each row's
// coded tokens are cut into splits of `chunk` tokens, one CTA each, plus one CTA for the fp16
// window when there is one. The device runs `slots` = SMs × (CTAs per SM of the split kernel)
// CTAs at once. The plan gives each row floor(slots / rows) CTAs (rounded down: a partial
// second wave costs as much as a full one), so the grid fits in one wave whenever rows <= slots,
// and never cuts a split below kMinSplitTokens tokens (the per-split fixed cost: partial write
// and a merge term).
//
// Merge. Every split writes its partial as (lse, o): o = Σ p_t v_t / Σ p_t (normalized) and
// lse = log2 Σ_t 2^(s_t) over its tokens, with s_t the scaled logit in the log2 domain. Then for
// the whole row lse = log2 Σ_s 2^(lse_s) and o = Σ_s 2^(lse_s − lse) o_s: exact (a change of
// summation order only), bounded partials, and the row's lse is what a caller needs to merge
// this attention with another over a different KV segment (cascade / prefix sharing).
#pragma once

#include <cmath>
#include <cstdint>

#include "e8kv/attention/state.hpp"
#include "e8kv/platform.hpp"

namespace e8kv::cuda {

/// Splits are multiples of this many coded tokens (a multiple of every CTA's token step).
inline constexpr int kSplitGranule = 32;
/// No split is planned below this many coded tokens (automatic plans only).
inline constexpr int kMinSplitTokens = 64;

struct SplitPlan {
  int chunk = 0;   ///< coded tokens per split (> 0)
  int splits = 0;  ///< coded-token splits per row (0 when max_coded_len is 0)
};

E8KV_HD constexpr int64_t split_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The plan for rows of at most max_coded_len coded tokens on a device running `slots` CTAs at
/// once (slots <= 0 is taken as 1); `window_split`: each row also launches one window CTA.
/// fixed_chunk > 0 imposes the split size (rounding nothing). Pure integer math.
E8KV_HD constexpr SplitPlan plan_decode_splits(int64_t max_coded_len, int64_t rows, int64_t slots, bool window_split,
                                               int fixed_chunk) {
  SplitPlan plan{};
  const int64_t len = max_coded_len > 0 ? max_coded_len : 0;
  if (fixed_chunk > 0) {
    plan.chunk = fixed_chunk;
  } else {
    const int64_t r = rows > 0 ? rows : 1;
    const int64_t s = slots > 0 ? slots : 1;
    int64_t per_row = s / r - (window_split ? 1 : 0);  // CTAs one wave has for each row's coded splits
    if (per_row < 1) per_row = 1;
    // The smallest granule multiple that covers the row in per_row splits (so ceil(len / chunk)
    // <= per_row), but not below the minimum split.
    int64_t chunk = split_ceil_div(split_ceil_div(len, per_row), kSplitGranule) * kSplitGranule;
    if (chunk < kMinSplitTokens) chunk = kMinSplitTokens;
    if (chunk > INT32_MAX / 2) chunk = INT32_MAX / 2;  // len fits in int32: never reached
    plan.chunk = static_cast<int>(chunk);
  }
  plan.splits = len > 0 ? static_cast<int>(split_ceil_div(len, plan.chunk)) : 0;
  return plan;
}

/// Total CTAs of a plan's split kernel.
E8KV_HD constexpr int64_t planned_ctas(const SplitPlan& plan, int64_t rows, bool window_split) {
  return rows * (plan.splits + (window_split ? 1 : 0));
}

/// True when a sequence of `coded_len` tokens is fully covered by the plan (coded_len may be
/// smaller than the planned maximum; a longer one would be truncated: the kernels flag it).
E8KV_HD constexpr bool covered_by_plan(int64_t coded_len, const SplitPlan& plan) {
  return coded_len >= 0 && coded_len <= static_cast<int64_t>(plan.splits) * plan.chunk;
}

// ---- lse merge (log2 domain) ---------------------------------------------------------------------

/// lse of one partial from its running maximum m (log2 domain) and its sum l = Σ 2^(s_t − m) >= 1.
E8KV_HD inline float partial_lse2(float m, float l) { return m + log2f(l); }

/// Running log2-sum-exp2 of partial lse values: add() each, then lse(). Empty: -inf. Each
/// partial is a softmax run of maximum lse_s and sum 1 (attention/state.hpp).
struct Lse2Merge {
  attention::SoftmaxRun<float> run;  ///< max, and Σ 2^(lse_s − max)

  E8KV_HD void add(float lse_s) {
    if (!(lse_s > -INFINITY)) return;  // an empty partial (or a NaN one: it cannot be weighed)
    run.add(lse_s, 1.f, attention::Exp2{});
  }
  E8KV_HD float lse() const { return run.sum > 0.f ? run.max + log2f(run.sum) : -INFINITY; }
};

/// Weight of a partial in the merged row: 2^(lse_s − lse); 0 for an empty partial or row.
E8KV_HD inline float lse2_weight(float lse_s, float lse_row) {
  return (lse_s > -INFINITY && lse_row > -INFINITY) ? exp2f(lse_s - lse_row) : 0.f;
}

}  // namespace e8kv::cuda
