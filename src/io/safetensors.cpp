#include "io/safetensors.h"

#include <algorithm>
#include <cstring>

#include "io/json_util.h"
#include "io/mapped_file.h"

namespace moe {

namespace {

struct DTypeEntry {
  StDType type;
  const char* name;
  int bits;
};
constexpr DTypeEntry kDTypes[] = {
    {StDType::kBool, "BOOL", 8},          {StDType::kU8, "U8", 8},
    {StDType::kI8, "I8", 8},              {StDType::kF8E5M2, "F8_E5M2", 8},
    {StDType::kF8E4M3, "F8_E4M3", 8},     {StDType::kF8E8M0, "F8_E8M0", 8},
    {StDType::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8}, {StDType::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {StDType::kI16, "I16", 16},           {StDType::kU16, "U16", 16},
    {StDType::kF16, "F16", 16},           {StDType::kBF16, "BF16", 16},
    {StDType::kI32, "I32", 32},           {StDType::kU32, "U32", 32},
    {StDType::kF32, "F32", 32},           {StDType::kF64, "F64", 64},
    {StDType::kC64, "C64", 64},           {StDType::kI64, "I64", 64},
    {StDType::kU64, "U64", 64},           {StDType::kF4, "F4", 4},
    {StDType::kF6E2M3, "F6_E2M3", 6},     {StDType::kF6E3M2, "F6_E3M2", 6},
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw IoError("safetensors file '" + file + "': " + what);
}
[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor, const std::string& what) {
  fail(file, "tensor '" + tensor + "': " + what);
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON value that must be a non-negative integer fitting in int64 (nlohmann stores big ones as unsigned).
bool as_offset(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

std::vector<int64_t> parse_shape(const nlohmann::json& v, const std::string& file, const std::string& name) {
  if (!v.is_array()) fail_tensor(file, name, "\"shape\" must be an array of integers, got " + json_type_name(v));
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  for (const auto& d : v) {
    uint64_t n = 0;
    if (!as_offset(d, &n) || n > static_cast<uint64_t>(INT64_MAX))
      fail_tensor(file, name, "\"shape\" entries must be non-negative integers, got " + d.dump());
    if (n != 0 && numel > static_cast<uint64_t>(INT64_MAX) / n)
      fail_tensor(file, name, "shape " + v.dump() + " overflows: more than 2^63 elements");
    numel *= n;
    shape.push_back(static_cast<int64_t>(n));
  }
  return shape;
}

TensorInfo parse_entry(const std::string& name, const nlohmann::json& v, const std::string& file) {
  if (!v.is_object()) fail_tensor(file, name, "entry must be an object, got " + json_type_name(v));
  for (const auto& [key, _] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail_tensor(file, name, "unknown field \"" + key + "\" (expected dtype, shape, data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail_tensor(file, name, std::string("missing field \"") + key + "\"");
  TensorInfo t;
  t.name = name;
  const auto& dt = v["dtype"];
  if (!dt.is_string()) fail_tensor(file, name, "\"dtype\" must be a string, got " + json_type_name(dt));
  auto parsed = parse_st_dtype(dt.get_ref<const std::string&>());
  if (!parsed) fail_tensor(file, name, "unknown dtype \"" + dt.get<std::string>() + "\"");
  t.dtype = *parsed;
  t.shape = parse_shape(v["shape"], file, name);
  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !as_offset(off[0], &t.begin) || !as_offset(off[1], &t.end))
    fail_tensor(file, name, "\"data_offsets\" must be [begin, end] of non-negative integers, got " + off.dump());
  if (t.begin > t.end)
    fail_tensor(file, name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                "] has begin > end");
  // numel * bits fits: numel < 2^63 and bits <= 64 would not, so check in 128-bit arithmetic.
  const unsigned __int128 bits = static_cast<unsigned __int128>(t.numel()) * st_dtype_bits(t.dtype);
  if (bits % 8 != 0)
    fail_tensor(file, name, "shape " + t.shape_str() + " of " + std::string(st_dtype_name(t.dtype)) +
                                " is not a whole number of bytes");
  if (bits / 8 != t.bytes())
    fail_tensor(file, name, "data_offsets span " + std::to_string(t.bytes()) + " bytes, but shape " + t.shape_str() +
                                " of " + std::string(st_dtype_name(t.dtype)) + " needs " +
                                (bits / 8 > UINT64_MAX ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(bits / 8))));
  return t;
}

std::map<std::string, std::string> parse_metadata(const nlohmann::json& v, const std::string& file) {
  std::map<std::string, std::string> m;
  if (v.is_null()) return m;
  if (!v.is_object()) fail(file, "\"__metadata__\" must be an object of strings, got " + json_type_name(v));
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      fail(file, "\"__metadata__\" value of \"" + key + "\" must be a string, got " + json_type_name(value));
    m[key] = value.get<std::string>();
  }
  return m;
}

// Sorted by offset, the tensors must cover [0, data_size) exactly once.
void check_tiling(std::vector<const TensorInfo*> by_offset, uint64_t data_size, const std::string& file) {
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin != cursor) {
      const std::string after = prev ? "tensor '" + prev->name + "' ends at " + std::to_string(cursor)
                                     : "the data buffer starts at 0";
      fail_tensor(file, t->name,
                  std::string(t->begin < cursor ? "overlaps the previous tensor" : "leaves a gap") +
                      ": data_offsets begin at " + std::to_string(t->begin) + ", but " + after);
    }
    cursor = t->end;
    prev = t;
  }
  if (cursor != data_size)
    fail(file, "file size mismatch: the tensors end at data offset " + std::to_string(cursor) +
                   " but the data buffer holds " + std::to_string(data_size) + " bytes");
}

}  // namespace

std::string_view st_dtype_name(StDType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.name;
  return "?";
}

int st_dtype_bits(StDType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.bits;
  return 0;
}

std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const auto& e : kDTypes)
    if (name == e.name) return e.type;
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded by parse_shape
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string TensorInfo::shape_str() const { return shape_to_string(shape); }

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

SafetensorsHeader parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& file) {
  if (size < 8) fail(file, "truncated: " + std::to_string(size) + " bytes, need at least 8 for the header length");
  SafetensorsHeader h;
  h.header_size = read_u64_le(bytes);
  if (h.header_size > kMaxSafetensorsHeader)
    fail(file, "header length " + std::to_string(h.header_size) + " exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeader) + " bytes");
  if (h.header_size > size - 8)
    fail(file, "header length " + std::to_string(h.header_size) + " runs past the end of the file (" +
                   std::to_string(size) + " bytes)");
  h.data_start = 8 + h.header_size;
  const std::string_view text(reinterpret_cast<const char*>(bytes + 8), h.header_size);
  if (text.empty() || text.front() != '{') fail(file, "header must be a JSON object starting with '{'");
  nlohmann::json root;
  try {
    root = parse_json_strict(text);
  } catch (const std::runtime_error& e) {
    fail(file, std::string("header: ") + e.what());
  }
  if (!root.is_object()) fail(file, "header must be a JSON object, got " + json_type_name(root));
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      h.metadata = parse_metadata(value, file);
    } else {
      h.tensors.push_back(parse_entry(key, value, file));
    }
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : h.tensors) by_offset.push_back(&t);
  check_tiling(std::move(by_offset), size - h.data_start, file);
  return h;
}

SafetensorsFile::~SafetensorsFile() = default;

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->header_ = parse_safetensors(f->map_->data(), f->map_->size(), path);
  return f;
}

const TensorInfo& SafetensorsFile::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) throw IoError("tensor '" + std::string(name) + "' not found in '" + path_ + "'");
  return *t;
}

const void* SafetensorsFile::data(const TensorInfo& t) const {
  return map_->data() + header_.data_start + t.begin;
}

}  // namespace moe
