// Entry points of the per-ISA linear kernels (internal to moe_kernels; call linear() instead).
// Same arguments as linear() except that y points at column n0: y[m * ldy + (n - n0)].
// Each is compiled with its ISA's target flags and must only run where isa_supported() says so.
#pragma once

#include <cstdint>

#include "kernels/weight.h"

namespace moe::detail {

void linear_scalar(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                   int64_t ldy);
void linear_avx2(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                 int64_t ldy);
// The same kernels with the weights prefetched into L1, 2 KiB ahead, instead of into L2, 4 KiB ahead (the
// faster choice differs by CPU family: linear.cpp). Same bits.
void linear_avx2_prefetch_l1(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                             float* y, int64_t ldy);
void linear_avx512(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                   int64_t ldy);
// bf16 and fp8 weights via vdpbf16ps (x rounded to bf16); f32 weights forward to linear_avx512.
void linear_avx512bf16(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                       float* y, int64_t ldy);
// int4 weights: exact fp32 (linear_int4_avx512.cpp, linear_int4_avx2.cpp), or x rounded to bf16 and
// vdpbf16ps (linear_int4_avx512bf16.cpp, the avx512bf16 ISA).
void linear_int4_avx512(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                        float* y, int64_t ldy);
void linear_int4_avx512bf16(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                            float* y, int64_t ldy);
void linear_int4_avx2(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                      int64_t ldy);
// int4 weights against x quantized to int8 per 32 columns (linear_int4_avx2int8.cpp, the avx2int8 ISA).
void linear_int4_avx2int8(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                          float* y, int64_t ldy);
// The same kernel, two rows per 512-bit vector, its products summed by vpdpbusd (linear_int4_avx2int8_vnni.cpp):
// AVX512-VNNI and -VL.
void linear_int4_avx2int8_vnni(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0,
                               int64_t n1, float* y, int64_t ldy);
// silu_mul, scale_add and weighted_rows_sum on 16 lanes (elementwise_avx512.cpp), for both AVX-512 ISAs.
void silu_mul_avx512(const float* g, const float* u, float* h, int64_t n);
void scale_add_avx512(float* y, const float* r, const float* x, float a, int64_t n);
void weighted_rows_sum_avx512(float* y, const float* x, int64_t ldx, const int32_t* rows, const float* a, int64_t k,
                              int64_t n);

}  // namespace moe::detail

namespace moe::simd {

// The weight decodings of a 128-column block in the SIMD kernels (linear_simd.h), fastest first; each ISA's
// traits say which one a block needs (for fp8: NaN codes, subnormal codes, the scale's size).
inline constexpr int kFastPath = 0, kSubnormalPath = 1, kExactPath = 2;

}  // namespace moe::simd
