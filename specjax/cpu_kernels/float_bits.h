// Powers of two and binary exponents from a float's bits, without a library
// call, and blocks' largest magnitudes: the integer kernels (q8_amx.cc,
// q8_argmax.cc's AMX screen) write each row of x as integers times a power of
// two, once a row or block a call.

#ifndef SPECJAX_CPU_KERNELS_FLOAT_BITS_H_
#define SPECJAX_CPU_KERNELS_FLOAT_BITS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specjax {

// 2^k as a float (0 or inf beyond its range).
inline float pow2(int k) {
  if (k < -126 || k > 127) return std::ldexp(1.0f, k);
  const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// 2^k as a double, for -1022 <= k <= 1023.
inline double pow2d(int k) {
  const uint64_t bits = static_cast<uint64_t>(k + 1023) << 52;
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// e with 2^(e - 1) <= a < 2^e (std::frexp's exponent) for a finite a > 0.
inline int exponent(float a) {
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof(bits));
  const int biased = static_cast<int>(bits >> 23) & 255;
  if (biased == 0) {   // subnormal
    int e;
    std::frexp(a, &e);
    return e;
  }
  return biased - 126;
}

// Whether every element of x[I] is finite and under 2^100 in magnitude (rows that are not
// take a float path in the kernels: their integers would overflow), and the largest
// magnitude of each block of B (B = I: the row's).
inline bool block_maxima(const float* x, int64_t I, int64_t B, float* amax) {
#if defined(__AVX512F__)
  const __m512 limit = _mm512_set1_ps(0x1p100f);
  __mmask16 bad = 0;
  for (int64_t b = 0; b < I / B; ++b) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = b * B; i < (b + 1) * B; i += 16) {
      const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
      bad |= _mm512_cmp_ps_mask(a, limit, _CMP_NLT_UQ);   // NaN, inf or too large
      m = _mm512_max_ps(m, a);
    }
    amax[b] = _mm512_reduce_max_ps(m);
  }
  return bad == 0;
#else
  bool ok = true;
  for (int64_t b = 0; b < I / B; ++b) {
    amax[b] = 0.0f;
    for (int64_t i = b * B; i < (b + 1) * B; ++i) {
      if (!(std::fabs(x[i]) < 0x1p100f)) ok = false;
      amax[b] = std::max(amax[b], std::fabs(x[i]));
    }
  }
  return ok;
#endif
}

}  // namespace specjax

#endif  // SPECJAX_CPU_KERNELS_FLOAT_BITS_H_
