// The container's layout record (docs/format.md §2.2): a CacheLayout as 128 bytes plus two codec
// ids per layer, written, read, validated and compared field by field from the field table
// (src/config_fields.hpp). Internal; layout_difference is public (container.hpp).
#pragma once

#include <cstdint>

#include "container/byte_io.hpp"
#include "e8kv/cache/cache_layout.hpp"

namespace e8kv::container {

/// The oldest format version that stores every field of L as it is (1 unless a field or a value
/// needs a newer one: query-weighted keys or 8-bit gains need 2).
uint16_t format_version_for(const CacheLayout& L);
/// Fails (e8kv::Error naming the field and the accepted values) unless every field of L is one
/// the format accepts and the fields agree with each other. The writer and the reader share it.
void validate_layout(const CacheLayout& L);
/// Appends the record of L in format `version` (>= format_version_for(L)) and its codec ids.
void write_layout_record(io::ByteWriter& w, const CacheLayout& L, uint16_t version);
/// Reads a record of format `version` (and its codec ids) and validates it.
CacheLayout read_layout_record(io::ByteReader& r, uint16_t version);

}  // namespace e8kv::container
