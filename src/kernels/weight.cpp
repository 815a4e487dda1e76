#include "kernels/weight.h"

#include <algorithm>
#include <cassert>

namespace moe {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int64_t WeightView::bytes() const {
  if (dtype == DType::kInt4) return rows * (cols / 2) + (group_size > 0 ? rows * (cols / group_size) * 2 : 0);
  int64_t n = rows * cols * static_cast<int64_t>(dtype_size(dtype));
  if (dtype == DType::kF8E4M3) n += ceil_div(rows, 128) * ceil_div(cols, 128) * 4;
  return n;
}

WeightView WeightView::row_slice(int64_t r0, int64_t r1) const {
  assert(layout == WeightLayout::kRowMajor && 0 <= r0 && r0 <= r1 && r1 <= rows);
  WeightView v = *this;
  v.rows = r1 - r0;
  if (dtype == DType::kInt4) {
    v.data = static_cast<const char*>(data) + r0 * (cols / 2);
    v.group_scale = group_scale + r0 * (cols / group_size);
    return v;
  }
  v.data = static_cast<const char*>(data) + r0 * cols * static_cast<int64_t>(dtype_size(dtype));
  if (dtype == DType::kF8E4M3) {
    assert(r0 % 128 == 0);
    v.scale_inv = scale_inv + (r0 / 128) * ceil_div(cols, 128);
    if (fp8_codes != nullptr) v.fp8_codes = fp8_codes + r0 * ceil_div(cols, 128);
  }
  return v;
}

int64_t fp8_block_codes_size(const WeightView& w) { return w.rows * ceil_div(w.cols, 128); }

void fp8_block_codes(const WeightView& w, uint8_t* out) {
  assert(w.dtype == DType::kF8E4M3 && w.layout == WeightLayout::kRowMajor);
  const auto* p = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c0 = 0; c0 < w.cols; c0 += 128) {
      // Branch-free over the block so that the loop vectorises: the magnitude (code & 0x7f) is 0x7f for
      // NaN and below 8 for zero and subnormals.
      const uint8_t* b = p + r * w.cols + c0;
      const int64_t n = std::min<int64_t>(128, w.cols - c0);
      uint8_t nan = 0, small = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t m = b[i] & 0x7f;
        nan |= m == 0x7f;
        small |= m < 8;
      }
      *out++ = nan ? kFp8NaN : small ? kFp8Subnormal : kFp8Normal;
    }
}

float weight_at(const WeightView& w, int64_t r, int64_t c) {
  const int64_t i = r * w.cols + c;
  switch (w.dtype) {
    case DType::kF32: return static_cast<const float*>(w.data)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kF8E4M3:
      return fp8e4m3_to_f32(static_cast<const uint8_t*>(w.data)[i]) *
             w.scale_inv[(r / 128) * ceil_div(w.cols, 128) + c / 128];
    case DType::kInt4: {
      const uint32_t word = static_cast<const uint32_t*>(w.data)[(r * w.cols + c) / kInt4PerWord];
      const float scale = bf16_to_f32(w.group_scale[r * (w.cols / w.group_size) + c / w.group_size]);
      return static_cast<float>(int4_field(word, static_cast<int>(c % kInt4PerWord))) * scale;
    }
  }
  return 0.0f;
}

}  // namespace moe
