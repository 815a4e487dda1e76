// The safetensors reader against a corpus of malformed files generated here, each rejected with a message
// naming the file and the offending tensor, and the writer's output read back.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>

using namespace std::string_literals;

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/tensor_store.h"
#include "test_io_util.h"

namespace moe {
namespace {

using test::expect_error;
using test::ScratchDir;

// A file image: u64 N, the header text, `data_bytes` bytes of data (value = index).
std::string image(const std::string& header, size_t data_bytes, int64_t n_override = -1) {
  const uint64_t n = n_override >= 0 ? static_cast<uint64_t>(n_override) : header.size();
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  s += header;
  for (size_t i = 0; i < data_bytes; ++i) s += static_cast<char>(i);
  return s;
}

SafetensorsHeader parse(const std::string& bytes) {
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "bad.safetensors");
}

void expect_rejected(const std::string& bytes, const std::vector<std::string>& words, const std::string& what) {
  std::vector<std::string> w = words;
  w.push_back("bad.safetensors");
  expect_error([&] { parse(bytes); }, w, what);
}

TEST(Safetensors, ValidFileParses) {
  const std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"s":{"dtype":"U8","shape":[],"data_offsets":[16,17]},)"
      R"("z":{"dtype":"F32","shape":[0,5],"data_offsets":[17,17]}}   )";
  const SafetensorsHeader hd = parse(image(h, 17));
  ASSERT_EQ(hd.tensors.size(), 4u);
  EXPECT_EQ(hd.metadata.at("format"), "pt");
  const TensorInfo* b = hd.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, StDType::kBF16);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(b->begin, 8u);
  EXPECT_EQ(hd.find("s")->numel(), 1);
  EXPECT_EQ(hd.find("z")->numel(), 0);
  EXPECT_EQ(hd.find("nope"), nullptr);
  EXPECT_EQ(hd.data_start, 8 + h.size());
}

TEST(Safetensors, EveryDTypeNameIsKnown) {
  for (const char* n : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16", "I32",
                        "U32", "F32", "F64", "I64", "U64", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}) {
    auto t = parse_st_dtype(n);
    ASSERT_TRUE(t.has_value()) << n;
    EXPECT_EQ(st_dtype_name(*t), n);
  }
  EXPECT_FALSE(parse_st_dtype("F12").has_value());
}

TEST(Safetensors, MalformedFilesAreRejectedWithTheirReason) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_rejected(image("", 0).substr(0, 5), {"truncated"}, "truncated length");
  expect_rejected(image("{}", 0, 1000), {"header length 1000", "runs past the end"}, "header beyond file");
  expect_rejected(image("{}", 0, 100'000'001), {"exceeds the limit"}, "header too large");
  expect_rejected(image("{" + a + "," + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                  {"'b'", "overlaps"}, "overlap");
  expect_rejected(image("{" + a + "," + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
                  {"'b'", "gap"}, "gap");
  expect_rejected(image(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), {"'b'", "gap"},
                  "gap at the start");
  expect_rejected(image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), {"'w'", "needs 12"},
                  "wrong dtype size");
  expect_rejected(image(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,12]}})", 12), {"'w'", "needs 6"},
                  "bf16 given f32 bytes");
  expect_rejected(
      image(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      {"'w'", "overflows"}, "shape overflow");
  expect_rejected(
      image(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
      {"'w'", "more than 2^64"}, "byte count overflow");
  expect_rejected(image("{\"a\xff\":{}}", 0), {"UTF-8"}, "bad UTF-8");
  expect_rejected(image(R"({"a": )", 0), {"invalid JSON"}, "bad JSON");
  expect_rejected(image(" {}", 0), {"starting with '{'"}, "not an object");
  expect_rejected(image("{}\0\0"s, 0), {"invalid JSON", "NUL byte"}, "NUL padding");
  expect_rejected(image("{" + a + "," + a + "}", 8), {"duplicate key \"a\""}, "duplicate names");
  expect_rejected(image(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
                  {"duplicate key \"dtype\""}, "duplicate field");
  expect_rejected(image(R"({"q":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", 8), {"'q'", "unknown dtype"},
                  "unknown dtype");
  expect_rejected(image("{" + a + "}", 9), {"file size mismatch"}, "trailing bytes");
  expect_rejected(image("{" + a + "}", 8).substr(0, 8 + 2 + a.size() + 4), {"file size mismatch"}, "truncated data");
  expect_rejected(image(R"({"n":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), {"'n'", "non-negative"},
                  "negative dim");
  expect_rejected(image(R"({"n":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8), {"'n'", "non-negative"},
                  "fractional dim");
  expect_rejected(image(R"({"n":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), {"'n'", "begin > end"},
                  "reversed offsets");
  expect_rejected(image(R"({"n":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), {"'n'", "data_offsets"},
                  "one offset");
  expect_rejected(image(R"({"n":{"dtype":"F32","shape":[2]}})", 8), {"'n'", "missing field \"data_offsets\""},
                  "missing field");
  expect_rejected(image(R"({"n":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
                  {"'n'", "unknown field"}, "extra field");
  expect_rejected(image(R"({"n":[1,2]})", 0), {"'n'", "must be an object"}, "entry not an object");
  expect_rejected(image(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "\"k\""}, "metadata value");
  expect_rejected(image(R"({"f":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2), {"'f'", "whole number"},
                  "sub-byte remainder");
}

TEST(Safetensors, FileErrorsNameThePath) {
  ScratchDir dir;
  test::write_bytes(dir / "empty.safetensors", "");
  expect_error([&] { SafetensorsFile::open(dir / "empty.safetensors"); }, {"empty.safetensors", "truncated"});
  expect_error([&] { SafetensorsFile::open(dir / "none.safetensors"); }, {"none.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, {dir.path(), "not a regular file"});
}

TEST(Safetensors, WriterOutputReadsBackAligned) {
  ScratchDir dir;
  const float a[3] = {1.5f, -2.0f, 3.25f};
  const uint16_t b[4] = {1, 2, 3, 4};
  const uint8_t c[1] = {7};
  write_safetensors(dir / "w.safetensors",
                    {{{"a", StDType::kF32, {3}}, a}, {{"c", StDType::kU8, {}}, c}, {{"b", StDType::kBF16, {2, 2}}, b}},
                    {{"format", "pt"}});
  auto f = SafetensorsFile::open(dir / "w.safetensors");
  EXPECT_EQ(f->header().data_start % 8, 0u);
  EXPECT_EQ(f->header().metadata.at("format"), "pt");
  EXPECT_EQ(std::memcmp(f->data(f->get("a")), a, sizeof(a)), 0);
  EXPECT_EQ(std::memcmp(f->data(f->get("b")), b, sizeof(b)), 0);
  EXPECT_EQ(*static_cast<const uint8_t*>(f->data(f->get("c"))), 7);
  expect_error([&] { f->get("zz"); }, {"'zz'", "w.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(dir / "w.safetensors.tmp." + std::to_string(::getpid())));
}

TEST(Safetensors, WriterLeavesNothingOnError) {
  ScratchDir dir;
  const float a[2] = {1, 2};
  {
    SafetensorsWriter w(dir / "p.safetensors", {{"a", StDType::kF32, {2}}, {"b", StDType::kF32, {2}}});
    w.write("a", a, 8);
    expect_error([&] { w.write("a", a, 4); }, {"'a'", "more than"});
    expect_error([&] { w.finish(); }, {"'b'", "incomplete"});
  }
  {
    SafetensorsWriter w(dir / "p.safetensors", {{"a", StDType::kF32, {2}}, {"b", StDType::kF32, {2}}});
    expect_error([&] { w.write("b", a, 8); }, {"'b'", "out of the declared order"});
  }
  expect_error([&] { SafetensorsWriter w(dir / "d.safetensors", {{"a", StDType::kF32, {1}}, {"a", StDType::kF32, {1}}}); },
               {"duplicate", "'a'"});
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TensorStore, SingleFileAndIndexErrors) {
  ScratchDir dir;
  const float a[2] = {1, 2};
  expect_error([&] { TensorStore s(dir.path()); }, {dir.path(), "neither"});
  write_safetensors(dir / "model.safetensors", {{{"a", StDType::kF32, {2}}, a}});
  {
    TensorStore s(dir.path());
    EXPECT_TRUE(s.contains("a"));
    EXPECT_EQ(s.get("a").info->numel(), 2);
    expect_error([&] { s.get("b"); }, {"'b'", "model.safetensors"});
  }
  test::write_bytes(dir / "model.safetensors.index.json",
                    R"({"metadata":{},"weight_map":{"a":"model.safetensors","b":"model.safetensors","c":"gone.safetensors"}})");
  TensorStore s(dir.path());
  EXPECT_EQ(s.source(), dir / "model.safetensors.index.json");
  EXPECT_FLOAT_EQ(static_cast<const float*>(s.get("a").data)[1], 2.0f);
  expect_error([&] { s.get("b"); }, {"'b'", "does not hold it", "index.json"});
  expect_error([&] { s.get("c"); }, {"gone.safetensors", "does not exist", "index.json"});
  expect_error([&] { s.get("d"); }, {"'d'", "not found", "index.json"});
  test::write_bytes(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  expect_error([&] { TensorStore t(dir.path()); }, {"'a'", "relative file name"});
  test::write_bytes(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"x","a":"y"}})");
  expect_error([&] { TensorStore t(dir.path()); }, {"duplicate key \"a\"", "index.json"});
  test::write_bytes(dir / "model.safetensors.index.json", R"({"weights":{}})");
  expect_error([&] { TensorStore t(dir.path()); }, {"weight_map", "index.json"});
}

}  // namespace
}  // namespace moe
