// Powers of two and binary exponents from a float's bits, without a library
// call: the integer kernels (q8_amx.cc, q8_argmax.cc's AMX screen) write each
// row of x as integers times a power of two, once a row or block a call.

#ifndef SPECJAX_CPU_KERNELS_FLOAT_BITS_H_
#define SPECJAX_CPU_KERNELS_FLOAT_BITS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

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

}  // namespace specjax

#endif  // SPECJAX_CPU_KERNELS_FLOAT_BITS_H_
