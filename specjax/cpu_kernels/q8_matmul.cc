// y[N, O] = x[N, I] @ w[O, I]^T in float32, where w is held as GGUF's Q8_0:
// int8 q[O, I] and one float32 scale per 32 weights, scale[O, I / 32], and
// w[o, i] = q[o, i] * scale[o, i / 32]. An XLA:CPU FFI call.
//
// Why: the 270M's tied head (262,144 x 640) is stored Q8_0 in its GGUF and is
// 63% of the weights a decode step reads. As float32 it is 671 MB a step; as
// its own int8 values and scales it is 189 MB. Each weight is rebuilt in a
// register (int8 -> float32, times its block's scale) just before use.
//
// Exactness: Q8_0's scale is a float16 and q an int8, so their product has at
// most 19 significant bits and float32 holds it exactly: the weight rebuilt
// here is bit for bit the weight `gguf.quants.dequantize` gives, and this is
// the same model, not a rounded one. Every output element is accumulated as in
// skinny_matmul.cc (8 float lanes in the order of i, then summed pairwise in a
// fixed order), so y equals skinny_matmul's product with the dequantized
// matrix bit for bit, and row n of y is the same whatever N, the row block or
// the thread.
//
// Compiled on first use by specjax/cpu_kernels/build.py with -march=native.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <utility>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "pool_work.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using specjax::f32x8;
using specjax::kLanes;
using specjax::load8;
using specjax::madd;
using specjax::sum_lanes;

constexpr int64_t kBlock = 32;  // Q8_0's weights per scale

// Weights [i, i + 8) of a Q8_0 row, as float32: q * scale, exact. On x86 one
// sign-extending load and one conversion (GCC's generic vector conversion
// compiles to eight scalar ones there, 2.4x slower at one row).
inline f32x8 dequant8(const int8_t* q_i, float scale) {
#if defined(__AVX2__)
  const __m256 q = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q_i))));
  return reinterpret_cast<f32x8>(_mm256_mul_ps(q, _mm256_set1_ps(scale)));
#else
  typedef int8_t i8x8 __attribute__((vector_size(8)));
  i8x8 q;
  __builtin_memcpy(&q, q_i, sizeof(q));
  return __builtin_convertvector(q, f32x8) * scale;
#endif
}

// How far ahead the reads of q are requested, in bytes (as skinny_matmul's 64
// KiB of float32 weights), and of the scales, a quarter of that.
constexpr int64_t kPrefetchBytes = 16384;

// The first pass over a panel prefetches (into L2, locality 2: see
// skinny_matmul.cc's Staging for why not the non-temporal hint on Intel), once
// per 64-byte line of q and of the scales; later groups read the panel from
// cache.
template <bool kPrefetch>
inline void prefetch_ahead(const int8_t* q_i, const float* scale_i, int64_t i) {
  if constexpr (kPrefetch) {
    if (i % 64 == 0) __builtin_prefetch(q_i + kPrefetchBytes, 0, 2);
    if (i % (16 * kBlock) == 0) __builtin_prefetch(scale_i + kPrefetchBytes / 4, 0, 2);
  }
}

constexpr int64_t kRowsPerPanel = 48;

// Rows of x sharing one rebuilt weight vector. Each group rebuilds the panel's
// weights again (2 instructions per 8 weights beside the group's G
// multiply-adds), so a group is as large as the registers allow: 9 rows (a
// verify call over 8 drafts) in one group, not 8 and 1.
constexpr int kMaxGroup = 12;

// Rows [o0, o1) of y for G rows of x, R rows of w at a time (G * R accumulators
// in registers, beside the rebuilt weights).
template <int G, int R, bool kPrefetch>
void group_rows(const float* x, const int8_t* q, const float* scale, float* y, int64_t O,
                int64_t I, int64_t o0, int64_t o1) {
  const int64_t blocks = I / kBlock;
  int64_t o = o0;
  for (; o + R <= o1; o += R) {
    f32x8 acc[R][G] = {};
    for (int64_t i = 0; i < I; i += kLanes) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int8_t* q_ri = q + (o + r) * I + i;
        const float* scale_ri = scale + (o + r) * blocks + i / kBlock;
        prefetch_ahead<kPrefetch>(q_ri, scale_ri, i);
        const f32x8 wv = dequant8(q_ri, *scale_ri);
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) acc[r][g] = madd(acc[r][g], wv, load8(x + g * I + i));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) y[g * O + o + r] = sum_lanes(acc[r][g]);
  }
  for (; o < o1; ++o) {  // the rows left over: the same sums, one w row at a time
    f32x8 acc[G] = {};
    for (int64_t i = 0; i < I; i += kLanes) {
      const int8_t* q_oi = q + o * I + i;
      const float* scale_oi = scale + o * blocks + i / kBlock;
      prefetch_ahead<kPrefetch>(q_oi, scale_oi, i);
      const f32x8 wv = dequant8(q_oi, *scale_oi);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) acc[g] = madd(acc[g], wv, load8(x + g * I + i));
    }
    for (int g = 0; g < G; ++g) y[g * O + o] = sum_lanes(acc[g]);
  }
}

using GroupFn = void (*)(const float*, const int8_t*, const float*, float*, int64_t, int64_t,
                         int64_t, int64_t);

// Row blocks R for G rows of x: G * R accumulators, one rebuilt weight vector
// and its scale fit the vector registers (32 with AVX-512VL, else 16).
#if defined(__AVX512VL__)
constexpr int kBlockRows[kMaxGroup + 1] = {0, 16, 12, 8, 6, 5, 4, 3, 3, 3, 2, 2, 2};
#else
constexpr int kBlockRows[kMaxGroup + 1] = {0, 8, 6, 4, 3, 2, 2, 1, 1, 1, 1, 1, 1};
#endif

#if defined(__AVX512F__)
// With AVX-512 two rows of w share one 16-float register, row o in lanes 0-7
// and row o + 1 in lanes 8-15, against x's 8 floats repeated in both halves:
// every lane does the multiply-adds of the 8-lane path above in the same order,
// so the sums are the same bits, and one instruction does the work of two.
// Rebuilt weights and multiply-adds bound a verify call's products here, not
// memory (on a 2-core Sapphire Rapids-class Xeon, two 512-bit multiply-adds a
// cycle against two 256-bit ones).

inline __m512 repeat8(const float* p) {  // [p[0..8), p[0..8)]
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

inline __m512 pair_scales(float a, float b) {  // [a x 8, b x 8]
  return _mm512_castpd_ps(_mm512_insertf64x4(
      _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(a))),
      _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

// Weights [i, i + 8) of rows a and b, as float32, exact.
inline __m512 dequant_pair(const int8_t* q_a, const int8_t* q_b, __m512 scales) {
  int64_t lo, hi;
  __builtin_memcpy(&lo, q_a, sizeof(lo));
  __builtin_memcpy(&hi, q_b, sizeof(hi));
  const __m512i q = _mm512_cvtepi8_epi32(_mm_set_epi64x(hi, lo));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(q), scales);
}

inline f32x8 half(__m512 v, int h) {
  const __m256 part = h == 0 ? _mm512_castps512_ps256(v)
                             : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return reinterpret_cast<f32x8>(part);
}

// Rows [o0, o1) of y for G rows of x, P pairs of rows of w at a time; rows
// left over take the 8-lane path.
template <int G, int P, bool kPrefetch>
void pair_rows(const float* x, const int8_t* q, const float* scale, float* y, int64_t O,
               int64_t I, int64_t o0, int64_t o1) {
  const int64_t blocks = I / kBlock;
  int64_t o = o0;
  for (; o + 2 * P <= o1; o += 2 * P) {
    __m512 acc[P][G];
    for (int p = 0; p < P; ++p)
      for (int g = 0; g < G; ++g) acc[p][g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      __m512 scales[P];
      for (int p = 0; p < P; ++p) {
        const float* s = scale + (o + 2 * p) * blocks + b;
        scales[p] = pair_scales(s[0], s[blocks]);
      }
#pragma GCC unroll 4
      for (int64_t i = b * kBlock; i < (b + 1) * kBlock; i += kLanes) {
        __m512 xv[G];
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) xv[g] = repeat8(x + g * I + i);
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) {
          const int8_t* q_a = q + (o + 2 * p) * I + i;
          const float* s_a = scale + (o + 2 * p) * blocks + b;
          prefetch_ahead<kPrefetch>(q_a, s_a, i);
          prefetch_ahead<kPrefetch>(q_a + I, s_a + blocks, i);
          const __m512 wv = dequant_pair(q_a, q_a + I, scales[p]);
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) acc[p][g] = _mm512_fmadd_ps(wv, xv[g], acc[p][g]);
        }
      }
    }
    for (int p = 0; p < P; ++p)
      for (int g = 0; g < G; ++g)
        for (int h = 0; h < 2; ++h) y[g * O + o + 2 * p + h] = sum_lanes(half(acc[p][g], h));
  }
  if (o < o1) group_rows<G, 1, kPrefetch>(x, q, scale, y, O, I, o, o1);
}

// Pairs of w rows for G rows of x: P * G accumulators, G repeated rows of x,
// P scale vectors and a rebuilt pair fit the 32 registers.
constexpr int kPairs[kMaxGroup + 1] = {0, 8, 6, 5, 4, 3, 3, 2, 2, 2, 1, 1, 1};
#endif

template <bool kPrefetch, int... G>
constexpr std::array<GroupFn, sizeof...(G)> group_fns(std::integer_sequence<int, G...>) {
#if defined(__AVX512F__)
  return {pair_rows<G + 1, kPairs[G + 1], kPrefetch>...};
#else
  return {group_rows<G + 1, kBlockRows[G + 1], kPrefetch>...};
#endif
}

// group_fn<kPrefetch>(g): the function for a group of g rows, 1 <= g <= kMaxGroup.
template <bool kPrefetch>
GroupFn group_fn(int g) {
  static constexpr auto fns = group_fns<kPrefetch>(std::make_integer_sequence<int, kMaxGroup>());
  return fns[g - 1];
}

// Rows [o0, o1) of y for all N rows of x, one panel of w at a time.
void panel_rows(const float* x, const int8_t* q, const float* scale, float* y, int64_t N,
                int64_t O, int64_t I, int64_t o0, int64_t o1) {
  // As few groups as kMaxGroup allows, of even sizes (20 rows: 10 and 10, not 16 and 4).
  const int64_t groups = (N + kMaxGroup - 1) / kMaxGroup;
  const int64_t group = (N + groups - 1) / groups;
  for (int64_t p0 = o0; p0 < o1; p0 += kRowsPerPanel) {
    const int64_t p1 = std::min(o1, p0 + kRowsPerPanel);
    for (int64_t n0 = 0; n0 < N; n0 += group) {
      const int g = static_cast<int>(std::min<int64_t>(group, N - n0));
      GroupFn fn = n0 == 0 ? group_fn<true>(g) : group_fn<false>(g);
      fn(x + n0 * I, q, scale, y + n0 * O, O, I, p0, p1);
    }
  }
}

ffi::Error Q8Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI, ffi::Buffer<ffi::S8> q_OxI,
                    ffi::Buffer<ffi::F32> scale_OxB, ffi::ResultBuffer<ffi::F32> y_NxO) {
  const auto xd = x_NxI.dimensions();
  const auto qd = q_OxI.dimensions();
  const auto sd = scale_OxB.dimensions();
  if (xd.size() != 2 || qd.size() != 2 || sd.size() != 2 || xd[1] != qd[1] ||
      qd[1] % kBlock != 0 || sd[0] != qd[0] || sd[1] != qd[1] / kBlock) {
    return ffi::Error::InvalidArgument(
        "q8_matmul: expected x[N, I], q[O, I] and scale[O, I / 32], I a multiple of 32");
  }
  const int64_t N = xd[0], I = xd[1], O = qd[0];
  if (N == 0 || O == 0) return ffi::Error::Success();
  const float* x = x_NxI.typed_data();
  const int8_t* q = q_OxI.typed_data();
  const float* scale = scale_OxB.typed_data();
  float* y = y_NxO->typed_data();
  specjax::run_row_chunks(pool, O, kRowsPerPanel, [=](int64_t o0, int64_t o1) {
    panel_rows(x, q, scale, y, N, O, I, o0, o1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_matmul_f32, Q8Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
