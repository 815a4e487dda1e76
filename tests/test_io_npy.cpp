// Activation files: .npy written as NumPy does and read back, NumPy's own header spellings, bf16 as '<u2',
// and the one-tensor safetensors form; malformed files rejected naming the file.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "io/npy.h"
#include "io/safetensors_writer.h"
#include "kernels/dtype.h"
#include "test_io_util.h"

namespace moe {
namespace {

using test::expect_error;
using test::ScratchDir;

// An .npy image as numpy.save writes it (version 1.0, header padded to 64 bytes, ends in '\n').
std::string npy(const std::string& dict, const std::string& data, int version = 1) {
  const size_t prefix = version == 1 ? 10 : 12;
  std::string d = dict;
  d.append((64 - (prefix + d.size() + 1) % 64) % 64, ' ');
  d += '\n';
  std::string s("\x93NUMPY", 6);
  s += static_cast<char>(version);
  s += '\0';
  for (size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) s += static_cast<char>((d.size() >> (8 * i)) & 0xff);
  return s + d + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

FloatArray parse(const std::string& bytes) {
  return parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x.npy");
}

TEST(Npy, RoundTripsF32) {
  ScratchDir dir;
  const std::vector<float> v = {1.0f, -2.5f, 3.0f, 0.125f, 1e-20f, -0.0f};
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{2, 3}, {6}, {1, 2, 3}}) {
    write_npy(dir / "a.npy", v.data(), shape);
    const FloatArray a = read_npy(dir / "a.npy");
    EXPECT_EQ(a.shape, shape);
    ASSERT_EQ(a.values.size(), v.size());
    EXPECT_EQ(std::memcmp(a.values.data(), v.data(), v.size() * 4), 0);
  }
  write_npy(dir / "s.npy", v.data(), {});
  EXPECT_EQ(read_npy(dir / "s.npy").values.size(), 1u);
  std::string bytes;
  {
    std::ifstream in(dir / "a.npy", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_EQ((bytes.size() - v.size() * 4) % 64, 0u);  // data 64-byte aligned, as NumPy writes it
}

TEST(Npy, ReadsNumpySpellingsAndBf16Bits) {
  const FloatArray a = parse(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", floats({1, 2, 3, 4})));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a.values[3], 4.0f);
  const FloatArray b = parse(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", floats({1, 2, 3}), 2));
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3}));
  const uint16_t bits[2] = {f32_to_bf16(1.5f), f32_to_bf16(-3.0f)};
  const FloatArray c = parse(npy("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }",
                                 std::string(reinterpret_cast<const char*>(bits), 4)));
  EXPECT_EQ(c.values[0], 1.5f);
  EXPECT_EQ(c.values[1], -3.0f);
  ScratchDir dir;
  write_npy_bf16(dir / "b.npy", bits, {1, 2});
  EXPECT_EQ(read_activations(dir / "b.npy").values[1], -3.0f);
}

// Arrays with a zero dimension hold no values (found by fuzz_npy: the copy of zero values used to pass a
// null pointer to memcpy, undefined behaviour that UBSan reports).
TEST(Npy, EmptyArraysParse) {
  const FloatArray a = parse(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 64), }", ""));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{0, 64}));
  EXPECT_TRUE(a.values.empty());
  const FloatArray b = parse(npy("{'descr': '<u2', 'fortran_order': False, 'shape': (3, 0), }", ""));
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3, 0}));
  EXPECT_TRUE(b.values.empty());
  ScratchDir dir;
  write_npy(dir / "e.npy", nullptr, {0, 8});
  EXPECT_EQ(read_activations(dir / "e.npy").shape, (std::vector<int64_t>{0, 8}));
  write_activations(dir / "e.safetensors", nullptr, {0, 8});
  const FloatArray c = read_activations(dir / "e.safetensors");
  EXPECT_EQ(c.shape, (std::vector<int64_t>{0, 8}));
  EXPECT_TRUE(c.values.empty());
}

TEST(Npy, MalformedFilesAreRejected) {
  auto rejects = [](const std::string& bytes, const std::string& word) {
    expect_error([&] { parse(bytes); }, {"x.npy", word}, word);
  };
  rejects("hello", "magic");
  rejects(npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", floats({1, 2})), "fortran_order");
  rejects(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", floats({1, 2})), "'<f8'");
  rejects(npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2})), "'>f4'");
  rejects(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", floats({1, 2})), "needs 12");
  rejects(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats({1, 2})), "needs 4");
  rejects(npy("{'descr': '<f4', 'shape': (2,), }", floats({1, 2})), "lacks");
  rejects(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", ""), "shape");
  rejects(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", ""), "too large");
  rejects(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", ""), "header");
  rejects(npy("{}", "").substr(0, 9), "magic");
  std::string big = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats({1}));
  big[8] = '\xff';
  big[9] = '\x7f';
  rejects(big, "past the end");
  ScratchDir dir;
  expect_error([&] { read_npy(dir / "none.npy"); }, {"none.npy"});
  expect_error([&] { read_activations(dir / "x.txt"); }, {"x.txt", ".npy or .safetensors"});
}

TEST(Npy, SafetensorsActivations) {
  ScratchDir dir;
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  write_activations(dir / "x.safetensors", v.data(), {3, 2});
  const FloatArray a = read_activations(dir / "x.safetensors");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.values, v);
  expect_shape(a, {3, 2}, "x");
  expect_error([&] { expect_shape(a, {2, 3}, dir / "x.safetensors"); }, {"x.safetensors", "[3, 2]", "expected [2, 3]"});
  const uint16_t bits[2] = {f32_to_bf16(0.5f), f32_to_bf16(8.0f)};
  write_safetensors(dir / "two.safetensors",
                    {{{"y", StDType::kBF16, {2}}, bits}, {{"z", StDType::kF32, {6}}, v.data()}});
  EXPECT_EQ(read_activations_safetensors(dir / "two.safetensors", "y").values[1], 8.0f);
  expect_error([&] { read_activations(dir / "two.safetensors"); }, {"two.safetensors", "holds 2 tensors"});
  const int32_t ints[1] = {3};
  write_safetensors(dir / "i.safetensors", {{{"i", StDType::kI32, {1}}, ints}});
  expect_error([&] { read_activations(dir / "i.safetensors"); }, {"'i'", "I32", "F32 or BF16"});
}

}  // namespace
}  // namespace moe
