// The avx2int8 kernel built with AVX512-VNNI and AVX512-VL: the same file, its products summed by vpdpbusd,
// two rows per 512-bit vector (linear_int4_avx2int8.cpp says why the bits are the same). linear.cpp picks this build
// where the CPU has both.
#define MOE_INT8_VNNI 1
#define MOE_INT8_KERNEL linear_int4_avx2int8_vnni
#include "linear_int4_avx2int8.cpp"  // NOLINT(bugprone-suspicious-include): one source, two instruction sets
