// Element types of weights and their conversions to fp32 (activations are always fp32).
//
// bf16: the top 16 bits of an fp32 (bf16 -> f32 is exact: bits << 16).
// fp8 e4m3fn (DeepSeek-V3 / Kimi-K2 checkpoints): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinity,
// NaN = S.1111.111, max 448, subnormals m/8 * 2^-6. Weights carry a float scale_inv per 128x128 block:
// W[r, c] = fp8(W[r, c]) * scale_inv[r / 128, c / 128].
// int4 (compressed-tensors "pack-quantized", Kimi-K2-Thinking's routed experts): symmetric group-wise int4,
// eight 4-bit fields per int32 word (column 8j + i in bits 4i..4i+3 of word j), each field the value + 8, so
// values in [-8, 7]; one bf16 scale per group of input columns: W[r, c] = value * scale[r, c / group].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace moe {

enum class DType : uint8_t { kF32, kBF16, kF8E4M3, kInt4 };

// Bytes per element; 0 for int4, which is half a byte (WeightView::bytes() counts its words and scales).
inline constexpr size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : t == DType::kBF16 ? 2 : t == DType::kF8E4M3 ? 1 : 0;
}
inline constexpr std::string_view dtype_name(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : t == DType::kF8E4M3 ? "fp8" : "int4";
}

// Columns per int32 word of an int4 matrix.
inline constexpr int64_t kInt4PerWord = 8;
// Field i (column 8j + i) of a packed int4 word as its signed value in [-8, 7].
inline constexpr int int4_field(uint32_t word, int i) { return static_cast<int>((word >> (4 * i)) & 0xfu) - 8; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float fp8e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man) / 8.0f, -6);
  return sign * std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
}

// Round to nearest even, saturating at +-448 (the convention of fp8 weight quantisers). NaN -> NaN.
uint8_t f32_to_fp8e4m3(float f);

}  // namespace moe
