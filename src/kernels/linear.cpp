// Scalar kernels: the reference every SIMD path is tested against, and the fallback on any CPU.
#include "kernels/linear.h"

#include <stdexcept>

namespace moe {

namespace {
Isa g_active = Isa::kScalar;

// One dot product in a fixed order (k ascending, fp32 accumulation): the determinism contract holds.
float dot_row(const float* x, const WeightView& w, int64_t n) {
  float acc = 0.0f;
  for (int64_t k = 0; k < w.cols; ++k) acc += x[k] * weight_at(w, n, k);
  return acc;
}
}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}
Isa best_isa() { return Isa::kScalar; }
bool isa_supported(Isa isa) { return isa == Isa::kScalar; }
Isa active_isa() { return g_active; }
void set_active_isa(Isa isa) {
  if (!isa_supported(isa)) throw std::invalid_argument("ISA " + std::string(isa_name(isa)) + " not available");
  g_active = isa;
}

void linear(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
            int64_t ldy) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) y[m * ldy + n] = dot_row(x + m * ldx, w, n);
}

void silu_mul(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = silu(g[i]) * u[i];
}

void gate_up_silu(const float* x, int64_t M, int64_t ldx, const WeightView& gate, const WeightView& up,
                  int64_t i0, int64_t i1, float* h, int64_t ldh) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = i0; i < i1; ++i) {
      const float g = dot_row(x + m * ldx, gate, i);
      const float u = dot_row(x + m * ldx, up, i);
      h[m * ldh + i] = silu(g) * u;
    }
}

}  // namespace moe
