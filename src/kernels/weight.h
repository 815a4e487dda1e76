// A read-only view of one weight matrix, stored [rows = out, cols = in] as in the checkpoints (y = x W^T).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace moe {

// How the bytes behind WeightView::data are arranged.
//   kRowMajor: the checkpoint layout, row r at data + r * cols * dtype_size.
//   kPacked:   reserved for a SIMD-friendly layout made once at load; none is implemented (the kernels'
//              README says why), and the kernels take row-major views only.
enum class WeightLayout : uint8_t { kRowMajor, kPacked };

struct WeightView {
  DType dtype = DType::kF32;
  WeightLayout layout = WeightLayout::kRowMajor;
  const void* data = nullptr;
  int64_t rows = 0;  // out features
  int64_t cols = 0;  // in features
  // fp8 only: [ceil(rows / 128), ceil(cols / 128)] row-major, W = fp8 * scale_inv of the block.
  const float* scale_inv = nullptr;
  // fp8 only, optional: [rows, ceil(cols / 128)] row-major, the Fp8Codes of each row's 128-column blocks, as
  // fp8_block_codes() writes them once when the weights are made or loaded. The SIMD kernels then pick each
  // block's decoding without scanning its bytes; null: they scan each block as they read it (same bits).
  const uint8_t* fp8_codes = nullptr;
  // int4 only (dtype.h): data holds [rows, cols / 8] int32 words, group_scale [rows, cols / group_size] bf16,
  // W[r, c] = field * group_scale[r, c / group_size]; cols is a multiple of group_size, itself of 8.
  const uint16_t* group_scale = nullptr;
  int64_t group_size = 0;

  bool empty() const { return data == nullptr; }
  // Bytes of weight data (and scales) a full read of this matrix touches (int4: the scales only when
  // group_size is set).
  int64_t bytes() const;
  // Rows [r0, r1) as a view of its own (row-major only; fp8 needs r0 % 128 == 0; int4 takes any r0).
  WeightView row_slice(int64_t r0, int64_t r1) const;
};

// Which codes one row's 128-column block of an fp8 matrix holds, the worst of them: each class needs a
// slower decoding in the SIMD kernels (only normal codes; a zero or subnormal code; a NaN code, S.1111.111).
enum Fp8Codes : uint8_t { kFp8Normal = 0, kFp8Subnormal = 1, kFp8NaN = 2 };

// Rows x ceil(cols / 128) bytes, for fp8_block_codes().
int64_t fp8_block_codes_size(const WeightView& w);
// Classifies every row's 128-column blocks of fp8 matrix w into out[fp8_block_codes_size(w)] (one read of
// the codes; the scales play no part).
void fp8_block_codes(const WeightView& w, uint8_t* out);

// One weight element as fp32 (row-major views): the scalar definition every kernel is tested against.
float weight_at(const WeightView& w, int64_t r, int64_t c);

}  // namespace moe
