// 8-lane float helpers shared by specjax's CPU kernels (GCC/Clang vector
// extensions; AVX2 or AVX-512 code by -march).
//
// The kernels are built with -ffp-contract=off, so the compiler fuses no
// multiply-add on its own: `madd` is the only fused one, and a sum's bits do
// not depend on which loop computed it.

#ifndef SPECJAX_CPU_KERNELS_VECTOR_MATH_H_
#define SPECJAX_CPU_KERNELS_VECTOR_MATH_H_

#if defined(__FMA__)
#include <immintrin.h>
#endif

namespace specjax {

typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

constexpr int kLanes = 8;

inline f32x8 load8(const float* p) {
  f32x8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// acc + a * b, fused where the CPU has FMA.
inline f32x8 madd(f32x8 acc, f32x8 a, f32x8 b) {
#if defined(__FMA__)
  return reinterpret_cast<f32x8>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a),
                                                 reinterpret_cast<__m256>(b),
                                                 reinterpret_cast<__m256>(acc)));
#else
  return acc + a * b;
#endif
}

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): fixed, whatever the caller.
inline float sum_lanes(f32x8 a) {
  f32x4 lo, hi;
  __builtin_memcpy(&lo, &a, sizeof(lo));
  __builtin_memcpy(&hi, reinterpret_cast<const char*>(&a) + sizeof(lo), sizeof(hi));
  f32x4 s = lo + hi;
  return (s[0] + s[2]) + (s[1] + s[3]);
}

}  // namespace specjax

#endif  // SPECJAX_CPU_KERNELS_VECTOR_MATH_H_
