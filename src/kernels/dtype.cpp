#include "kernels/dtype.h"

#include <cmath>

namespace moe {

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  // Enumerate by magnitude: codes 0..0x7e are monotonic in value. Pick the nearest, ties to even code.
  int lo = 0, hi = 0x7e;
  while (lo < hi) {  // smallest code whose value >= a
    const int mid = (lo + hi) / 2;
    if (fp8e4m3_to_f32(static_cast<uint8_t>(mid)) < a) lo = mid + 1; else hi = mid;
  }
  int code = lo;
  if (code > 0) {
    const float above = fp8e4m3_to_f32(static_cast<uint8_t>(code));
    const float below = fp8e4m3_to_f32(static_cast<uint8_t>(code - 1));
    if (a - below < above - a || (a - below == above - a && ((code - 1) & 1) == 0)) code -= 1;
  }
  return sign | static_cast<uint8_t>(code);
}

}  // namespace moe
