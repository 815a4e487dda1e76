// Activations in and out of the tools as files a user can open in NumPy or PyTorch directly:
//   .npy (format 1.0/2.0/3.0; written as 1.0, or 2.0 when the header needs it): '<f4' float32, C order.
//   Reading also accepts '<u2' as bf16 bit patterns (NumPy has no bfloat16; the usual convention is to store
//   torch.bfloat16 tensors as t.view(torch.int16).numpy().astype('<u2') or uint16); they are widened to fp32.
//   .safetensors with one tensor (F32, or BF16 widened to fp32 on read).
//
//   write_npy("x.npy", x.data(), {num_tokens, hidden});
//   FloatArray x = read_activations("x.npy");   // or .safetensors
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/io_error.h"

namespace moe {

struct FloatArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, product(shape) elements
};

// Throws IoError naming the file: bad magic or header, fortran_order True, a dtype other than '<f4'/'<u2',
// a data size that does not match the shape.
FloatArray read_npy(const std::string& path);
// Parses an .npy image held in memory; `source` names it in errors.
FloatArray parse_npy(const uint8_t* bytes, uint64_t size, const std::string& source);
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// '<u2' holding bf16 bits.
void write_npy_bf16(const std::string& path, const uint16_t* bits, const std::vector<int64_t>& shape);

// One F32 tensor `name` (default "activations").
void write_activations_safetensors(const std::string& path, const float* data, const std::vector<int64_t>& shape,
                                   const std::string& name = "activations");
// The file's only tensor, or `name` if given; F32 or BF16.
FloatArray read_activations_safetensors(const std::string& path, const std::string& name = "");

// By extension: .npy or .safetensors. Throws IoError for anything else.
FloatArray read_activations(const std::string& path);
void write_activations(const std::string& path, const float* data, const std::vector<int64_t>& shape);

// If `expected` is non-empty, throws IoError naming the file when shapes differ (for CLI input checks).
void expect_shape(const FloatArray& a, const std::vector<int64_t>& expected, const std::string& source);

}  // namespace moe
