// The contract every 8-dimensional block code in e8kv follows, and a compile-time check of it.
//
//   struct SomeCode {
//     static constexpr const char* kName;   // short id used in tables and CSV ("e8p", "rvq3", ...)
//     static constexpr int kIndexBits;      // fixed index width in bits (1..32)
//     static constexpr float kInputScale;   // optimal scale for i.i.d. N(0,1) input: the code
//                                           // quantizes kInputScale * x internally
//     E8KV_HD static uint32_t encode(const float x[8]);       // index of the codeword nearest x
//     E8KV_HD static void decode(uint32_t index, float y[8]); // that codeword, in x's units
//   };
//
// Inputs are expected at roughly unit variance per element; the codes take care of their own
// internal lattice scale. decode(encode(x)) is the reconstruction the bench and the cache use.
// encode must be total: non-finite input gives a valid index (documented per code), never UB.
// Indices always fit in kIndexBits bits; decode of any index in [0, 2^kIndexBits) is defined
// (codes with fewer than 2^kIndexBits codewords document what an unused index decodes to).
#pragma once

#include <cstdint>
#include <type_traits>

#include "e8kv/platform.hpp"

namespace e8kv::codebook {

template <class Code, class = void>
struct is_block_code : std::false_type {};

template <class Code>
struct is_block_code<Code,
                     std::void_t<decltype(Code::kName), decltype(Code::kIndexBits), decltype(Code::kInputScale),
                                 decltype(Code::encode(static_cast<const float*>(nullptr))),
                                 decltype(Code::decode(uint32_t{}, static_cast<float*>(nullptr)))>>
    : std::bool_constant<(Code::kIndexBits >= 1 && Code::kIndexBits <= 32) &&
                         std::is_same_v<decltype(Code::encode(static_cast<const float*>(nullptr))), uint32_t>> {};

template <class Code>
inline constexpr bool is_block_code_v = is_block_code<Code>::value;

}  // namespace e8kv::codebook
