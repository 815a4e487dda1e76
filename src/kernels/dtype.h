// Element types of weights and their conversions to fp32 (activations are always fp32).
//
// bf16: the top 16 bits of an fp32 (bf16 -> f32 is exact: bits << 16).
// fp8 e4m3fn (DeepSeek-V3 / Kimi-K2 checkpoints): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinity,
// NaN = S.1111.111, max 448, subnormals m/8 * 2^-6. Weights carry a float scale_inv per 128x128 block:
// W[r, c] = fp8(W[r, c]) * scale_inv[r / 128, c / 128].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace moe {

enum class DType : uint8_t { kF32, kBF16, kF8E4M3 };

inline constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : t == DType::kBF16 ? 2 : 1; }
inline constexpr std::string_view dtype_name(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "fp8";
}

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
