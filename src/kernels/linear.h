// Linear (y = x W^T) kernels on fp32 activations and f32 / bf16 / fp8-block-scaled weights.
//
// Determinism contract, relied on by the layer's bitwise guarantees: the bits of y[m, n] depend only on
// row m of x, row n of W and the ISA; not on M, on the [n0, n1) range, on the thread, or on which other rows
// are computed in the same call. So tiles may be cut anywhere and tokens grouped any way.
//
// Every kernel takes the ISA it runs as its first argument: there is no process-wide choice (the layer
// carries one in LayerOptions::isa). The ISA must be supported (isa_supported); callers check it once, where
// they choose it (require_isa). All functions are called from inside operation tiles: they never allocate
// and never throw.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/weight.h"

namespace moe {

// The instruction sets a kernel can run on, chosen at run time (best available by default). Two of them are
// opt-in and approximate x (never best_isa()): avx512bf16 rounds it to bf16 for bf16, fp8 and int4 weights;
// avx2int8 quantizes it to int8 per 32 columns for int4 weights (the AVX2 kernels otherwise).
enum class Isa : uint8_t { kScalar, kAvx2, kAvx512, kAvx512Bf16, kAvx2Int8 };
std::string_view isa_name(Isa isa);
// The ISA named `name` ("scalar", "avx2", "avx512", "avx512bf16", "avx2int8"), or nullopt.
std::optional<Isa> parse_isa(std::string_view name);
// Whether `isa` runs matrices of `weights` on bf16 dot products with x rounded to bf16 (avx512bf16 on bf16,
// fp8 and int4 weights): their error bound is ~2^-9 per product, and their arithmetic peak the bf16-dot one.
// (bf16 and fp8 rows longer than 131040 columns, which no published layer has, take the exact fp32 kernel
// even then: x in bf16 no longer fits the kernel's stack buffer. The bits still depend on the row alone.)
bool rounds_x_to_bf16(Isa isa, DType weights);
// Whether `isa` runs matrices of `weights` on int8 dot products with x quantized to int8 (avx2int8 on int4
// weights): symmetric, one fp32 scale per 32 columns of each token, error <= 2^-8 of the block's max |x|.
bool quantizes_x_to_int8(Isa isa, DType weights);
// Either of the two: the product of x and these weights is not the exact fp32 one.
inline bool approximates_x(Isa isa, DType weights) {
  return rounds_x_to_bf16(isa, weights) || quantizes_x_to_int8(isa, weights);
}
// The exact ISA whose kernels run where `isa` does not approximate x (avx512bf16 -> avx512, avx2int8 -> avx2).
Isa exact_isa(Isa isa);
// What the kernel builds chosen by run-time CPU checks run beyond what `isa` names, for reports, "; " between
// them: avx2int8 on a CPU with AVX512-VNNI and -VL says "vpdpbusd, two rows per 512-bit vector", avx2 on an
// AMD Zen 5 "weights prefetched into L1"; empty otherwise. Same bits.
std::string isa_build(Isa isa);
Isa best_isa();  // the best exact fp32 ISA this CPU supports and this build compiled (never an opt-in one)
bool isa_supported(Isa isa);
// Throws std::invalid_argument naming `who` and the ISA when this CPU (or build) lacks it.
void require_isa(Isa isa, const char* who);

// y[m * ldy + n] = sum_k x[m * ldx + k] * W[n, k]   for m in [0, M), n in [n0, n1).
void linear(Isa isa, const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
            int64_t ldy);

// linear() with fp32 activations whatever the ISA: the opt-in ISAs that approximate x run exact_isa()
// here. For the router and the shared-expert gate, whose few outputs decide the
// routing and must not flip on a rounding of x (DeepSeek-V3 and SGLang compute the gate in fp32, too).
void linear_exact(Isa isa, const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                  int64_t ldy);

// h[m * ldh + i] = silu(x . gate[i]) * (x . up[i])  for m in [0, M), i in [i0, i1).
// Bitwise equal to linear() of gate and up followed by silu_mul().
void gate_up_silu(Isa isa, const float* x, int64_t M, int64_t ldx, const WeightView& gate, const WeightView& up,
                  int64_t i0, int64_t i1, float* h, int64_t ldh);

// y[i] = r[i] + a * x[i], the product rounded before the sum: the same bits on every ISA (the layer's final
// sum, vectorised where the CPU allows). r may be y.
void scale_add(Isa isa, float* y, const float* r, const float* x, float a, int64_t n);
inline void scale_add(Isa isa, float* y, const float* x, float a, int64_t n) { scale_add(isa, y, y, x, a, n); }

// y[i] = sum over j < k, ascending, of a[j] * x[rows[j] * ldx + i], slots with rows[j] < 0 skipped, from 0,
// each product rounded before its sum: the bits of zeroing y and calling scale_add per slot, on every ISA,
// with y written once (the layer's combine).
void weighted_rows_sum(Isa isa, float* y, const float* x, int64_t ldx, const int32_t* rows, const float* a, int64_t k,
                       int64_t n);

// h[i] = silu(g[i]) * u[i], silu(z) = z / (1 + exp(-z)). The bits depend on (g, u, ISA) alone: the scalar
// and AVX2 paths use expf, the AVX-512 ones a 16-lane exp within a few ulp of it (about 20x faster).
void silu_mul(Isa isa, const float* g, const float* u, float* h, int64_t n);

inline float silu(float z) { return z / (1.0f + __builtin_expf(-z)); }
inline float sigmoid(float z) { return 1.0f / (1.0f + __builtin_expf(-z)); }

}  // namespace moe
