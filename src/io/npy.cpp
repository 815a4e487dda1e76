#include "io/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "kernels/dtype.h"

namespace moe {

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw IoError("npy file '" + source + "': " + what);
}

// The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Only what numpy.lib.format writes is accepted: these three keys, string / bool / tuple-of-int values.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class DictParser {
 public:
  DictParser(std::string_view s, const std::string& source) : s_(s), source_(source) {}

  NpyHeader parse() {
    NpyHeader h;
    bool seen[3] = {false, false, false};
    expect('{');
    while (skip_ws(), peek() != '}') {
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        h.descr = string_literal();
        seen[0] = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        seen[1] = true;
      } else if (key == "shape") {
        h.shape = tuple();
        seen[2] = true;
      } else {
        fail(source_, "unexpected header key '" + key + "'");
      }
      skip_ws();
      if (peek() == ',') ++pos_;
    }
    if (!seen[0] || !seen[1] || !seen[2]) fail(source_, "header lacks 'descr', 'fortran_order' or 'shape'");
    return h;
  }

 private:
  char peek() const {
    if (pos_ >= s_.size()) fail(source_, "header ends early");
    return s_[pos_];
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(source_, std::string("header: expected '") + c + "' at byte " + std::to_string(pos_));
    ++pos_;
  }
  std::string string_literal() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail(source_, "header: expected a string at byte " + std::to_string(pos_));
    const size_t end = s_.find(q, pos_ + 1);
    if (end == std::string_view::npos) fail(source_, "header: unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_ws();
    if (s_.substr(pos_, 4) == "True") return pos_ += 4, true;
    if (s_.substr(pos_, 5) == "False") return pos_ += 5, false;
    fail(source_, "header: 'fortran_order' must be True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> out;
    expect('(');
    while (skip_ws(), peek() != ')') {
      int64_t v = 0;
      bool digits = false;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (INT64_MAX - 9) / 10) fail(source_, "header: shape dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
        digits = true;
      }
      if (!digits) fail(source_, "header: shape must be a tuple of non-negative integers");
      out.push_back(v);
      skip_ws();
      if (peek() == ',') ++pos_;
    }
    ++pos_;
    return out;
  }

  std::string_view s_;
  const std::string& source_;
  size_t pos_ = 0;
};

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& source) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (INT64_MAX / 8) / d) fail(source, "shape " + shape_to_string(shape) + " is too large");
    n *= d;
  }
  return n;
}

void write_npy_raw(const std::string& path, const char* descr, const void* data, size_t elem,
                   const std::vector<int64_t>& shape) {
  std::string shape_s = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_s += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  shape_s += ")";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape_s + ", }";
  // Version 1.0 has a u16 header length; the magic + length + dict + '\n' is padded to 64 bytes.
  const bool v2 = dict.size() + 11 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string head("\x93NUMPY", 6);
  head += static_cast<char>(v2 ? 2 : 1);
  head += '\0';
  const size_t hl = dict.size();
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) head += static_cast<char>((hl >> (8 * i)) & 0xff);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // Written whole to PATH.tmp, then renamed: a failure half way leaves neither file.
  const std::string tmp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << head << dict;
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(static_cast<size_t>(numel) * elem));
    written = static_cast<bool>(out.flush());
    out.close();
    written = written && !out.fail();
  }
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IoError("cannot write '" + path + "'" + (written ? " (rename failed)" : " (disk full or not writable?)"));
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

FloatArray parse_npy(const uint8_t* bytes, uint64_t size, const std::string& source) {
  if (size < 10 || std::memcmp(bytes, "\x93NUMPY", 6) != 0) fail(source, "not an .npy file (bad magic)");
  const int major = bytes[6];
  if (major < 1 || major > 3) fail(source, "unsupported format version " + std::to_string(major));
  const size_t prefix = major == 1 ? 10 : 12;
  if (size < prefix) fail(source, "truncated header");
  uint64_t hl = bytes[8] | (uint64_t{bytes[9]} << 8);
  if (major > 1) hl |= (uint64_t{bytes[10]} << 16) | (uint64_t{bytes[11]} << 24);
  if (hl > size - prefix) fail(source, "header length " + std::to_string(hl) + " runs past the end of the file");
  const NpyHeader h =
      DictParser(std::string_view(reinterpret_cast<const char*>(bytes + prefix), hl), source).parse();
  if (h.fortran_order) fail(source, "fortran_order True is not supported; save a C-order array (np.ascontiguousarray)");
  size_t elem = 0;
  if (h.descr == "<f4") elem = 4;
  if (h.descr == "<u2") elem = 2;
  if (elem == 0) fail(source, "dtype '" + h.descr + "' is not supported (expected '<f4' float32, or '<u2' bf16 bits)");
  FloatArray a;
  a.shape = h.shape;
  const int64_t n = checked_numel(h.shape, source);
  const uint64_t data = size - prefix - hl;
  if (data != static_cast<uint64_t>(n) * elem)
    fail(source, "shape " + shape_to_string(h.shape) + " of '" + h.descr + "' needs " +
                     std::to_string(static_cast<uint64_t>(n) * elem) + " data bytes, the file has " + std::to_string(data));
  a.values.resize(static_cast<size_t>(n));
  const uint8_t* src = bytes + prefix + hl;
  if (elem == 4) {
    if (n > 0) std::memcpy(a.values.data(), src, static_cast<size_t>(n) * 4);  // an empty vector's data() may be null
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      a.values[static_cast<size_t>(i)] = bf16_to_f32(b);
    }
  }
  return a;
}

FloatArray read_npy(const std::string& path) {
  MappedFile f(path);
  return parse_npy(f.data(), f.size(), path);
}

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_npy_raw(path, "<f4", data, 4, shape);
}

void write_npy_bf16(const std::string& path, const uint16_t* bits, const std::vector<int64_t>& shape) {
  write_npy_raw(path, "<u2", bits, 2, shape);
}

void write_activations_safetensors(const std::string& path, const float* data, const std::vector<int64_t>& shape,
                                   const std::string& name) {
  write_safetensors(path, {{{name, StDType::kF32, shape}, data}});
}

FloatArray read_activations_safetensors(const std::string& path, const std::string& name) {
  auto f = SafetensorsFile::open(path);
  const auto& tensors = f->header().tensors;
  if (name.empty() && tensors.size() != 1)
    throw IoError("safetensors file '" + path + "' holds " + std::to_string(tensors.size()) +
                  " tensors; name the one to read");
  const TensorInfo& t = name.empty() ? tensors.front() : f->get(name);
  if (t.dtype != StDType::kF32 && t.dtype != StDType::kBF16)
    throw IoError("safetensors file '" + path + "': tensor '" + t.name + "' has dtype " +
                  std::string(st_dtype_name(t.dtype)) + ", expected F32 or BF16");
  FloatArray a;
  a.shape = t.shape;
  a.values.resize(static_cast<size_t>(t.numel()));
  const auto* src = static_cast<const uint8_t*>(f->data(t));
  if (t.dtype == StDType::kF32) {
    if (t.bytes() > 0) std::memcpy(a.values.data(), src, t.bytes());  // as in parse_npy: no null memcpy
  } else {
    for (size_t i = 0; i < a.values.size(); ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      a.values[i] = bf16_to_f32(b);
    }
  }
  return a;
}

FloatArray read_activations(const std::string& path) {
  if (ends_with(path, ".npy")) return read_npy(path);
  if (ends_with(path, ".safetensors")) return read_activations_safetensors(path);
  throw IoError("activation file '" + path + "': expected a .npy or .safetensors file name");
}

void write_activations(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  if (ends_with(path, ".npy")) return write_npy(path, data, shape);
  if (ends_with(path, ".safetensors")) return write_activations_safetensors(path, data, shape);
  throw IoError("activation file '" + path + "': expected a .npy or .safetensors file name");
}

void expect_shape(const FloatArray& a, const std::vector<int64_t>& expected, const std::string& source) {
  if (!expected.empty() && a.shape != expected)
    throw IoError("'" + source + "' has shape " + shape_to_string(a.shape) + ", expected " + shape_to_string(expected));
}

}  // namespace moe
