// y[N, O] = x[N, I] @ w[O, I]^T in float32, for a few rows N, as an XLA:CPU FFI call.
//
// Why: a verify call multiplies gamma + 1 rows by every matrix of the target,
// and XLA:CPU's kernels for that shape first read the matrix and then compute,
// so a 5-row product of the 270M's tied head (262,144 x 640) costs about twice
// a 1-row one. This kernel streams each matrix once, in row blocks, with a
// software prefetch far enough ahead that the reads run under the arithmetic
// (staged by CPU vendor: see Staging), and splits the rows over XLA's own
// intra-op thread pool.
//
// Every output element is one dot product, accumulated in 8 float lanes in the
// order of i, then summed pairwise in a fixed order. Nothing about it depends
// on N, the row block or the thread, so y[n] is bit-identical to the product of
// row n alone. (A whole verify call is not bit-identical to decode steps: XLA's
// attention and norms still sum in an order that depends on the shape.)
//
// Compiled on first use by specjax/cpu_kernels/build.py with -march=native.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

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

// How far ahead of the row being read the next reads are requested, in floats
// (64 KiB): measured on a 2-core Zen 4 EPYC, 32-128 KiB all stream at full speed.
constexpr int64_t kPrefetchFloats = 16384;

// Where those reads are staged, as __builtin_prefetch's locality. 64 KiB ahead
// is past L1, so a line has to wait in L2. The kernel was tuned on Zen 4 with
// the non-temporal hint, and AMD keeps it. On Intel that hint fills L1 alone:
// the line is evicted before it is used and read from memory twice. On a
// 2-core Xeon with AMX (Sapphire Rapids class) the head at one row took 77 ms
// with it, 26 ms with locality 2 (prefetcht1, into L2) and 29 ms under XLA.
enum Staging { kNoPrefetch = -1, kNonTemporal = 0, kLevel2 = 2 };

// Floats between two prefetches along a row of w: every 8-float step, or once
// per 64-byte line in groups of 6 or more rows of x staged in L2. Those groups
// are bound by their arithmetic and their loads of x, and half the prefetches
// there only cost load slots. On the Xeon above, in turns in one process
// (benchmarks/skinny_matmul_variants.py), the head took 4-17% less time at 7 to
// 12 rows and the same at 2 to 5. AMD's path keeps every step, as tuned.
template <int G, int kStaging>
constexpr int64_t kPrefetchStride = (kStaging == kLevel2 && G >= 6) ? 16 : 8;

// Asks for the part of w kPrefetchFloats ahead of w_i (at float i of its row),
// every kPrefetchStride floats, staged as kStaging says.
template <int G, int kStaging>
inline void prefetch_ahead(const float* w_i, int64_t i) {
  if constexpr (kStaging != kNoPrefetch) {
    if (i % kPrefetchStride<G, kStaging> == 0) __builtin_prefetch(w_i + kPrefetchFloats, 0, kStaging);
  }
}

// Rows of w read from memory once and then reused, from L1/L2, by every group
// of up to kMaxGroup rows of x. A multiple of most row blocks below.
constexpr int64_t kRowsPerPanel = 48;
constexpr int kMaxGroup = 8;

inline float finish(f32x8 acc, const float* w_row, const float* x_row, int64_t i0, int64_t I) {
  float s = sum_lanes(acc);
  for (int64_t i = i0; i < I; ++i) s += w_row[i] * x_row[i];
  return s;
}

// Rows [o0, o1) of y for G rows of x, R rows of w at a time (G * R accumulators
// stay in registers). The first group's pass over a panel prefetches (kStaging);
// the other groups read the panel from cache.
template <int G, int R, int kStaging>
void group_rows(const float* x, const float* w, float* y, int64_t O, int64_t I,
                int64_t o0, int64_t o1) {
  const int64_t I8 = I / kLanes * kLanes;
  int64_t o = o0;
  for (; o + R <= o1; o += R) {
    f32x8 acc[R][G] = {};
    for (int64_t i = 0; i < I8; i += kLanes) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const float* w_ri = w + (o + r) * I + i;
        prefetch_ahead<G, kStaging>(w_ri, i);
        const f32x8 wv = load8(w_ri);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc[r][g] = madd(acc[r][g], wv, load8(x + g * I + i));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g)
        y[g * O + o + r] = finish(acc[r][g], w + (o + r) * I, x + g * I, I8, I);
  }
  for (; o < o1; ++o) {  // the rows left over: the same sums, one w row at a time
    f32x8 acc[G] = {};
    for (int64_t i = 0; i < I8; i += kLanes) {
      const float* w_oi = w + o * I + i;
      prefetch_ahead<G, kStaging>(w_oi, i);
      f32x8 wv = load8(w_oi);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) acc[g] = madd(acc[g], wv, load8(x + g * I + i));
    }
    for (int g = 0; g < G; ++g) y[g * O + o] = finish(acc[g], w + o * I, x + g * I, I8, I);
  }
}

using GroupFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);

// Row blocks R for G rows of x: as many accumulators (G * R) as the vector
// registers hold beside a row of w, x read from L1 as memory operands (more,
// and the compiler keeps the accumulators in memory: 4-9x slower). With
// AVX-512VL there are 32 of them (measured on a Zen 4 EPYC, the head at 5 rows:
// 25 ms at R = 6 against 29 at R = 3), otherwise 16.
#if defined(__AVX512VL__)
constexpr int kBlockRows[kMaxGroup + 1] = {0, 16, 12, 8, 6, 6, 4, 4, 3};
#else
constexpr int kBlockRows[kMaxGroup + 1] = {0, 8, 6, 4, 3, 2, 2, 1, 1};
#endif

template <int kStaging>
GroupFn group_fn(int g) {
  switch (g) {
    case 1: return group_rows<1, kBlockRows[1], kStaging>;
    case 2: return group_rows<2, kBlockRows[2], kStaging>;
    case 3: return group_rows<3, kBlockRows[3], kStaging>;
    case 4: return group_rows<4, kBlockRows[4], kStaging>;
    case 5: return group_rows<5, kBlockRows[5], kStaging>;
    case 6: return group_rows<6, kBlockRows[6], kStaging>;
    case 7: return group_rows<7, kBlockRows[7], kStaging>;
    default: return group_rows<8, kBlockRows[8], kStaging>;
  }
}

// The group function for the first pass over a panel, chosen by CPU vendor
// (the vendor test exists on x86 only; elsewhere the reads are staged in L2).
GroupFn first_group_fn(int g) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool amd = __builtin_cpu_is("amd");
#else
  constexpr bool amd = false;
#endif
  return amd ? group_fn<kNonTemporal>(g) : group_fn<kLevel2>(g);
}

// Rows [o0, o1) of y for all N rows of x, one panel of w at a time.
void panel_rows(const float* x, const float* w, float* y, int64_t N, int64_t O, int64_t I,
                int64_t o0, int64_t o1) {
  for (int64_t p0 = o0; p0 < o1; p0 += kRowsPerPanel) {
    const int64_t p1 = std::min(o1, p0 + kRowsPerPanel);
    for (int64_t n0 = 0; n0 < N; n0 += kMaxGroup) {
      const int g = static_cast<int>(std::min<int64_t>(kMaxGroup, N - n0));
      GroupFn fn = n0 == 0 ? first_group_fn(g) : group_fn<kNoPrefetch>(g);
      fn(x + n0 * I, w, y + n0 * O, O, I, p0, p1);
    }
  }
}

ffi::Error SkinnyMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI,
                        ffi::Buffer<ffi::F32> w_OxI, ffi::ResultBuffer<ffi::F32> y_NxO) {
  const auto xd = x_NxI.dimensions();
  const auto wd = w_OxI.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1]) {
    return ffi::Error::InvalidArgument("skinny_matmul: expected x[N, I] and w[O, I]");
  }
  const int64_t N = xd[0], I = xd[1], O = wd[0];
  if (N == 0 || O == 0) return ffi::Error::Success();
  const float* x = x_NxI.typed_data();
  const float* w = w_OxI.typed_data();
  float* y = y_NxO->typed_data();
  specjax::run_row_chunks(pool, O, kRowsPerPanel, [=](int64_t o0, int64_t o1) {
    panel_rows(x, w, y, N, O, I, o0, o1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_skinny_matmul_f32, SkinnyMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
