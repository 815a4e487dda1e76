// Run-time ISA dispatch of the linear kernels, the scalar reference path, and gate_up_silu / silu_mul
// (built on linear() so that they inherit its determinism contract).
#include "kernels/linear.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu_features.h"
#include "kernels/linear_isa.h"

namespace moe {

namespace {

}  // namespace

namespace detail {

// One dot product in a fixed order (k ascending, fp32 accumulation): the determinism contract holds.
void linear_scalar(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      const float* xm = x + m * ldx;
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) acc += xm[k] * weight_at(w, n, k);
      y[m * ldy + (n - n0)] = acc;
    }
}

}  // namespace detail

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
    case Isa::kAvx2Int8: return "avx2int8";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAvx2Int8})
    if (isa_name(isa) == name) return isa;
  return std::nullopt;
}

bool rounds_x_to_bf16(Isa isa, DType weights) {
  return isa == Isa::kAvx512Bf16 && weights != DType::kF32;
}

bool quantizes_x_to_int8(Isa isa, DType weights) { return isa == Isa::kAvx2Int8 && weights == DType::kInt4; }

Isa exact_isa(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16: return Isa::kAvx512;
    case Isa::kAvx2Int8: return Isa::kAvx2;
    default: return isa;
  }
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return f.avx2 && f.fma && f.f16c;
    case Isa::kAvx512: return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
    case Isa::kAvx512Bf16: return isa_supported(Isa::kAvx512) && f.avx512bf16;
    case Isa::kAvx2Int8: return isa_supported(Isa::kAvx2);
  }
  return false;
}

// kAvx512Bf16 and kAvx2Int8 are never the default: they approximate x (linear_avx512bf16.cpp,
// linear_int4_avx2int8.cpp), so they are opt-in.
Isa best_isa() {
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2})
    if (isa_supported(isa)) return isa;
  return Isa::kScalar;
}

void require_isa(Isa isa, const char* who) {
  if (!isa_supported(isa))
    throw std::invalid_argument(std::string(who) + ": kernel ISA " + std::string(isa_name(isa)) +
                                " is not supported by this CPU or not compiled in this build (the best here is " +
                                std::string(isa_name(best_isa())) + ")");
}

namespace {
// avx2int8 sums its products with vpdpbusd, two rows per 512-bit vector, where the CPU has AVX512-VNNI (the
// same bits).
bool int8_dot_vnni() {
  const CpuFeatures& f = cpu_features();
  return f.avx512vnni && f.avx512vl && f.avx512f;
}
// The AVX2 kernels of bf16, f32 and fp8 weights prefetch them into L2, 4 KiB ahead, which measured 1.1-1.5x
// faster than L1 on an AMD Zen 4 (family 0x19); on a Zen 5 (family 0x1a) L1, 2 KiB ahead, measured 1.05-1.17x
// faster than L2 (docs/kernel-notes.md, "The AVX2 prefetch per CPU family"). Other CPUs keep L2. Same bits.
bool avx2_prefetch_l1() {
  const CpuFeatures& f = cpu_features();
  return f.amd && f.family >= 0x1a;
}
}  // namespace

std::string isa_build(Isa isa) {
  if (!isa_supported(isa)) return "";
  std::string parts;
  const auto add = [&](std::string_view s) { parts += (parts.empty() ? "" : "; ") + std::string(s); };
  if (isa == Isa::kAvx2Int8 && int8_dot_vnni()) add("vpdpbusd, two rows per 512-bit vector");
  if ((isa == Isa::kAvx2 || isa == Isa::kAvx2Int8) && avx2_prefetch_l1())
    add(isa == Isa::kAvx2 ? "weights prefetched into L1" : "other weights prefetched into L1");
  return parts;
}

namespace {

// linear() with y pointing at column n0.
void linear_from_n0(Isa isa, const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                    float* y, int64_t ldy) {
  if (M <= 0 || n1 <= n0) return;
  if (w.dtype == DType::kInt4) {
    switch (isa) {
      case Isa::kAvx512: detail::linear_int4_avx512(x, M, ldx, w, n0, n1, y, ldy); return;
      case Isa::kAvx512Bf16: detail::linear_int4_avx512bf16(x, M, ldx, w, n0, n1, y, ldy); return;
      case Isa::kAvx2: detail::linear_int4_avx2(x, M, ldx, w, n0, n1, y, ldy); return;
      case Isa::kAvx2Int8:
        if (int8_dot_vnni()) return detail::linear_int4_avx2int8_vnni(x, M, ldx, w, n0, n1, y, ldy);
        return detail::linear_int4_avx2int8(x, M, ldx, w, n0, n1, y, ldy);
      case Isa::kScalar: break;
    }
    return detail::linear_scalar(x, M, ldx, w, n0, n1, y, ldy);
  }
  switch (isa) {
    case Isa::kAvx512: detail::linear_avx512(x, M, ldx, w, n0, n1, y, ldy); return;
    case Isa::kAvx512Bf16: detail::linear_avx512bf16(x, M, ldx, w, n0, n1, y, ldy); return;
    case Isa::kAvx2:
    case Isa::kAvx2Int8:
      if (avx2_prefetch_l1()) return detail::linear_avx2_prefetch_l1(x, M, ldx, w, n0, n1, y, ldy);
      return detail::linear_avx2(x, M, ldx, w, n0, n1, y, ldy);
    case Isa::kScalar: break;
  }
  detail::linear_scalar(x, M, ldx, w, n0, n1, y, ldy);
}
}  // namespace

void linear(Isa isa, const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
            int64_t ldy) {
  linear_from_n0(isa, x, M, ldx, w, n0, n1, y + n0, ldy);
}

void linear_exact(Isa isa, const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                  float* y, int64_t ldy) {
  linear_from_n0(exact_isa(isa), x, M, ldx, w, n0, n1, y + n0, ldy);
}

namespace {
// Both AVX-512 ISAs run the elementwise kernels of elementwise_avx512.cpp.
bool avx512_elementwise(Isa isa) { return isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16; }
}  // namespace

void scale_add(Isa isa, float* y, const float* r, const float* x, float a, int64_t n) {
  if (avx512_elementwise(isa)) return detail::scale_add_avx512(y, r, x, a, n);
  for (int64_t i = 0; i < n; ++i) {
    const float p = a * x[i];  // rounded before the sum (this file is compiled with -ffp-contract=off)
    y[i] = r[i] + p;
  }
}

void weighted_rows_sum(Isa isa, float* y, const float* x, int64_t ldx, const int32_t* rows, const float* a,
                       int64_t k, int64_t n) {
  if (avx512_elementwise(isa)) return detail::weighted_rows_sum_avx512(y, x, ldx, rows, a, k, n);
  std::fill(y, y + n, 0.0f);
  for (int64_t j = 0; j < k; ++j)
    if (rows[j] >= 0) scale_add(isa, y, x + rows[j] * ldx, a[j], n);
}

void silu_mul(Isa isa, const float* g, const float* u, float* h, int64_t n) {
  if (avx512_elementwise(isa)) return detail::silu_mul_avx512(g, u, h, n);
  for (int64_t i = 0; i < n; ++i) h[i] = silu(g[i]) * u[i];
}

// gate and up go through linear() into stack tiles (no allocation), then silu_mul(): bitwise the same as
// the unfused sequence by construction. A tile holds up to 32 tokens. With more than 8 it holds 2048 /
// tokens rows, at least 64, so the row block of both matrices stays in cache while all tokens pass over
// it. With up to 8 (decode) it holds 4096 / tokens rows, at least 512, so each matrix of a Qwen3-Next
// expert is streamed in one run: 64-row runs alternating between gate and up restarted the memory streams
// 16 times per expert, and at 5-8 tokens 2048 / tokens rows split each matrix in two with a remainder.
void gate_up_silu(Isa isa, const float* x, int64_t M, int64_t ldx, const WeightView& gate, const WeightView& up,
                  int64_t i0, int64_t i1, float* h, int64_t ldh) {
  constexpr int64_t kTokens = 32, kTileFloats = 4096, kDecodeTokens = 8;
  float g[kTileFloats], u[kTileFloats];
  for (int64_t m0 = 0; m0 < M; m0 += kTokens) {
    const int64_t mt = std::min(kTokens, M - m0);
    const int64_t rows = (mt <= kDecodeTokens ? kTileFloats : kTileFloats / 2) / mt;
    for (int64_t r0 = i0; r0 < i1; r0 += rows) {
      const int64_t r1 = std::min(i1, r0 + rows);
      linear_from_n0(isa, x + m0 * ldx, mt, ldx, gate, r0, r1, g, rows);
      linear_from_n0(isa, x + m0 * ldx, mt, ldx, up, r0, r1, u, rows);
      for (int64_t m = 0; m < mt; ++m) silu_mul(isa, g + m * rows, u + m * rows, h + (m0 + m) * ldh + r0, r1 - r0);
    }
  }
}

}  // namespace moe
