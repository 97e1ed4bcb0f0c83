// The plain container (docs/format.md §2.3): fp16/bf16 tensors [tokens, heads, head_dim], chunked
// along tokens, one stream per chunk. The lossless baseline the compressed cache is compared to.
#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "container/chunk.hpp"
#include "container/header.hpp"
#include "e8kv/container/container.hpp"

namespace e8kv::container {

namespace {

void check_plain_views(const std::vector<TensorView>& t) {
  if (t.empty()) return;
  const TensorView& a = t[0];
  if (a.dtype() != DType::kF16 && a.dtype() != DType::kBF16)
    throw Error(fmt::format("serialize_plain: dtype {} is not accepted (accepted: f16, bf16)", to_string(a.dtype())));
  for (size_t i = 1; i < t.size(); ++i)
    if (t[i].dtype() != a.dtype() || t[i].tokens() != a.tokens() || t[i].heads() != a.heads() ||
        t[i].head_dim() != a.head_dim())
      throw Error(fmt::format("serialize_plain: tensor {} differs in dtype or shape from tensor 0", i));
  if (a.tokens() > kMaxPlainExtent || a.heads() > kMaxPlainExtent || a.head_dim() > kMaxPlainExtent ||
      static_cast<int64_t>(t.size()) > kMaxPlainExtent ||
      io::sat_mul(static_cast<uint64_t>(a.heads()), static_cast<uint64_t>(a.head_dim()) * 2) >
          static_cast<uint64_t>(kMaxPlainExtent))
    throw Error(fmt::format("serialize_plain: extents ({} tensors of [{}, {}, {}]) are too large; accepted: each at "
                            "most {}, and heads × head_dim × 2 at most {}",
                            t.size(), a.tokens(), a.heads(), a.head_dim(), kMaxPlainExtent, kMaxPlainExtent));
}

std::vector<uint8_t> encode_plain(const std::vector<TensorView>& tensors, const ContainerOptions& o) {
  o.validate();
  check_plain_views(tensors);
  const int64_t T = o.chunk_tokens;
  const DType dt = tensors.empty() ? DType::kF16 : tensors[0].dtype();
  const int64_t tokens = tensors.empty() ? 0 : tensors[0].tokens();
  const int64_t heads = tensors.empty() ? 0 : tensors[0].heads();
  const int64_t dim = tensors.empty() ? 0 : tensors[0].head_dim();
  const bool empty = tensors.empty() || heads * dim == 0;
  const int64_t per_tensor = empty ? 0 : chunks_for(tokens, T);
  const uint64_t n_chunks = static_cast<uint64_t>(per_tensor) * tensors.size();
  io::check(n_chunks <= std::numeric_limits<uint32_t>::max(), "{} chunks are too many; raise chunk_tokens", n_chunks);
  const size_t header_bytes = kPrefixBytes + kPlainFixedBytes + kDirectoryEntryBytes * n_chunks + 4;
  std::vector<uint8_t> out;
  io::ByteWriter w(out);
  write_prefix(w, ContainerKind::kPlain, static_cast<uint64_t>(T), n_chunks, 1);
  w.u8(dt == DType::kF16 ? 1 : 2);
  for (int i = 0; i < 7; ++i) w.u8(0);
  w.u64(tensors.size());
  w.u64(static_cast<uint64_t>(tokens));
  w.u64(static_cast<uint64_t>(heads));
  w.u64(static_cast<uint64_t>(dim));
  const size_t dir_at = out.size();
  out.resize(header_bytes);
  ChunkEncoder enc(o);
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> raw;
  const size_t row_elems = static_cast<size_t>(heads * dim);
  for (size_t ti = 0; ti < tensors.size() && !empty; ++ti) {
    const TensorView& v = tensors[ti];
    const bool contiguous = v.token_stride() == heads * dim && v.head_stride() == dim;
    const auto* base = static_cast<const uint8_t*>(v.data());
    for (int64_t ci = 0; ci < per_tensor; ++ci) {
      const int64_t t0 = ci * T, t1 = std::min(tokens, t0 + T);
      raw.resize(static_cast<size_t>(t1 - t0) * row_elems * 2);
      if (contiguous) {
        std::memcpy(raw.data(), base + static_cast<size_t>(t0) * row_elems * 2, raw.size());
      } else {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t hh = 0; hh < heads; ++hh)
            std::memcpy(raw.data() + (static_cast<size_t>(t - t0) * row_elems + static_cast<size_t>(hh * dim)) * 2,
                        base + static_cast<size_t>(t * v.token_stride() + hh * v.head_stride()) * 2,
                        static_cast<size_t>(dim) * 2);
      }
      offsets.push_back(out.size());
      write_chunk(out, static_cast<uint32_t>(offsets.size() - 1), static_cast<uint32_t>(ti), static_cast<uint64_t>(t0),
                  1, [&](size_t desc) {
                    const StreamShape sh{{t1 - t0}, static_cast<int64_t>(row_elems), 2};
                    enc.encode_stream(StreamKind::kPlainValues, o.transforms.fp16, sh, raw.data(), out, desc);
                  });
    }
  }
  finish_container(out, dir_at, header_bytes, offsets);
  return out;
}

// Chunk ci of tensor ti: tokens [ci·T, min((ci+1)·T, tokens)), one stream.
ChunkExpectation plain_chunk(const Header& h, uint64_t ti, int64_t ci) {
  const int64_t T = h.info.chunk_tokens;
  const int64_t t0 = ci * T, t1 = std::min(h.info.tokens, t0 + T);
  const uint64_t per_tensor = static_cast<uint64_t>(chunks_for(h.info.tokens, T));
  return ChunkExpectation{ti * per_tensor + static_cast<uint64_t>(ci), static_cast<uint32_t>(ti), static_cast<uint64_t>(t0),
                          {{StreamKind::kPlainValues, StreamShape{{t1 - t0}, h.info.heads * h.info.head_dim, 2}}}};
}

PlainCache read_plain(Source& src, const DeserializeOptions& o) {
  const Header h = parse_header(src, o, ContainerKind::kPlain);
  check_budget(io::sat_add(h.info.decoded_bytes, scratch_bytes(h)), o, "the plain cache");
  PlainCache out;
  out.dtype = h.info.dtype;
  out.tokens = h.info.tokens;
  out.heads = h.info.heads;
  out.head_dim = h.info.head_dim;
  const size_t row_elems = static_cast<size_t>(out.heads * out.head_dim);
  const size_t tensor_elems = static_cast<size_t>(out.tokens) * row_elems;
  const int64_t per_tensor = h.info.n_chunks == 0 ? 0 : chunks_for(out.tokens, h.info.chunk_tokens);
  ChunkDecoder dec(src, h.dir, o);
  for (uint64_t ti = 0; ti < static_cast<uint64_t>(h.info.n_tensors) && per_tensor > 0; ++ti)
    for (int64_t ci = 0; ci < per_tensor; ++ci) dec.check_descriptors(plain_chunk(h, ti, ci));
  out.tensors.assign(static_cast<size_t>(h.info.n_tensors), {});
  for (size_t ti = 0; ti < out.tensors.size(); ++ti) {
    auto& t = out.tensors[ti];
    t.resize(tensor_elems);
    for (int64_t ci = 0; ci < per_tensor; ++ci) {
      const ChunkExpectation e = plain_chunk(h, ti, ci);
      dec.decode(e);
      std::memcpy(t.data() + static_cast<size_t>(e.first_token) * row_elems, dec.view(0), e.plans[0].shape.bytes());
    }
  }
  return out;
}

}  // namespace

void parse_plain_shape(io::ByteReader& r, Header& h, uint64_t n_chunks) {
  const uint8_t dt = r.u8("dtype");
  io::check(dt == 1 || dt == 2, "plain dtype id {} is unknown (accepted 1 fp16, 2 bf16)", dt);
  h.info.dtype = dt == 1 ? DType::kF16 : DType::kBF16;
  for (int i = 0; i < 7; ++i) io::check(r.u8("reserved") == 0, "plain header reserved bytes must be 0");
  const uint64_t nt = r.u64("n_tensors"), tokens = r.u64("tokens"), heads = r.u64("heads"), dim = r.u64("head_dim");
  const auto max = static_cast<uint64_t>(kMaxPlainExtent);
  io::check(nt <= max && tokens <= max && heads <= max && dim <= max,
            "plain extents ({} tensors of [{}, {}, {}]) are above {}", nt, tokens, heads, dim, max);
  h.info.n_tensors = static_cast<int64_t>(nt);
  h.info.tokens = static_cast<int64_t>(tokens);
  h.info.heads = static_cast<int64_t>(heads);
  h.info.head_dim = static_cast<int64_t>(dim);
  const uint64_t row = io::sat_mul(io::sat_mul(heads, dim), 2);
  io::check(row <= max, "plain token rows (heads {} × head_dim {} × 2 bytes) are above {} bytes", heads, dim, max);
  const int64_t T = h.info.chunk_tokens;
  const uint64_t per_tensor = static_cast<uint64_t>(chunks_for(static_cast<int64_t>(tokens), T));
  const bool empty = nt == 0 || row == 0;
  io::check(empty || io::sat_mul(nt, per_tensor) == n_chunks,
            "plain n_chunks {} should be n_tensors × ceil(tokens / chunk_tokens) = {}", n_chunks, io::sat_mul(nt, per_tensor));
  io::check(!empty || n_chunks == 0, "plain n_chunks {} must be 0 for empty tensors", n_chunks);
  h.info.decoded_bytes = io::sat_add(io::sat_mul(io::sat_mul(nt, tokens), row), io::sat_mul(nt, sizeof(std::vector<uint16_t>)));
  // Every chunk of a tensor decodes to (its tokens) × row bytes; n_chunks entries fit the header.
  h.chunk_raw.reserve(static_cast<size_t>(n_chunks));
  for (uint64_t i = 0; i < n_chunks; ++i) {
    const int64_t ci = static_cast<int64_t>(i % per_tensor);
    const uint64_t rows = static_cast<uint64_t>(std::min<int64_t>(static_cast<int64_t>(tokens) - ci * T, T));
    h.chunk_raw.push_back(io::sat_mul(rows, row));
  }
  h.max_chunk_raw = io::sat_mul(std::min<uint64_t>(tokens, static_cast<uint64_t>(T)), row);
}

std::vector<uint8_t> serialize_plain(const std::vector<TensorView>& tensors, const ContainerOptions& options) {
  return encode_plain(tensors, options);
}

size_t serialize_plain(const std::vector<TensorView>& tensors, const ContainerOptions& options, uint8_t* out,
                       size_t cap) {
  return copy_out(encode_plain(tensors, options), out, cap, "serialize_plain");
}

size_t serialized_plain_size(const std::vector<TensorView>& tensors, const ContainerOptions& options) {
  return encode_plain(tensors, options).size();
}

PlainCache deserialize_plain(const uint8_t* data, size_t size, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_plain(src, options);
}

}  // namespace e8kv::container
