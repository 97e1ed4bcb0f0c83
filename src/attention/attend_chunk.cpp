// One work item of the CPU decode attention (attend_internal.hpp): a chunk of a request's stored
// tokens scored against every query token and head, its softmax and value sums.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention/attend_internal.hpp"
#include "attention/attend_kernels.hpp"
#include "detail/finite.hpp"
#include "detail/require.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/codebook/host_decode.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/fp.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/gain_code.hpp"

namespace e8kv::attention {
namespace {

/// cos/sin rows of `m` positions (CacheCodecs::rope_table's three levels: the low level from the
/// planar copy, the product of the two upper levels cached per 1024 positions).
void fill_cos_sin(const LayerPlan& p, const int32_t* positions, int64_t m, Scratch& s) {
  const auto& codecs = p.cache->codecs();
  const float* planar = codecs.key_rope_low_planar();
  const float* table = codecs.rope_table().data();
  const int P = p.P, pairs = p.pairs;
  s.cs.resize(static_cast<size_t>(kSubTile) * 2 * P);
  s.upper_cos.resize(static_cast<size_t>(P));
  s.upper_sin.resize(static_cast<size_t>(P));
  for (int64_t t = 0; t < m; ++t) {
    const uint32_t pos = static_cast<uint32_t>(positions[t]);
    if ((pos >> 10) != s.upper) {
      s.upper = pos >> 10;
      const size_t stride = static_cast<size_t>(pairs) * 2;
      const float* mid = table + static_cast<size_t>(1024u + (s.upper & 1023u)) * stride;
      const float* high = table + static_cast<size_t>(2048u + (s.upper >> 10)) * stride;
      for (int i = 0; i < P; ++i) {
        const bool real = i < pairs;
        const float c1 = real ? mid[2 * i] : 1.f, s1 = real ? mid[2 * i + 1] : 0.f;
        const float c2 = real ? high[2 * i] : 1.f, s2 = real ? high[2 * i + 1] : 0.f;
        s.upper_cos[static_cast<size_t>(i)] = c1 * c2 - s1 * s2;
        s.upper_sin[static_cast<size_t>(i)] = c1 * s2 + s1 * c2;
      }
    }
    const float* lc = planar + static_cast<size_t>(pos & 1023u) * P;
    const float* ls = planar + static_cast<size_t>(1024u + (pos & 1023u)) * P;
    float* c = s.cs.data() + static_cast<size_t>(t) * 2 * P;
    float* sn = c + P;
    const float* uc = s.upper_cos.data();
    const float* us = s.upper_sin.data();
    for (int i = 0; i < P; ++i) {
      c[i] = lc[i] * uc[i] - ls[i] * us[i];
      sn[i] = lc[i] * us[i] + ls[i] * uc[i];
    }
  }
}

/// Keys of tokens [t0, t0 + m) of (layer, head) decoded into float rows: for pre-RoPE codes in
/// the engine's basis (block codes times gain, the inverse rotation for the whole tile at once,
/// S⁻¹ and the mean, then RoPE from the tile's cos/sin rows `cs`: what decompress_head gives, to
/// rounding); for codes without a register decoder, in the rotated basis at unit scale without
/// the gain.
template <class Code>
E8KV_FORCE_INLINE void decode_keys_ahead_body(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs,
                                              float* rows) {
  const auto& cache = *p.cache;
  const auto& codecs = cache.codecs();
  const auto& hd = cache.layer(p.layer).heads[static_cast<size_t>(h)];
  const size_t cb = p.key_code_bytes;
  const int d = p.d;
  const bool pre = p.frame == KeyFrame::kPreRope;
  const auto gain = hd.key_gains_reader();
  constexpr int kBytes = Code::kIndexBits / 8;
  const auto tables = codebook::host_decode::tables();
  for (int64_t t = 0; t < m; ++t) {
    const uint8_t* c = &hd.key_codes[static_cast<size_t>(t0 + t) * cb];
    const float g = pre ? gain(static_cast<size_t>(t0 + t)) : 1.f;
    for (int j = 0; j < d / 8; ++j) {
      const uint32_t index = attention::kernels::load_index(c + j * kBytes, kBytes);
      float* y = rows + t * d + 8 * j;
      if constexpr (codebook::host_decode::kHasTableDecode<Code>) {
        codebook::host_decode::decode_scaled_block<Code>(tables, index, g, y);
      } else {
        Code::decode(index, y);
        for (int i = 0; i < 8; ++i) y[i] *= g;
      }
    }
  }
  if (!pre) return;
  codecs.rotation(p.layer, h, KvKind::kKey).inverse_batch(rows, rows, static_cast<size_t>(m), static_cast<size_t>(d));
  float inv_scale[512], mu[512];
  for (int i = 0; i < d; ++i) {
    inv_scale[i] = hd.key_channel_scale.empty() ? 1.f : 1.0f / fp16_bits_to_float(hd.key_channel_scale[static_cast<size_t>(i)]);
    mu[i] = hd.key_mean.empty() ? 0.f : fp16_bits_to_float(hd.key_mean[static_cast<size_t>(i)]);
  }
  const auto layout = codecs.rope().params().layout;
  const int rotary = 2 * p.pairs, P = p.P;
  for (int64_t t = 0; t < m; ++t) {
    float* k = rows + t * d;
    for (int i = 0; i < d; ++i) k[i] = k[i] * inv_scale[i] + mu[i];  // pre-RoPE frame: S⁻¹·(...) + μ
    const float* c = cs + static_cast<size_t>(t) * 2 * P;
    transform::rope_rotate(k, c, c + P, rotary, layout, false);
  }
}

// The AVX2 twin (no FMA: the same floats) and the baseline build of the decode above.
template <class Code>
E8KV_TARGET_BASE_FLAT void decode_keys_ahead_base(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs,
                                                  float* rows) {
  decode_keys_ahead_body<Code>(p, h, t0, m, cs, rows);
}
#if E8KV_HOST_AVX2_DISPATCH
template <class Code>
E8KV_TARGET_AVX2_FLAT void decode_keys_ahead_avx2(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs,
                                                  float* rows) {
  decode_keys_ahead_body<Code>(p, h, t0, m, cs, rows);
}
#endif
void decode_keys_ahead(const LayerPlan& p, int h, int64_t t0, int64_t m, const float* cs, float* rows) {
  quant::dispatch_block_code(p.key_codec, [&](auto code) {
    using Code = decltype(code);
#if E8KV_HOST_AVX2_DISPATCH
    if (cpu_has_avx2()) return decode_keys_ahead_avx2<Code>(p, h, t0, m, cs, rows), 0;
#endif
    return decode_keys_ahead_base<Code>(p, h, t0, m, cs, rows), 0;
  });
}

/// Vectors [t0, t0 + m) of `codes` (cb bytes each) of a code without a register decoder: rotated
/// basis, unit scale, no gain (values; post-RoPE tier keys).
void decode_codes_ahead(Codec codec, const std::vector<uint8_t>& codes, size_t cb, int d, int64_t t0, int64_t m,
                        float* rows) {
  quant::dispatch_block_code(codec, [&](auto code) {
    using Code = decltype(code);
    constexpr int kBytes = Code::kIndexBits / 8;
    for (int64_t t = 0; t < m; ++t)
      for (int j = 0; j < d / 8; ++j)
        Code::decode(attention::kernels::load_index(&codes[static_cast<size_t>(t0 + t) * cb + j * kBytes], kBytes),
                     rows + t * d + 8 * j);
    return 0;
  });
}

/// Calls f(std::integral_constant<int, NG>) with NG the kernel group size for `remaining` query
/// heads (8, 4, 3, 2 or 1) and returns NG.
template <class F>
E8KV_FORCE_INLINE int with_group(int remaining, F&& f) {
  if (remaining >= 8) return f(std::integral_constant<int, 8>{}), 8;
  if (remaining >= 4) return f(std::integral_constant<int, 4>{}), 4;
  if (remaining == 3) return f(std::integral_constant<int, 3>{}), 3;
  if (remaining == 2) return f(std::integral_constant<int, 2>{}), 2;
  return f(std::integral_constant<int, 1>{}), 1;
}

/// Calls f(decoder) with kernel set K's register decoder of `rows`.
template <class K, class F>
E8KV_FORCE_INLINE void with_rows(Rows rows, F&& f) {
  const auto& tables = attention::kernels::decode_rows();
  switch (rows) {
    case Rows::kE8p: f(typename K::E8pRowDecoder{&tables}); return;
    case Rows::kRvq3: f(typename K::Rvq3RowDecoder{&tables}); return;
    case Rows::kRvq4: f(typename K::Rvq4RowDecoder{&tables, codebook::Rvq4::kInverseResidualScale}); return;
    case Rows::kFp16: f(typename K::Fp16RowDecoder{}); return;
    case Rows::kFp32: f(typename K::Fp32RowDecoder{}); return;
  }
}

/// Rows [0, n) of register-decoded codes written out as float rows (8·blocks floats each), so
/// that several query tokens read one decode: Fp32RowDecoder yields exactly the decoder's floats,
/// so the sums are bit-identical to decoding per token.
template <class K>
void decode_tile(Rows kind, const uint8_t* rows, size_t stride, int blocks, int64_t n, float* out) {
  with_rows<K>(kind, [&](const auto& dec) { K::decode_rows(dec, rows, stride, blocks, n, out); });
}

// ---- one work item: a chunk of tokens of one request, a range of its heads--------------------------

/// Refuses a chunk whose scores overflowed: a finite query large enough that scale·q·k leaves
/// the float range would otherwise give a softmax of NaN, dropped as an empty chunk, and an
/// attention output of zeros. Then, for a request with position bounds, masks (−inf) the tokens
/// of the chunk outside them. Tokens before `scored[h]` were skipped: their scores are −inf already.
void check_and_mask_logits(const ResolvedRequest& r, HeadRange heads, TokenRange tokens, Segment segment,
                           int64_t t_begin, const std::vector<int64_t>& count, const std::vector<int64_t>& scored,
                           size_t sets, Scratch& s) {
  const LayerPlan& p = r.plan;
  const int G = p.G, Hn = heads.end - heads.begin;
  auto logits_row = [&](int token, int h, int g) {
    return s.logits.data() + ((static_cast<size_t>(token - tokens.begin) * Hn + (h - heads.begin)) * G + g) * kChunkTokens;
  };
  for (int token = tokens.begin; token < tokens.end; ++token)
    for (int h = heads.begin; h < heads.end; ++h)
      for (int g = 0; g < G; ++g) {
        const int64_t from = scored[static_cast<size_t>(h)];
        const float* row = logits_row(token, h, g) + from;
        const int64_t m = count[static_cast<size_t>(h)] - from;
        if (detail::first_non_finite(row, static_cast<size_t>(m)) < static_cast<size_t>(m))
          detail::fail("attend: the scores of query token {} (query head {}) overflow the float range in layer {}: "
                       "the query or the keys are too large to attend",
                       token, h * G + g, p.layer);
      }
  if (!r.bounded) return;
  // The positions every token of the request sees (the intersection of their bounds): a stored
  // token there needs no per-token look (a batch's older tokens, the common case).
  int32_t seen_lo = r.min_position, seen_hi = r.max_position;
  for (int token = tokens.begin; token < tokens.end; ++token) {
    seen_lo = std::max(seen_lo, r.min_for(token));
    seen_hi = std::min(seen_hi, r.max_for(token));
  }
  const auto& ld = p.cache->layer(p.layer);
  for (int h = heads.begin; h < heads.end; ++h) {
    const size_t set = sets == 1 ? 0 : static_cast<size_t>(h);
    const std::vector<int32_t>& pos = segment == Segment::kWindow ? ld.window_positions[set]
                                      : segment == Segment::kTier ? ld.tier_positions[set]
                                                                  : ld.positions[set];
    for (int64_t t = scored[static_cast<size_t>(h)]; t < count[static_cast<size_t>(h)]; ++t) {
      const int32_t at = pos[static_cast<size_t>(t_begin + t)];
      if (at >= seen_lo && at <= seen_hi) continue;
      for (int token = tokens.begin; token < tokens.end; ++token) {
        if (at >= r.min_for(token) && at <= r.max_for(token)) continue;
        for (int g = 0; g < G; ++g)
          logits_row(token, h, g)[t] = kNegInf;
      }
    }
  }
}

template <class K>
void run_chunk_body(ResolvedRequest& r, int64_t chunk, HeadRange heads, TokenRange tokens, Scratch& s) {
  const LayerPlan& p = r.plan;
  const auto& cache = *p.cache;
  const auto& ld = cache.layer(p.layer);
  const int H = p.H, G = p.G, d = p.d, blocks = p.blocks, Hn = heads.end - heads.begin;
  const Segment segment = segment_of(p, chunk);
  const bool window = segment == Segment::kWindow, tier = segment == Segment::kTier;
  s.upper = 0xFFFFFFFFu;  // the cached upper RoPE level belongs to the previous item's table
  const int64_t t_begin = segment_begin(p, chunk);
  // Runs shortened by the request's max_position (attend.cpp's resolve_bounds).
  const std::vector<int64_t>& stored = window ? p.window : tier ? r.tier_end : r.coded_end;
  std::vector<int64_t> count(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h)
    count[static_cast<size_t>(h)] = std::clamp<int64_t>(stored[static_cast<size_t>(h)] - t_begin, 0, kChunkTokens);
  // Per head, where scoring starts: the first sub-tile holding a token at or above the request's
  // lowest bound (the sub-tiles before it are below every token's: their scores stay −inf and
  // their weights 0, exactly what scoring and masking them gives). Window rows are all scored.
  const std::vector<int64_t>* first_in_bounds = window ? nullptr : tier ? &r.tier_begin : &r.coded_begin;
  std::vector<int64_t> scored(static_cast<size_t>(H), 0);
  for (int h = 0; h < H && first_in_bounds != nullptr; ++h) {
    const int64_t below = std::clamp<int64_t>((*first_in_bounds)[static_cast<size_t>(h)] - t_begin, 0,
                                              count[static_cast<size_t>(h)]);
    scored[static_cast<size_t>(h)] = below == count[static_cast<size_t>(h)] ? below : below / kSubTile * kSubTile;
  }
  const int Tn = tokens.size();
  s.logits.assign(static_cast<size_t>(Tn) * Hn * G * kChunkTokens, kNegInf);
  s.dots.resize(static_cast<size_t>(kMaxGroup) * kSubTile);
  s.mean.resize(static_cast<size_t>(kMaxGroup) * kSubTile);
  s.rows.resize(static_cast<size_t>(kSubTile) * d);
  s.key_gains.resize(static_cast<size_t>(kChunkTokens));
  s.value_gains.resize(static_cast<size_t>(kChunkTokens));
  auto logits_row = [&](int token, int h, int g) {
    return s.logits.data() + ((static_cast<size_t>(token - tokens.begin) * Hn + (h - heads.begin)) * G + g) * kChunkTokens;
  };
  const bool key_engine = window || (!tier && p.key_in_engine_basis);
  const Rows key_rows = window ? Rows::kFp16 : tier ? p.tier_key_rows : p.key_rows;
  const bool key_ahead = !window && key_rows == Rows::kFp32;
  // Several query tokens: each sub-tile of codes is decoded once into float rows, then every
  // token reads those (a decode costs more than the multiply-adds one token spends on a row).
  const bool share_decode = Tn > 1;
  const size_t sets = ld.positions.size();

  // Scores, a sub-tile of tokens at a time: cos/sin rows once per position set, then every head.
  for (int64_t s0 = 0; s0 < kChunkTokens; s0 += kSubTile) {
    for (size_t set = 0; set < sets; ++set) {
      const int h_begin = std::max(sets == 1 ? 0 : static_cast<int>(set), heads.begin);
      const int h_end = std::min(sets == 1 ? H : static_cast<int>(set) + 1, heads.end);
      if (h_begin >= h_end) continue;
      const int64_t set_count = std::min<int64_t>(count[static_cast<size_t>(h_begin)] - s0, kSubTile);
      if (set_count <= 0 || s0 < scored[static_cast<size_t>(h_begin)]) continue;
      if (segment == Segment::kCoded && (p.residual_mean || p.frame == KeyFrame::kPreRope))
        fill_cos_sin(p, ld.positions[set].data() + t_begin + s0, set_count, s);
      else if (tier && p.tier_centred && p.residual_mean)
        fill_cos_sin(p, ld.tier_positions[set].data() + t_begin + s0, set_count, s);
      for (int h = h_begin; h < h_end; ++h) {
        const int64_t m = std::min<int64_t>(count[static_cast<size_t>(h)] - s0, kSubTile);
        if (m <= 0 || s0 < scored[static_cast<size_t>(h)]) continue;
        const auto& hd = ld.heads[static_cast<size_t>(h)];
        const uint8_t* rows = nullptr;
        size_t stride = 0;
        if (window) {
          rows = reinterpret_cast<const uint8_t*>(hd.window_keys.data() + static_cast<size_t>(t_begin + s0) * d);
          stride = static_cast<size_t>(d) * 2;
        } else if (tier && key_ahead) {
          decode_codes_ahead(p.tier_key_codec, hd.tier_key_codes, p.tier_key_code_bytes, d, t_begin + s0, m, s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
        } else if (tier) {
          rows = hd.tier_key_codes.data() + static_cast<size_t>(t_begin + s0) * p.tier_key_code_bytes;
          stride = p.tier_key_code_bytes;
        } else if (key_ahead) {
          decode_keys_ahead(p, h, t_begin + s0, m, s.cs.data(), s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
        } else {
          rows = hd.key_codes.data() + static_cast<size_t>(t_begin + s0) * p.key_code_bytes;
          stride = p.key_code_bytes;
        }
        Rows tile_rows = key_rows;
        if (share_decode && !window && !key_ahead) {
          decode_tile<K>(key_rows, rows, stride, blocks, m, s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
          tile_rows = Rows::kFp32;
        }
        const bool scaled_codes = !key_engine;
        if (tier) {
          fp16_bits_to_floats(hd.tier_key_gains.data() + t_begin + s0, s.key_gains.data() + s0, static_cast<size_t>(m));
        } else if (scaled_codes) {
          const auto gain = hd.key_gains_reader();
          for (int64_t t = 0; t < m; ++t) s.key_gains[static_cast<size_t>(s0 + t)] = gain(static_cast<size_t>(t_begin + s0 + t));
        }
        for (int token = tokens.begin; token < tokens.end; ++token) {
          const HeadQuery& hq = r.heads[static_cast<size_t>(token) * H + h];
          const float* q = tier ? hq.qt_tier.data() : scaled_codes ? hq.qt.data() : hq.q;
          for (int g0 = 0; g0 < G;) {
            g0 += with_group(G - g0, [&](auto ng) {
              constexpr int NG = decltype(ng)::value;
              with_rows<K>(tile_rows, [&](const auto& dec) {
                K::template dot_rows<NG>(dec, rows, stride, blocks, q + static_cast<size_t>(g0) * d, m, s.dots.data(), kSubTile);
              });
              // Heads without means and an uncentred tier skip the mean term.
              const bool centred = !tier || p.tier_centred;
              const bool mean_rows = centred && scaled_codes && p.residual_mean && !hq.mean_coeffs.empty();
              if (mean_rows)
                K::template dot_rows<NG>(typename K::Fp32RowDecoder{}, reinterpret_cast<const uint8_t*>(s.cs.data()),
                                         static_cast<size_t>(2 * p.P) * sizeof(float), 2 * p.P / 8,
                                         hq.mean_coeffs.data() + static_cast<size_t>(g0) * 2 * p.P, m, s.mean.data(), kSubTile);
              for (int g = 0; g < NG; ++g) {
                float* out = logits_row(token, h, g0 + g) + s0;
                const float* dot = s.dots.data() + static_cast<size_t>(g) * kSubTile;
                if (!scaled_codes) {
                  for (int64_t t = 0; t < m; ++t) out[t] = dot[t] * p.scale;
                  continue;
                }
                K::code_logits(dot, s.key_gains.data() + s0,
                               mean_rows ? s.mean.data() + static_cast<size_t>(g) * kSubTile : nullptr,
                               centred ? hq.base[static_cast<size_t>(g0 + g)] : 0.f, p.scale, m, out);
              }
            });
          }
        }
      }
    }
  }

  check_and_mask_logits(r, heads, tokens, segment, t_begin, count, scored, sets, s);

  // Softmax of the chunk and the value sums, per head.
  const bool value_engine = window || (!tier && p.value_in_engine_basis);
  const Rows value_rows = window ? Rows::kFp16 : tier ? p.tier_value_rows : p.value_rows;
  const bool value_ahead = !window && value_rows == Rows::kFp32;
  for (int h = heads.begin; h < heads.end; ++h) {
    const int64_t m = count[static_cast<size_t>(h)];
    const int64_t padded = (m + 7) / 8 * 8;
    const auto& hd = ld.heads[static_cast<size_t>(h)];
    if (tier) {
      for (int64_t t = 0; t < m; ++t)
        s.value_gains[static_cast<size_t>(t)] =
            fp16_bits_to_float(hd.tier_value_gains[static_cast<size_t>(t_begin + t)]) * p.tier_value_factor;
    } else if (!value_engine) {
      const auto gain = hd.value_gains_reader();
      for (int64_t t = 0; t < m; ++t)
        s.value_gains[static_cast<size_t>(t)] = gain(static_cast<size_t>(t_begin + t)) * p.value_factor;
    }
    for (int token = tokens.begin; token < tokens.end; ++token) {
      for (int g = 0; g < G; ++g) {
        float* st = r.state(chunk, token, h, g);
        std::fill(st, st + state_floats(d), 0.f);
        st[0] = kNegInf;
        if (m == 0) continue;
        K::softmax_row(logits_row(token, h, g), padded, &st[0], &st[1]);
        // The mass the value mean applies to: the codes', and a centred tier's.
        st[2] = segment == Segment::kCoded || (tier && p.tier_centred) ? st[1] : 0.f;
      }
    }
    if (m == 0) continue;
    // Weights of every (query token, head), in the kernels' group layout: the group of heads
    // g0..g0+NG−1 of a token holds w[t·NG + g] at offset (token·G + g0)·m.
    s.weights.resize(static_cast<size_t>(Tn) * G * m);
    for (int token = tokens.begin; token < tokens.end; ++token)
      for (int g0 = 0; g0 < G;) {
        g0 += with_group(G - g0, [&](auto ng) {
          constexpr int NG = decltype(ng)::value;
          float* w = s.weights.data() + (static_cast<size_t>(token - tokens.begin) * G + g0) * m;
          for (int64_t t = 0; t < m; ++t)
            for (int g = 0; g < NG; ++g) {
              const float pr = logits_row(token, h, g0 + g)[t];
              w[t * NG + g] = value_engine ? pr : pr * s.value_gains[static_cast<size_t>(t)];
            }
        });
      }
    // Sums of every (token, head) into contiguous d-float rows, a sub-tile of stored tokens at a
    // time; each sub-tile's rows are decoded once for all query tokens.
    // The skipped sub-tiles' weights are 0: adding their rows would leave every sum as it is.
    s.acc.assign(static_cast<size_t>(Tn) * G * d, 0.f);
    for (int64_t t0 = scored[static_cast<size_t>(h)]; t0 < m; t0 += kSubTile) {
      const int64_t mm = std::min<int64_t>(kSubTile, m - t0);
      const uint8_t* rows = nullptr;
      size_t stride = 0;
      Rows tile_rows = value_rows;
      if (window) {
        rows = reinterpret_cast<const uint8_t*>(hd.window_values.data() + static_cast<size_t>(t_begin + t0) * d);
        stride = static_cast<size_t>(d) * 2;
      } else if (value_ahead) {
        if (tier)
          decode_codes_ahead(p.tier_value_codec, hd.tier_value_codes, p.tier_value_code_bytes, d, t_begin + t0, mm, s.rows.data());
        else
          decode_codes_ahead(p.value_codec, hd.value_codes, p.value_code_bytes, d, t_begin + t0, mm, s.rows.data());
        rows = reinterpret_cast<const uint8_t*>(s.rows.data());
        stride = static_cast<size_t>(d) * 4;
      } else {
        const size_t cb = tier ? p.tier_value_code_bytes : p.value_code_bytes;
        rows = (tier ? hd.tier_value_codes : hd.value_codes).data() + static_cast<size_t>(t_begin + t0) * cb;
        stride = cb;
        if (share_decode) {
          decode_tile<K>(value_rows, rows, stride, blocks, mm, s.rows.data());
          rows = reinterpret_cast<const uint8_t*>(s.rows.data());
          stride = static_cast<size_t>(d) * 4;
          tile_rows = Rows::kFp32;
        }
      }
      for (int token = tokens.begin; token < tokens.end; ++token)
        for (int g0 = 0; g0 < G;) {
          g0 += with_group(G - g0, [&](auto ng) {
            constexpr int NG = decltype(ng)::value;
            const size_t group = static_cast<size_t>(token - tokens.begin) * G + g0;
            with_rows<K>(tile_rows, [&](const auto& dec) {
              K::template accumulate_rows<NG>(dec, rows, stride, blocks, s.weights.data() + group * m + static_cast<size_t>(t0) * NG,
                                              mm, s.acc.data() + group * d);
            });
          });
        }
    }
    for (int token = tokens.begin; token < tokens.end; ++token)
      for (int g = 0; g < G; ++g) {
        const float* a = s.acc.data() + (static_cast<size_t>(token - tokens.begin) * G + g) * d;
        std::copy(a, a + d, r.state(chunk, token, h, g) + 3);
      }
  }
}

}  // namespace

void run_chunk(ResolvedRequest& r, int64_t chunk, HeadRange heads, TokenRange tokens, Scratch& s) {
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma()) return run_chunk_body<attention::kernels::KernelsAvx2Fma>(r, chunk, heads, tokens, s);
#endif
  run_chunk_body<attention::kernels::KernelsPortable>(r, chunk, heads, tokens, s);
}

}  // namespace e8kv::attention
