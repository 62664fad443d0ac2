// int8 blocks of a matrix, rebuilt to float32 weights, shared by specjax's
// q8 kernels: q8_matmul.cc's products and q8_argmax.cc's exact recomputation
// of a few of them, which must give the same bits (one definition of the
// weights and of a row's sum).

#ifndef SPECJAX_CPU_KERNELS_Q8_BLOCKS_H_
#define SPECJAX_CPU_KERNELS_Q8_BLOCKS_H_

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "vector_math.h"

namespace specjax {

// A matrix as int8 blocks: w[o, i] = q[o, i] * scale[o, i / B] (- offset[o, i / B]).
struct Blocks {
  const int8_t* q;       // [O, I]
  const float* scale;    // [O, I / B]
  const float* offset;   // [O, I / B], or null
  int64_t per_row;       // I / B
};

// Weights [i, i + 8) of a row, as float32: q * scale, or q * scale - offset in
// one rounding, exact (see q8_matmul.cc). On x86 one sign-extending load and one
// conversion (GCC's generic vector conversion compiles to eight scalar ones
// there, 2.4x slower at one row).
template <bool kOffset>
inline f32x8 dequant8(const int8_t* q_i, float scale, float offset) {
#if defined(__AVX2__)
  const __m256 q = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q_i))));
  if constexpr (!kOffset) {
    return reinterpret_cast<f32x8>(_mm256_mul_ps(q, _mm256_set1_ps(scale)));
  }
#if defined(__FMA__)
  return reinterpret_cast<f32x8>(
      _mm256_fmsub_ps(q, _mm256_set1_ps(scale), _mm256_set1_ps(offset)));
#else
  return reinterpret_cast<f32x8>(
      _mm256_sub_ps(_mm256_mul_ps(q, _mm256_set1_ps(scale)), _mm256_set1_ps(offset)));
#endif
#else
  typedef int8_t i8x8 __attribute__((vector_size(8)));
  i8x8 q;
  __builtin_memcpy(&q, q_i, sizeof(q));
  if constexpr (kOffset) return __builtin_convertvector(q, f32x8) * scale - offset;
  return __builtin_convertvector(q, f32x8) * scale;
#endif
}

// y[o] for one row x[I]: the sum q8_matmul.cc computes for that output, in its
// order (8 lanes along i, then `sum_lanes`), so the same bits.
template <int kShift, bool kOffset>
inline float block_dot(const float* x, const Blocks& w, int64_t I, int64_t o) {
  f32x8 acc = {};
  for (int64_t i = 0; i < I; i += kLanes) {
    const int64_t s = o * w.per_row + (i >> kShift);
    acc = madd(acc, dequant8<kOffset>(w.q + o * I + i, w.scale[s], kOffset ? w.offset[s] : 0.0f),
               load8(x + i));
  }
  return sum_lanes(acc);
}

}  // namespace specjax

#endif  // SPECJAX_CPU_KERNELS_Q8_BLOCKS_H_
