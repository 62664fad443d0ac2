// y[N, O] = x[N, I] @ w[O, I]^T in float32, where w is held as int8 blocks:
// int8 q[O, I], one float32 scale per block of B weights, scale[O, I / B], and
// w[o, i] = q[o, i] * scale[o, i / B], or, given an offset[O, I / B] too,
// w[o, i] = q[o, i] * scale[o, i / B] - offset[o, i / B]. B is 32 or 16 (the
// 270M's GGUF: 32 for Q8_0, Q5_0 and Q4_K, 16 for Q6_K; Q4_K's weights carry
// the offset). Two XLA:CPU FFI calls, without and with offset.
//
// Why: the 270M's tied head (262,144 x 640) is stored Q8_0 in its GGUF and is
// 63% of the weights a decode step reads. As float32 it is 671 MB a step; as
// its own int8 values and scales it is 189 MB. Each weight is rebuilt in a
// register (int8 -> float32, times its block's scale) just before use.
//
// Exactness: Q8_0's scale is a float16 and q an int8, so their product has at
// most 19 significant bits and float32 holds it exactly: the weight rebuilt
// here is bit for bit the weight `gguf.quants.dequantize` gives, and this is
// the same model, not a rounded one. The same holds of Q6_K's (a float16 times
// an int8 sub-scale, times a 6-bit q: at most 24 bits), and Q4_K's q * scale
// is exact too (at most 21 bits), so one fused q * scale - offset rounds once,
// where gguf's (q * scale) - offset rounds once, at the subtraction: the same
// bits (models/q8_weights.py keeps a split only where q * scale is exact). Every output element is accumulated as in
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
#include "q8_blocks.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using specjax::f32x8;
using specjax::kLanes;
using specjax::load8;
using specjax::madd;
using specjax::sum_lanes;
using specjax::Blocks;
using specjax::dequant8;

// The block sizes built: log2(B) for B = 16 and 32. A block size is a template
// argument, not a variable: with the loop over a block's weights of unknown
// length the head at one row took twice as long (10.4 against 4.8 ms).
constexpr int kShifts[] = {4, 5};

// How far ahead the reads of q are requested, in bytes (as skinny_matmul's 64
// KiB of float32 weights), and of the scales (and offsets), a quarter of that.
constexpr int64_t kPrefetchBytes = 16384;

// The first pass over a panel prefetches (into L2, locality 2: see
// skinny_matmul.cc's Staging for why not the non-temporal hint on Intel), once
// per 64-byte line of q and of the scales; later groups read the panel from
// cache. `i` is the offset in the row, `s_i` that of its block's scale.
template <bool kPrefetch, int kShift, bool kOffset>
inline void prefetch_ahead(const Blocks& w, const int8_t* q_i, int64_t s_i, int64_t i) {
  if constexpr (kPrefetch) {
    if (i % 64 == 0) __builtin_prefetch(q_i + kPrefetchBytes, 0, 2);
    if (i % (16 << kShift) == 0) {
      __builtin_prefetch(w.scale + s_i + kPrefetchBytes / 4, 0, 2);
      if constexpr (kOffset) __builtin_prefetch(w.offset + s_i + kPrefetchBytes / 4, 0, 2);
    }
  }
}

constexpr int64_t kRowsPerPanel = 48;

// Rows of x sharing one rebuilt weight vector. Each group rebuilds the panel's
// weights again (2 instructions per 8 weights beside the group's G
// multiply-adds), so a group is large: 9 rows (a verify call over 8 drafts) in
// one group, not 8 and 1. Not as large as the registers allow: past 9 a group
// has one row of w at a time (kPairs, kBlockRows), and 12 rows as two groups of
// 6 with 3 pairs each took 0.33 ms against 0.48 on the 270M's Q4_K down
// projection (offset, 640 x 2,048), 20 rows as 7 + 7 + 6 took 0.44 against 0.51
// on its gate (2,048 x 640) rather than 10 + 10 (2-core Zen 4, 7 December 2026,
// benchmarks/q8_matmul_variants.py --copies=96; its AVX2 build: 0.40 against 0.62
// ms, and 0.51 against 0.46, the one loss). A greedy verify call at batch 4 over
// 3 / 5 positions (12 / 20 rows) took 30.9 / 47.9 ms against 36.0 / 55.2
// (benchmarks/verify_cost.py, one run each).
constexpr int kMaxGroup = 9;

// Rows [o0, o1) of y for G rows of x, R rows of w at a time (G * R accumulators
// in registers, beside the rebuilt weights). A block's scales are read once, and
// its B / 8 weight vectors a row follow without the scale's index arithmetic and
// the prefetch tests of a loop over i, which shared the ports with the
// multiply-adds. In the AVX2 build on the 2-core Xeon of 6 December 2026 the
// 270M's greedy decode step took 17.7-18.0 ms against 18.8-19.0 before, and a
// verify call over 5 / 9 positions no less (benchmarks/verify_cost.py, two runs
// each).
template <int G, int R, bool kPrefetch, int kShift, bool kOffset>
void group_rows(const float* x, const Blocks& w, float* y, int64_t O, int64_t I, int64_t o0,
                int64_t o1) {
  constexpr int64_t block = int64_t{1} << kShift;
  const int64_t blocks = w.per_row;
  int64_t o = o0;
  for (; o + R <= o1; o += R) {
    f32x8 acc[R][G] = {};
    for (int64_t b = 0; b < blocks; ++b) {
      float scale[R], offset[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int64_t s = (o + r) * blocks + b;
        scale[r] = w.scale[s];
        offset[r] = kOffset ? w.offset[s] : 0.0f;
        prefetch_ahead<kPrefetch, kShift, kOffset>(w, w.q + (o + r) * I + b * block, s,
                                                   b * block);
      }
#pragma GCC unroll 4
      for (int64_t i = b * block; i < (b + 1) * block; i += kLanes) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const f32x8 wv = dequant8<kOffset>(w.q + (o + r) * I + i, scale[r], offset[r]);
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) acc[r][g] = madd(acc[r][g], wv, load8(x + g * I + i));
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) y[g * O + o + r] = sum_lanes(acc[r][g]);
  }
  // The rows left over: the same sums, one w row at a time.
  if (o < o1) group_rows<G, 1, kPrefetch, kShift, kOffset>(x, w, y, O, I, o, o1);
}

using GroupFn = void (*)(const float*, const Blocks&, float*, int64_t, int64_t, int64_t, int64_t);

// Row blocks R for G rows of x: G * R accumulators, one rebuilt weight vector
// and its scale fit the vector registers (32 with AVX-512VL, else 16).
#if defined(__AVX512VL__)
constexpr int kBlockRows[kMaxGroup + 1] = {0, 16, 12, 8, 6, 5, 4, 3, 3, 3};
#else
constexpr int kBlockRows[kMaxGroup + 1] = {0, 8, 6, 4, 3, 2, 2, 1, 1, 1};
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
template <bool kOffset>
inline __m512 dequant_pair(const int8_t* q_a, const int8_t* q_b, __m512 scales, __m512 offsets) {
  int64_t lo, hi;
  __builtin_memcpy(&lo, q_a, sizeof(lo));
  __builtin_memcpy(&hi, q_b, sizeof(hi));
  const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_set_epi64x(hi, lo)));
  if constexpr (kOffset) return _mm512_fmsub_ps(q, scales, offsets);
  return _mm512_mul_ps(q, scales);
}

// Lanes 0 and 8 of the result: each 8-lane half's sum in sum_lanes' order,
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) (an addition's operands
// commute bit for bit), in 6 instructions where two sum_lanes took about 17.
inline __m512 sum_halves(__m512 a) {
  const __m512 t1 = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0xB1));   // l_k + l_{k+4}
  const __m512 t2 = _mm512_add_ps(t1, _mm512_permute_ps(t1, 0x4E));       // + 2 lanes over
  return _mm512_add_ps(t2, _mm512_permute_ps(t2, 0xB1));                  // + the neighbour
}

// Rows [o0, o1) of y for G rows of x, P pairs of rows of w at a time; rows
// left over take the 8-lane path.
template <int G, int P, bool kPrefetch, int kShift, bool kOffset>
void pair_rows(const float* x, const Blocks& w, float* y, int64_t O, int64_t I, int64_t o0,
               int64_t o1) {
  constexpr int64_t block = int64_t{1} << kShift;
  const int64_t blocks = w.per_row;
  int64_t o = o0;
  for (; o + 2 * P <= o1; o += 2 * P) {
    __m512 acc[P][G];
    for (int p = 0; p < P; ++p)
      for (int g = 0; g < G; ++g) acc[p][g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      __m512 scales[P], offsets[P];
      for (int p = 0; p < P; ++p) {
        const int64_t s = (o + 2 * p) * blocks + b;
        scales[p] = pair_scales(w.scale[s], w.scale[s + blocks]);
        offsets[p] = kOffset ? pair_scales(w.offset[s], w.offset[s + blocks]) : scales[p];
      }
#pragma GCC unroll 4
      for (int64_t i = b * block; i < (b + 1) * block; i += kLanes) {
        __m512 xv[G];
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) xv[g] = repeat8(x + g * I + i);
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) {
          const int8_t* q_a = w.q + (o + 2 * p) * I + i;
          const int64_t s_a = (o + 2 * p) * blocks + b;
          prefetch_ahead<kPrefetch, kShift, kOffset>(w, q_a, s_a, i);
          prefetch_ahead<kPrefetch, kShift, kOffset>(w, q_a + I, s_a + blocks, i);
          const __m512 wv = dequant_pair<kOffset>(q_a, q_a + I, scales[p], offsets[p]);
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) acc[p][g] = _mm512_fmadd_ps(wv, xv[g], acc[p][g]);
        }
      }
    }
    for (int p = 0; p < P; ++p) {
      for (int g = 0; g < G; ++g) {
        const __m512 sums = sum_halves(acc[p][g]);
        y[g * O + o + 2 * p] = _mm512_cvtss_f32(sums);
        y[g * O + o + 2 * p + 1] = _mm_cvtss_f32(_mm512_extractf32x4_ps(sums, 2));
      }
    }
  }
  if (o < o1) group_rows<G, 1, kPrefetch, kShift, kOffset>(x, w, y, O, I, o, o1);
}

// Pairs of w rows for G rows of x: P * G accumulators, G repeated rows of x,
// P scale vectors (with an offset, P offset vectors too) and a rebuilt pair fit
// the 32 registers; without offsets there is room for a pair more at 3-5 rows,
// and at 5 rows with offsets one spilled vector cost less than a pair fewer. On
// the 2-core Zen 4 of 7 December 2026 (AVX-512, no AMX; benchmarks/
// q8_matmul_variants.py, w[131072, 640]) 5 rows took 5.90 ms against 6.50 and,
// with offsets, 6.19 against 6.45 (both beside a layout of x not kept; at 3
// rows with offsets 6 pairs were slower, 5.29 ms against 4.96, so that stays);
// with these and sum_halves a greedy verify call over 5 positions cost 1.25-1.26
// decode steps against 1.29-1.32 (two runs each, benchmarks/verify_cost.py), over
// 9 no less (1.73-1.77 against 1.72-1.74).
constexpr int kPairs[kMaxGroup + 1] = {0, 8, 6, 6, 5, 4, 3, 2, 2, 2};
constexpr int kOffsetPairs[kMaxGroup + 1] = {0, 8, 6, 5, 4, 4, 3, 2, 2, 2};
#endif

template <bool kPrefetch, int kShift, bool kOffset, int... G>
constexpr std::array<GroupFn, sizeof...(G)> group_fns(std::integer_sequence<int, G...>) {
#if defined(__AVX512F__)
  return {pair_rows<G + 1, kOffset ? kOffsetPairs[G + 1] : kPairs[G + 1], kPrefetch, kShift,
                    kOffset>...};
#else
  return {group_rows<G + 1, kBlockRows[G + 1], kPrefetch, kShift, kOffset>...};
#endif
}

// group_fn<kPrefetch, kShift, kOffset>(g): the function for a group of g rows,
// 1 <= g <= kMaxGroup.
template <bool kPrefetch, int kShift, bool kOffset>
GroupFn group_fn(int g) {
  static constexpr auto fns =
      group_fns<kPrefetch, kShift, kOffset>(std::make_integer_sequence<int, kMaxGroup>());
  return fns[g - 1];
}

// Rows [o0, o1) of y for all N rows of x, one panel of w at a time.
template <int kShift, bool kOffset>
void panel_rows(const float* x, const Blocks& w, float* y, int64_t N, int64_t O, int64_t I,
                int64_t o0, int64_t o1) {
  const int64_t group = specjax::even_group_size(N, kMaxGroup);
  for (int64_t p0 = o0; p0 < o1; p0 += kRowsPerPanel) {
    const int64_t p1 = std::min(o1, p0 + kRowsPerPanel);
    for (int64_t n0 = 0; n0 < N; n0 += group) {
      const int g = static_cast<int>(std::min<int64_t>(group, N - n0));
      GroupFn fn = n0 == 0 ? group_fn<true, kShift, kOffset>(g) : group_fn<false, kShift, kOffset>(g);
      fn(x + n0 * I, w, y + n0 * O, O, I, p0, p1);
    }
  }
}

// log2(B) for the block size B of scale[O, I / B] and q[O, I], or 0 where the shapes do
// not fit or B is not built (kShifts).
int block_shift(ffi::Span<const int64_t> qd, ffi::Span<const int64_t> sd) {
  if (qd.size() != 2 || sd.size() != 2 || sd[0] != qd[0] || sd[1] == 0 || qd[1] % sd[1] != 0)
    return 0;
  const int64_t block = qd[1] / sd[1];
  for (int shift : kShifts)
    if (block == int64_t{1} << shift) return shift;
  return 0;
}

template <bool kOffset>
void panel_rows_of(int shift, const float* x, const Blocks& w, float* y, int64_t N, int64_t O,
                   int64_t I, int64_t o0, int64_t o1) {
  if (shift == 4) {
    panel_rows<4, kOffset>(x, w, y, N, O, I, o0, o1);
  } else {
    panel_rows<5, kOffset>(x, w, y, N, O, I, o0, o1);
  }
}

ffi::Error Run(ffi::ThreadPool pool, const ffi::Buffer<ffi::F32>& x_NxI,
               const ffi::Buffer<ffi::S8>& q_OxI, const ffi::Buffer<ffi::F32>& scale_OxB,
               const ffi::Buffer<ffi::F32>* offset_OxB, ffi::ResultBuffer<ffi::F32>& y_NxO) {
  const auto xd = x_NxI.dimensions();
  const auto qd = q_OxI.dimensions();
  const int shift = block_shift(qd, scale_OxB.dimensions());
  if (xd.size() != 2 || qd.size() != 2 || xd[1] != qd[1] || shift == 0 ||
      (offset_OxB != nullptr && !std::equal(offset_OxB->dimensions().begin(),
                                            offset_OxB->dimensions().end(),
                                            scale_OxB.dimensions().begin(),
                                            scale_OxB.dimensions().end()))) {
    return ffi::Error::InvalidArgument(
        "q8_matmul: expected x[N, I], q[O, I], scale[O, I / B] (and offset like scale), "
        "B 16 or 32");
  }
  const int64_t N = xd[0], I = xd[1], O = qd[0];
  if (N == 0 || O == 0) return ffi::Error::Success();
  const float* x = x_NxI.typed_data();
  const Blocks w{q_OxI.typed_data(), scale_OxB.typed_data(),
                 offset_OxB ? offset_OxB->typed_data() : nullptr, I >> shift};
  float* y = y_NxO->typed_data();
  specjax::run_row_chunks(pool, O, kRowsPerPanel, [=](int64_t o0, int64_t o1) {
    if (w.offset) {
      panel_rows_of<true>(shift, x, w, y, N, O, I, o0, o1);
    } else {
      panel_rows_of<false>(shift, x, w, y, N, O, I, o0, o1);
    }
  });
  return ffi::Error::Success();
}

ffi::Error Q8Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI, ffi::Buffer<ffi::S8> q_OxI,
                    ffi::Buffer<ffi::F32> scale_OxB, ffi::ResultBuffer<ffi::F32> y_NxO) {
  return Run(pool, x_NxI, q_OxI, scale_OxB, nullptr, y_NxO);
}

ffi::Error Q8OffsetMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI,
                          ffi::Buffer<ffi::S8> q_OxI, ffi::Buffer<ffi::F32> scale_OxB,
                          ffi::Buffer<ffi::F32> offset_OxB, ffi::ResultBuffer<ffi::F32> y_NxO) {
  return Run(pool, x_NxI, q_OxI, scale_OxB, &offset_OxB, y_NxO);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_matmul_f32, Q8Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_offset_matmul_f32, Q8OffsetMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
