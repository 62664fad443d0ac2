// argmax_o (x[n] @ w[o]^T) for each row of x[N, I], where w[O, I] is a tied
// head held as int8 blocks (q8_blocks.h): the token greedy decoding takes,
// without writing O logits a row. The same index as the argmax (first index
// of the maximum) of q8_matmul.cc's product, and its value, bit for bit.
//
// Why: a verify call over 5 or 9 positions of the 270M spends half its time
// in the 262,144 x 640 head, and there q8_matmul's float32 multiply-adds, not
// memory, bound it (about 1.7 decode steps at 5 positions). Greedy
// verification needs only each position's argmax.
//
// How: two passes, the first approximate and bounded, the second exact.
//   1. Each row of x is rounded to int8 with a step per block of B inputs
//      (step = max|x| / 127 in the block). Against the head's int8 values, in
//      the tile layout below, 512-bit VNNI dot products (vpdpbusd: 64 int8
//      products a cycle a port) give every block's integer sum exactly; a
//      block's sum times its step and the weight's scale, summed over blocks,
//      is the approximate logit a[o]. |a[o] - y[o]| <= E[o], where
//        E[o] = l1max[o] * sum_b (step_b / 2 + 2^-16 (max|x_b| + step_b)),
//      l1max[o] = max_b sum_{i in b} |w[o, i]|: the rounding of x (at most
//      step_b / 2 an input) plus a margin for the float32 rounding of both a[o]
//      and y[o] (each at most about 2^-17 of sum_i |w[o, i] x[i]|).
//   2. Every o whose upper bound a[o] + E[o] reaches the largest lower bound
//      max_o' (a[o'] - E[o']) is a candidate, and only candidates can be the
//      argmax or tie with it. Candidates get q8_matmul's exact sum
//      (`block_dot`, the same bits), in index order.
// On the 270M's head and raw Spec-Bench text a position had 6 candidates at the
// median, 22 at the 90th percentile and 521 at most (of 1,027;
// benchmarks/head_argmax.py), so the second pass is negligible and the first
// reads the head once at integer speed.
//
// Tile layout (made at load, models/q8_weights.py): the head's rows in tiles
// of 16, each tile's bytes [I / 4][16 rows][4 inputs] as unsigned q + 128
// (vpdpbusd multiplies unsigned bytes by signed ones: sum (q + 128) xs =
// sum q xs + 128 sum xs, and the second term is the row's, subtracted once a
// block); the scales as [tile][block][16 rows]; l1max as [tile][16 rows].
// A row of x with a NaN or an infinity takes every logit exactly (jnp.argmax's
// answer, NaN first): a broken model, never a fast path.
//
// Built only with AVX-512 VNNI and BW (`specjax_q8_argmax_supported` says
// whether this build has them); elsewhere callers take q8_matmul's logits.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define SPECJAX_Q8_ARGMAX 1
#include <immintrin.h>
#endif

#include "pool_work.h"
#include "q8_blocks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 16;       // head rows per tile: one 512-bit vector of int32 sums
constexpr int kMaxGroup = 8;    // rows of x per pass over a tile (2 vectors each in registers)
constexpr int kTilesPerPanel = 16;
constexpr int64_t kTilesPerPass = 16;   // 160 KB of the 270M's head: in L2 for the next group
constexpr float kRoundingMargin = 1.0f / 65536.0f;   // 2^-16, see the top
// How far ahead the tiles' bytes are requested (into L2, as q8_matmul.cc's rows). Without
// it the scan waited on memory: on the 2-core Xeon of 5 December 2026, with the head read
// from memory as in a forward pass (benchmarks/head_argmax.py, two runs), 5 / 9 rows took
// 8.1-8.9 / 10.5-12.1 ms without and 5.8-6.2 / 6.4-8.9 with (64 KiB ahead: no better).
constexpr int64_t kPrefetchBytes = 16384;

struct Candidate {
  int64_t o;
  float upper;
};

// One row of x, rounded to int8 per block.
struct QuantRow {
  std::vector<int8_t> xs;       // [I]
  std::vector<float> step;      // [I / B]
  std::vector<int32_t> minus;   // [I / B]: -128 * sum of the block's xs
  float bound_per_l1 = 0.0f;    // E[o] / l1max[o]
  bool finite = true;
};

QuantRow quantize(const float* x, int64_t I, int64_t B) {
  QuantRow r;
  r.xs.assign(I, 0);
  r.step.assign(I / B, 0.0f);
  r.minus.assign(I / B, 0);
  double bound = 0.0;
  for (int64_t b = 0; b < I / B; ++b) {
    float amax = 0.0f;
    for (int64_t i = b * B; i < (b + 1) * B; ++i) {
      if (!std::isfinite(x[i])) r.finite = false;
      amax = std::max(amax, std::fabs(x[i]));
    }
    if (!r.finite) return r;
    if (amax == 0.0f) continue;
    const float step = amax / 127.0f, inv = 127.0f / amax;
    int32_t sum = 0;
    for (int64_t i = b * B; i < (b + 1) * B; ++i) {
      const int32_t v = std::clamp(static_cast<int32_t>(std::nearbyint(x[i] * inv)), -127, 127);
      r.xs[i] = static_cast<int8_t>(v);
      sum += v;
    }
    r.step[b] = step;
    r.minus[b] = -128 * sum;
    bound += 0.5 * step + kRoundingMargin * (static_cast<double>(amax) + step);
  }
  // Rounded up, and a little more for the float32 arithmetic of a[o] +- E[o] (E[o] is at
  // least 2e-4 of |a[o]|, so their rounding is under 2^-23 / 2e-4 = 6e-4 of E[o]).
  r.bound_per_l1 = static_cast<float>(bound * (1.0 + 1.0 / 256.0));
  return r;
}

struct Head {
  const uint8_t* tiles;   // [O / 16][I / 4][16][4]: q + 128
  const float* tile_scale;   // [O / 16][I / B][16]
  const float* l1max;        // [O / 16][16]
  specjax::Blocks exact;     // q[O, I], scale[O, I / B]
  int64_t O, I, B;
};

// The row's exact argmax and maximum, as jnp.argmax over q8_matmul's logits
// would give them (the first NaN, else the first maximum).
template <int kShift>
std::pair<int32_t, float> every_logit(const float* x, const Head& h) {
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (int64_t o = 0; o < h.O; ++o) {
    const float v = specjax::block_dot<kShift, false>(x, h.exact, h.I, o);
    if (std::isnan(v)) return {static_cast<int32_t>(o), v};
    if (v > best_value || o == 0) {
      best = static_cast<int32_t>(o);
      best_value = v;
    }
  }
  return {best, best_value};
}

#if defined(SPECJAX_Q8_ARGMAX)

inline float max_lane(__m512 v) { return _mm512_reduce_max_ps(v); }

// Candidates of rows [n0, n0 + G) from tiles [t0, t1): approximate logits and
// bounds a tile at a time, kept where the upper bound reaches the row's
// largest lower bound so far (`floor`, raised as tiles go by: a row's set is a
// superset of its final one). `limit`: each row's list length at which it is next
// compacted.
template <int G, int kShift>
void scan_tiles(const Head& h, const QuantRow* rows, int64_t t0, int64_t t1, float* floor,
                std::vector<Candidate>* found, size_t* limit) {
  constexpr int64_t B = int64_t{1} << kShift;
  constexpr int64_t kGroupsPerBlock = B / 4;
  const int64_t blocks = h.I / B;
  __m512 lower_max[G];
  for (int g = 0; g < G; ++g) lower_max[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = h.tiles + t * h.I * kTile;
    const float* scale = h.tile_scale + t * blocks * kTile;
    __m512 logit[G];
    for (int g = 0; g < G; ++g) logit[g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      __m512i acc[G];
      for (int g = 0; g < G; ++g) acc[g] = _mm512_set1_epi32(rows[g].minus[b]);
#pragma GCC unroll 8
      for (int64_t k = 0; k < kGroupsPerBlock; ++k) {
        const uint8_t* line = tile + (b * kGroupsPerBlock + k) * 64;
        __builtin_prefetch(line + kPrefetchBytes, 0, 2);
        const __m512i w = _mm512_loadu_si512(line);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          int32_t x4;
          __builtin_memcpy(&x4, rows[g].xs.data() + b * B + 4 * k, sizeof(x4));
          acc[g] = _mm512_dpbusd_epi32(acc[g], w, _mm512_set1_epi32(x4));
        }
      }
      const __m512 s = _mm512_loadu_ps(scale + b * kTile);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[g]), _mm512_set1_ps(rows[g].step[b]));
        logit[g] = _mm512_fmadd_ps(part, s, logit[g]);
      }
    }
    const __m512 l1 = _mm512_loadu_ps(h.l1max + t * kTile);
    for (int g = 0; g < G; ++g) {
      const __m512 e = _mm512_mul_ps(l1, _mm512_set1_ps(rows[g].bound_per_l1));
      const __m512 upper = _mm512_add_ps(logit[g], e);
      lower_max[g] = _mm512_max_ps(lower_max[g], _mm512_sub_ps(logit[g], e));
      if ((t - t0) % 8 == 0) floor[g] = std::max(floor[g], max_lane(lower_max[g]));
      __mmask16 keep = _mm512_cmp_ps_mask(upper, _mm512_set1_ps(floor[g]), _CMP_GE_OQ);
      while (keep) {
        const int lane = __builtin_ctz(keep);
        keep &= keep - 1;
        float u[kTile];
        _mm512_storeu_ps(u, upper);
        found[g].push_back({t * kTile + lane, u[lane]});
      }
      if (found[g].size() > limit[g]) {   // keep the list short while the floor rises
        floor[g] = std::max(floor[g], max_lane(lower_max[g]));
        const float f = floor[g];
        found[g].erase(std::remove_if(found[g].begin(), found[g].end(),
                                      [f](const Candidate& c) { return c.upper < f; }),
                       found[g].end());
        // Where many rows stay within reach (flat logits), compact only when the list has
        // doubled again, so that compacting costs O(1) a candidate, not O(list) a tile.
        limit[g] = std::max(limit[g], 2 * found[g].size());
      }
    }
  }
  for (int g = 0; g < G; ++g) floor[g] = std::max(floor[g], max_lane(lower_max[g]));
}

using ScanFn = void (*)(const Head&, const QuantRow*, int64_t, int64_t, float*,
                        std::vector<Candidate>*, size_t*);

template <int kShift, int... G>
constexpr std::array<ScanFn, sizeof...(G)> scan_fns(std::integer_sequence<int, G...>) {
  return {scan_tiles<G + 1, kShift>...};
}

template <int kShift>
ScanFn scan_fn(int g) {
  static constexpr auto fns = scan_fns<kShift>(std::make_integer_sequence<int, kMaxGroup>());
  return fns[g - 1];
}

template <int kShift>
void argmax_rows(ffi::ThreadPool& pool, const float* x, const Head& h, int64_t N, int32_t* index,
                 float* value) {
  std::vector<QuantRow> rows;
  rows.reserve(N);
  std::vector<int64_t> fast;   // rows with finite x
  for (int64_t n = 0; n < N; ++n) {
    rows.push_back(quantize(x + n * h.I, h.I, h.B));
    if (rows.back().finite) fast.push_back(n);
  }
  const int64_t F = static_cast<int64_t>(fast.size());
  std::vector<QuantRow> packed;
  packed.reserve(F);
  for (int64_t n : fast) packed.push_back(rows[n]);
  std::vector<float> floor(F, -std::numeric_limits<float>::infinity());
  std::vector<std::vector<Candidate>> found(F);
  std::mutex merge;
  const int64_t tiles = h.O / kTile;
  if (F > 0) {
    specjax::run_row_chunks(pool, tiles, kTilesPerPanel, [&](int64_t t0, int64_t t1) {
      std::vector<float> local_floor(F, -std::numeric_limits<float>::infinity());
      std::vector<size_t> limit(F, 4096);
      std::vector<std::vector<Candidate>> local(F);
      // Each group of rows over a few tiles at a time, so the later groups find them in L2.
      for (int64_t s0 = t0; s0 < t1; s0 += kTilesPerPass) {
        const int64_t s1 = std::min(t1, s0 + kTilesPerPass);
        for (int64_t n0 = 0; n0 < F; n0 += kMaxGroup) {
          const int g = static_cast<int>(std::min<int64_t>(kMaxGroup, F - n0));
          scan_fn<kShift>(g)(h, packed.data() + n0, s0, s1, local_floor.data() + n0,
                             local.data() + n0, limit.data() + n0);
        }
      }
      std::lock_guard<std::mutex> lock(merge);
      for (int64_t f = 0; f < F; ++f) {
        floor[f] = std::max(floor[f], local_floor[f]);
        for (const Candidate& c : local[f])
          if (c.upper >= local_floor[f]) found[f].push_back(c);
      }
    });
  }
  for (int64_t f = 0; f < F; ++f) {
    std::vector<Candidate>& c = found[f];
    std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.o < b.o; });
    const float* xn = x + fast[f] * h.I;
    int32_t best = -1;
    float best_value = 0.0f;
    for (const Candidate& cand : c) {
      if (cand.upper < floor[f]) continue;
      const float v = specjax::block_dot<kShift, false>(xn, h.exact, h.I, cand.o);
      if (best < 0 || v > best_value) {
        best = static_cast<int32_t>(cand.o);
        best_value = v;
      }
    }
    index[fast[f]] = best;
    value[fast[f]] = best_value;
  }
  for (int64_t n = 0; n < N; ++n) {
    if (!rows[n].finite) std::tie(index[n], value[n]) = every_logit<kShift>(x + n * h.I, h);
  }
}

#endif  // SPECJAX_Q8_ARGMAX

ffi::Error Q8Argmax(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI, ffi::Buffer<ffi::U8> tiles,
                    ffi::Buffer<ffi::F32> tile_scale, ffi::Buffer<ffi::F32> l1max,
                    ffi::Buffer<ffi::S8> q_OxI, ffi::Buffer<ffi::F32> scale_OxB,
                    ffi::ResultBuffer<ffi::S32> index_N, ffi::ResultBuffer<ffi::F32> value_N) {
  const auto xd = x_NxI.dimensions();
  const auto qd = q_OxI.dimensions();
  const auto sd = scale_OxB.dimensions();
  const auto td = tiles.dimensions();
  const auto tsd = tile_scale.dimensions();
  const auto ld = l1max.dimensions();
  const bool shapes = xd.size() == 2 && qd.size() == 2 && sd.size() == 2 && td.size() == 2 &&
                      tsd.size() == 2 && ld.size() == 2 && xd[1] == qd[1] && sd[0] == qd[0] &&
                      sd[1] > 0 && qd[1] % sd[1] == 0 && qd[0] % kTile == 0 &&
                      td[0] == qd[0] / kTile && td[1] == qd[1] * kTile && tsd[0] == td[0] &&
                      tsd[1] == sd[1] * kTile && ld[0] == td[0] && ld[1] == kTile;
  const int64_t B = shapes ? qd[1] / sd[1] : 0;
  if (!shapes || (B != 16 && B != 32)) {
    return ffi::Error::InvalidArgument(
        "q8_argmax: expected x[N, I], tiles[O / 16, I * 16], tile_scale[O / 16, I / B * 16], "
        "l1max[O / 16, 16], q[O, I], scale[O, I / B], O a multiple of 16, B 16 or 32");
  }
#if defined(SPECJAX_Q8_ARGMAX)
  const Head h{tiles.typed_data(), tile_scale.typed_data(), l1max.typed_data(),
               specjax::Blocks{q_OxI.typed_data(), scale_OxB.typed_data(), nullptr, sd[1]},
               qd[0], qd[1], B};
  if (xd[0] == 0 || h.O == 0) return ffi::Error::Success();
  if (B == 16) {
    argmax_rows<4>(pool, x_NxI.typed_data(), h, xd[0], index_N->typed_data(),
                   value_N->typed_data());
  } else {
    argmax_rows<5>(pool, x_NxI.typed_data(), h, xd[0], index_N->typed_data(),
                   value_N->typed_data());
  }
  return ffi::Error::Success();
#else
  return ffi::Error::Internal("q8_argmax: this build has no AVX-512 VNNI (see "
                              "specjax_q8_argmax_supported)");
#endif
}

ffi::Error Supported(ffi::ResultBuffer<ffi::S32> out) {
#if defined(SPECJAX_Q8_ARGMAX)
  *out->typed_data() = 1;
#else
  *out->typed_data() = 0;
#endif
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_argmax_f32, Q8Argmax,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_argmax_supported, Supported,
                              ffi::Ffi::Bind().Ret<ffi::Buffer<ffi::S32>>());
