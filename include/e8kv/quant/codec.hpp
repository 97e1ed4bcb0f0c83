// Runtime codec ids for head vectors and the closed runtime -> compile-time dispatch over them.
#pragma once

#include <cstdint>
#include <string>

#include "e8kv/codebook/ball.hpp"
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/codebook/scalar.hpp"
#include "e8kv/codebook/voronoi.hpp"
#include "e8kv/error.hpp"
#include "e8kv/quant/codec_id.hpp"

namespace e8kv::quant {

/// Calls f(Code{}) with the block-code type of `c` (not for kFp16). Closed set, loud default.
template <class F>
decltype(auto) dispatch_block_code(Codec c, F&& f) {
  switch (c) {
    case Codec::kE8P: return f(codebook::E8P{});
    case Codec::kRvq3: return f(codebook::Rvq3{});
    case Codec::kRvq4: return f(codebook::Rvq4{});
    case Codec::kBall3: return f(codebook::Ball3{});
    case Codec::kBall4: return f(codebook::Ball4{});
    case Codec::kVoronoi2: return f(codebook::Voronoi<2>{});
    case Codec::kVoronoi3: return f(codebook::Voronoi<3>{});
    case Codec::kVoronoi4: return f(codebook::Voronoi<4>{});
    case Codec::kLloydMax2: return f(codebook::LloydMax<2>{});
    case Codec::kLloydMax3: return f(codebook::LloydMax<3>{});
    case Codec::kLloydMax4: return f(codebook::LloydMax<4>{});
    case Codec::kFp16: break;
  }
  throw Error(std::string("codec '") + to_string(c) + "' has no block code; accepted block codes: e8p2, rvq3, rvq4, "
              "ball3, ball4, vor2, vor3, vor4, lm2, lm3, lm4");
}

}  // namespace e8kv::quant
