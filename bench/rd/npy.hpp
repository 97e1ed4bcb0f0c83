// Minimal NumPy .npy reader/writer for 2-D float32/float16 arrays (C order), with checked parsing.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv::bench {

struct NpyArray {
  size_t rows = 0, cols = 0;
  std::vector<float> data;
};

namespace detail {
inline std::string npy_field(const std::string& header, const std::string& key, const std::string& path) {
  const auto k = header.find("'" + key + "'");
  require(k != std::string::npos, path + ": npy header lacks '" + key + "'");
  const auto colon = header.find(':', k);
  require(colon != std::string::npos, path + ": malformed npy header near '" + key + "'");
  size_t b = colon + 1;
  while (b < header.size() && header[b] == ' ') ++b;
  size_t e = b;
  if (b < header.size() && header[b] == '(') e = header.find(')', b) + 1;
  else if (b < header.size() && header[b] == '\'') e = header.find('\'', b + 1) + 1;
  else while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  require(e != std::string::npos && e > b && e <= header.size(), path + ": malformed npy value of '" + key + "'");
  return header.substr(b, e - b);
}
}  // namespace detail

/// Reads an [N, d] float32 ('<f4') or float16 ('<f2') C-order array; anything else is a clear error.
inline NpyArray load_npy_2d(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  require(f.good(), path + ": cannot open");
  char magic[8];
  f.read(magic, 8);
  require(f.gcount() == 8 && std::memcmp(magic, "\x93NUMPY", 6) == 0, path + ": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  require(major >= 1 && major <= 3, path + ": unsupported npy version " + std::to_string(major));
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    require(f.gcount() == 2, path + ": truncated npy header");
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    require(f.gcount() == 4, path + ": truncated npy header");
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  require(hlen > 0 && hlen < (1u << 20), path + ": implausible npy header length");
  std::string header(hlen, '\0');
  f.read(&header[0], hlen);
  require(f.gcount() == static_cast<std::streamsize>(hlen), path + ": truncated npy header");
  const std::string descr = detail::npy_field(header, "descr", path);
  const std::string order = detail::npy_field(header, "fortran_order", path);
  const std::string shape = detail::npy_field(header, "shape", path);
  require(order == "False", path + ": fortran_order arrays are not supported");
  const bool f32 = descr == "'<f4'", f16 = descr == "'<f2'";
  require(f32 || f16, path + ": dtype " + descr + " is not supported (accepted '<f4', '<f2')");
  size_t dims[2] = {0, 0};
  int nd = 0;
  {
    std::string s = shape.substr(1, shape.size() - 2);
    size_t p = 0;
    while (p < s.size()) {
      while (p < s.size() && (s[p] == ' ' || s[p] == ',')) ++p;
      if (p >= s.size()) break;
      size_t q = p;
      while (q < s.size() && s[q] >= '0' && s[q] <= '9') ++q;
      require(q > p && nd < 2, path + ": shape " + shape + " is not a 2-D shape");
      dims[nd++] = std::stoull(s.substr(p, q - p));
      p = q;
    }
  }
  require(nd == 2, path + ": shape " + shape + " is not [N, d]");
  require(dims[0] > 0 && dims[1] > 0 && dims[0] < (1ull << 32) && dims[1] <= 4096,
          path + ": implausible shape " + shape);
  NpyArray a;
  a.rows = dims[0];
  a.cols = dims[1];
  const size_t n = a.rows * a.cols;
  a.data.resize(n);
  if (f32) {
    f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(n * 4));
    require(f.gcount() == static_cast<std::streamsize>(n * 4), path + ": truncated data");
  } else {
    std::vector<uint16_t> h(n);
    f.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(n * 2));
    require(f.gcount() == static_cast<std::streamsize>(n * 2), path + ": truncated data");
    for (size_t i = 0; i < n; ++i) a.data[i] = fp16_bits_to_float(h[i]);
  }
  return a;
}

/// Writes a C-order float32 array of the given shape (any rank) as .npy version 1.0.
inline void save_npy(const std::string& path, const float* data, const std::vector<size_t>& shape) {
  std::string dims;
  size_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    n *= shape[i];
  }
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  require(f.good(), path + ": cannot write");
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  const char hb[2] = {static_cast<char>(hl & 0xFF), static_cast<char>(hl >> 8)};
  f.write(hb, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
  require(f.good(), path + ": write failed");
}

}  // namespace e8kv::bench
