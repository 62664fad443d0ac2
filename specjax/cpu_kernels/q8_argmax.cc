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
// Built with AVX-512 VNNI and BW, or with AVX2 and FMA (`specjax_q8_argmax_supported`
// says whether this build has either); elsewhere callers take q8_matmul's logits. AVX2
// has no vpdpbusd: vpmaddubsw multiplies |q| by x with q's sign and adds pairs into int16
// (never saturating, see the AVX2 scan_tiles), vpmaddwd adds the pairs into the same int32
// sums, and the rounding and bound are the VNNI pass's. On an AVX2 CPU a greedy verify call otherwise
// computes all 262,144 logits a row in float32 multiply-adds of 8 lanes: at 9 rows 1.5
// G multiply-adds, which 2 cores take 20 ms or more over, beside a 15 ms decode step.
//
// The AMX screen (`specjax_q8_argmax_screen_f32`, where the CPU has AMX-INT8:
// `specjax_q8_argmax_screen_supported`). At 9 rows the VNNI pass above is bound
// by its multiply-adds, not memory (7.2 ms against 5.9 at one row), and an AMX
// tile product cannot take its place: the blocks' scales differ, so every
// block's sums would be stored and scaled on their own. So the screen reads a
// second table of the head's size made at load (q8_argmax.py's `screen_form`),
// the weights w (q8_matmul's float32 q * scale) rounded to int8 with one scale
// a row: s[o] = max|w[o]| / 127, r[o, i] = rint(w[o, i] / s[o]), and beside
// them l1[o] = sum_i |w[o, i]| and err[o] = max_i |w[o, i] - s[o] r[o, i]|, both
// rounded up. Each row of x becomes integers X = rint(x / u) with one unit u
// = 2^(e - 14) a row (2^(e - 1) <= max|x| < 2^e: |X| <= 2^14, two signed bytes),
// and a tile product multiplies 64 inputs of 16 head rows by all of x's
// integer rows, the int32 sums running over the whole row of the head. Then
// a[o] = s[o] u sum_i r[o, i] X[i], and (`screen_row`)
//   |y[o] - a[o]| <= l1[o] (u / 2 + 2^-16 max|x|) + err[o] (u sum|X| + ...),
// from w . (x - uX) and (w - s r) . uX and the roundings. The candidates and the
// exact second pass are those above. On raw-text Spec-Bench positions (627 of
// 12 prompts, 6 December 2026) this bound left 13 candidates at the median, 48
// at the 90th percentile and 458 at most; the VNNI pass's bound 6 / 27 / 521.
// A row of x that is all zeros has the first index; one with max|x| under
// 2^-100 takes every logit, as a non-finite one does.

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
#define SPECJAX_Q8_ARGMAX_VNNI 1   // the first pass on 512-bit VNNI dot products
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define SPECJAX_Q8_ARGMAX 1        // the first pass on AVX2's byte multiply-adds
#include <immintrin.h>
#endif

#include "amx_tiles.h"
#include "float_bits.h"
#include "pool_work.h"
#include "q8_blocks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 16;       // head rows per tile: one 512-bit vector of int32 sums
#if defined(SPECJAX_Q8_ARGMAX_VNNI)
// Rows of x per pass over a tile (2 vectors each in registers): a verify call over 8 drafts
// in one pass. With 8, its 9 rows took a pass of 8 and one of 1, and the call 24.6-25.3 ms
// against 23.0-23.6 with 9 (2-core Zen 4, 7 December 2026, benchmarks/verify_cost.py, two
// runs each in turns; a third, with the even groups below: 23.3 against 24.1). At batch 4,
// 20 / 36 rows took 49.8 / 83.8 ms against 48.6 / 82.8 in that run: within its spread.
constexpr int kMaxGroup = 9;
#else
constexpr int kMaxGroup = 8;    // AVX2: 16 vector registers, one accumulator a row (a half tile)
#endif
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
// Drops a row's candidates below its floor. Where many rows stay within reach (flat
// logits), the next compaction waits until the list has doubled again, so that compacting
// costs O(1) a candidate, not O(list) a tile.
inline void compact(float floor, std::vector<Candidate>* found, size_t* limit) {
  found->erase(std::remove_if(found->begin(), found->end(),
                              [floor](const Candidate& c) { return c.upper < floor; }),
               found->end());
  *limit = std::max(*limit, 2 * found->size());
}
#endif

#if defined(SPECJAX_Q8_ARGMAX_VNNI)

inline float max_lane(__m512 v) { return _mm512_reduce_max_ps(v); }

// One row's candidate-keeping state over a chunk of tiles: the largest lower bound seen
// (lanes), the floor it has raised, the candidates and the list length at which they are
// next compacted.
struct RowScan {
  __m512 lower_max;
  float* floor;
  std::vector<Candidate>* found;
  size_t* limit;
};

// Keeps tile t's outputs whose upper bound reaches the row's floor (raised from the lower
// bounds every 8 tiles: a row's set is a superset of its final one).
inline void keep_candidates(int64_t t, int64_t tiles_seen, __m512 upper, __m512 lower,
                            RowScan& r) {
  r.lower_max = _mm512_max_ps(r.lower_max, lower);
  if (tiles_seen % 8 == 0) *r.floor = std::max(*r.floor, max_lane(r.lower_max));
  __mmask16 keep = _mm512_cmp_ps_mask(upper, _mm512_set1_ps(*r.floor), _CMP_GE_OQ);
  while (keep) {
    const int lane = __builtin_ctz(keep);
    keep &= keep - 1;
    float u[kTile];
    _mm512_storeu_ps(u, upper);
    r.found->push_back({t * kTile + lane, u[lane]});
  }
  if (r.found->size() > *r.limit) {   // keep the list short while the floor rises
    *r.floor = std::max(*r.floor, max_lane(r.lower_max));
    compact(*r.floor, r.found, r.limit);
  }
}

// Candidates of rows [n0, n0 + G) from tiles [t0, t1): approximate logits and bounds a
// tile at a time (VNNI dot products of the int8-rounded rows).
template <int G, int kShift>
void scan_tiles(const Head& h, const QuantRow* rows, int64_t t0, int64_t t1, float* floor,
                std::vector<Candidate>* found, size_t* limit) {
  constexpr int64_t B = int64_t{1} << kShift;
  constexpr int64_t kGroupsPerBlock = B / 4;
  const int64_t blocks = h.I / B;
  RowScan scan[G];
  for (int g = 0; g < G; ++g)
    scan[g] = {_mm512_set1_ps(-std::numeric_limits<float>::infinity()), floor + g, found + g,
               limit + g};
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
      keep_candidates(t, t - t0, _mm512_add_ps(logit[g], e), _mm512_sub_ps(logit[g], e), scan[g]);
    }
  }
  for (int g = 0; g < G; ++g) floor[g] = std::max(floor[g], max_lane(scan[g].lower_max));
}

#elif defined(SPECJAX_Q8_ARGMAX)

// AVX2's first pass: the same tiles, rounding, bounds and candidates, on 256-bit vectors. A
// tile's 16 rows are two vectors of 8. vpmaddubsw multiplies unsigned bytes by signed ones
// and adds each pair into int16 with saturation, so it takes |q| (at most 128) against x
// with q's sign (|x| <= 127): a pair is at most 2 * 128 * 127 = 32,512 < 2^15, exact.
// vpmaddwd by ones then adds the pairs into the int32 sum of 4 inputs a row, sum q x, that
// vpdpbusd's sum (q + 128) x less 128 sum x gives (so no block term here).
struct RowScan {
  float lower_max;
  float* floor;
  std::vector<Candidate>* found;
  size_t* limit;
};

// As the AVX-512 keep_candidates, over a tile's 16 bounds in memory.
inline void keep_candidates(int64_t t, int64_t tiles_seen, const float* upper,
                            const float* lower, RowScan& r) {
  for (int l = 0; l < kTile; ++l) r.lower_max = std::max(r.lower_max, lower[l]);
  if (tiles_seen % 8 == 0) *r.floor = std::max(*r.floor, r.lower_max);
  for (int l = 0; l < kTile; ++l) {
    if (upper[l] >= *r.floor) r.found->push_back({t * kTile + l, upper[l]});
  }
  if (r.found->size() > *r.limit) {
    *r.floor = std::max(*r.floor, r.lower_max);
    compact(*r.floor, r.found, r.limit);
  }
}

// A tile is scanned a half (8 of its rows) at a time, the second half's bytes read again
// from L1: with both halves at once, G rows of x kept 2 G accumulators live beside the
// tile's bytes and their magnitudes, and at G = 4 the compiler spilled 5 of the 8 to the
// stack inside the loop (a load and a store each, every 4 inputs). A half takes 8 rows of
// x, so the tile's load, flip and magnitudes serve twice as many. On the 2-core Xeon of 6
// December 2026 (the haswell build, raw-text hidden states, best of 7 or 9) the head's
// argmax at 5 / 9 rows took 10.4 / 17.0 ms against 11.9 / 18.7 before in one script's
// run, 11.0 / 17.7 against 11.5 / 18.2 in benchmarks/head_argmax.py's. Rounding x to 7
// bits instead, to multiply the tile's unsigned bytes by it without q's sign, was no
// faster (10.6 / 16.8 ms) and left 39 candidates at the median, 6,963 at most.
template <int G, int kShift>
void scan_tiles(const Head& h, const QuantRow* rows, int64_t t0, int64_t t1, float* floor,
                std::vector<Candidate>* found, size_t* limit) {
  constexpr int64_t B = int64_t{1} << kShift;
  constexpr int64_t kGroupsPerBlock = B / 4;
  const int64_t blocks = h.I / B;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));   // q + 128 -> q
  RowScan scan[G];
  for (int g = 0; g < G; ++g)
    scan[g] = {-std::numeric_limits<float>::infinity(), floor + g, found + g, limit + g};
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = h.tiles + t * h.I * kTile;
    const float* scale = h.tile_scale + t * blocks * kTile;
    alignas(32) float logit[G][kTile];
    for (int half = 0; half < 2; ++half) {
      __m256 sum[G];
      for (int g = 0; g < G; ++g) sum[g] = _mm256_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        __m256i acc[G];
        for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int64_t k = 0; k < kGroupsPerBlock; ++k) {
          const uint8_t* line = tile + (b * kGroupsPerBlock + k) * 64;
          if (half == 0) __builtin_prefetch(line + kPrefetchBytes, 0, 2);
          const __m256i q = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * half)), flip);
          const __m256i abs_q = _mm256_abs_epi8(q);
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) {
            int32_t x4;
            __builtin_memcpy(&x4, rows[g].xs.data() + b * B + 4 * k, sizeof(x4));
            acc[g] = _mm256_add_epi32(acc[g], _mm256_madd_epi16(
                _mm256_maddubs_epi16(abs_q, _mm256_sign_epi8(_mm256_set1_epi32(x4), q)), ones));
          }
        }
        const __m256 s = _mm256_loadu_ps(scale + b * kTile + 8 * half);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          sum[g] = _mm256_fmadd_ps(
              _mm256_mul_ps(_mm256_cvtepi32_ps(acc[g]), _mm256_set1_ps(rows[g].step[b])), s,
              sum[g]);
        }
      }
      for (int g = 0; g < G; ++g) _mm256_store_ps(logit[g] + 8 * half, sum[g]);
    }
    const __m256 l1a = _mm256_loadu_ps(h.l1max + t * kTile);
    const __m256 l1b = _mm256_loadu_ps(h.l1max + t * kTile + 8);
    for (int g = 0; g < G; ++g) {
      const __m256 bound = _mm256_set1_ps(rows[g].bound_per_l1);
      const __m256 e0 = _mm256_mul_ps(l1a, bound), e1 = _mm256_mul_ps(l1b, bound);
      const __m256 a0 = _mm256_load_ps(logit[g]), a1 = _mm256_load_ps(logit[g] + 8);
      alignas(32) float upper[kTile], lower[kTile];
      _mm256_store_ps(upper, _mm256_add_ps(a0, e0));
      _mm256_store_ps(upper + 8, _mm256_add_ps(a1, e1));
      _mm256_store_ps(lower, _mm256_sub_ps(a0, e0));
      _mm256_store_ps(lower + 8, _mm256_sub_ps(a1, e1));
      keep_candidates(t, t - t0, upper, lower, scan[g]);
    }
  }
  for (int g = 0; g < G; ++g) floor[g] = std::max(floor[g], scan[g].lower_max);
}

#endif  // SPECJAX_Q8_ARGMAX_VNNI, else AVX2

#if defined(SPECJAX_Q8_ARGMAX)

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

// The argmax of each of the F rows `fast[f]` of x: `scan(t0, t1, floor, found, limit)`
// finds the candidates of every row among tiles [t0, t1), a chunk of the head at a time on
// the pool (each chunk with floors and lists of its own, merged here); then each row's
// candidates get the exact sum, in index order.
template <int kShift, typename Scan>
void argmax_of_candidates(ffi::ThreadPool& pool, const float* x, const Head& h,
                          const std::vector<int64_t>& fast, Scan scan, int32_t* index,
                          float* value) {
  const int64_t F = static_cast<int64_t>(fast.size());
  if (F == 0) return;
  std::vector<float> floor(F, -std::numeric_limits<float>::infinity());
  std::vector<std::vector<Candidate>> found(F);
  std::mutex merge;
  specjax::run_row_chunks(pool, h.O / kTile, kTilesPerPanel, [&](int64_t t0, int64_t t1) {
    std::vector<float> local_floor(F, -std::numeric_limits<float>::infinity());
    std::vector<size_t> limit(F, 4096);
    std::vector<std::vector<Candidate>> local(F);
    scan(t0, t1, local_floor.data(), local.data(), limit.data());
    std::lock_guard<std::mutex> lock(merge);
    for (int64_t f = 0; f < F; ++f) {
      floor[f] = std::max(floor[f], local_floor[f]);
      for (const Candidate& c : local[f])
        if (c.upper >= local_floor[f]) found[f].push_back(c);
    }
  });
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
  argmax_of_candidates<kShift>(
      pool, x, h, fast,
      [&](int64_t t0, int64_t t1, float* floor, std::vector<Candidate>* found, size_t* limit) {
        // Each group of rows over a few tiles at a time, so the later groups find them in L2.
        const int64_t group = specjax::even_group_size(F, kMaxGroup);
        for (int64_t s0 = t0; s0 < t1; s0 += kTilesPerPass) {
          const int64_t s1 = std::min(t1, s0 + kTilesPerPass);
          for (int64_t n0 = 0; n0 < F; n0 += group) {
            const int g = static_cast<int>(std::min<int64_t>(group, F - n0));
            scan_fn<kShift>(g)(h, packed.data() + n0, s0, s1, floor + n0, found + n0,
                               limit + n0);
          }
        }
      },
      index, value);
  for (int64_t n = 0; n < N; ++n) {
    if (!rows[n].finite) std::tie(index[n], value[n]) = every_logit<kShift>(x + n * h.I, h);
  }
}

#endif  // SPECJAX_Q8_ARGMAX

#if defined(SPECJAX_Q8_ARGMAX_VNNI) && defined(SPECJAX_AMX)

// ---- The AMX screen (see the top): x's rows as 2-byte integers, a tile product per 64
// inputs against the head's screen table, int32 sums over a whole row of the head. ----

constexpr int kScreenKeptBits = 14;   // |X| <= 2^14: two balanced bytes (the upper in [-64, 64])
constexpr int kScreenLimbs = 2;
constexpr int kScreenK = 64;          // inputs a tile product takes
constexpr int kScreenGroup = 16;      // rows of x a pass: 32 integer rows, two A tiles
constexpr float kScreenSlack = 1.0f + 1.0f / 16.0f;   // see `screen_row`

struct Screen {
  const int8_t* tiles;   // [O / 16][I / 4][16][4]: the screen table's rounded weights
  const float* meta;     // [O / 16][3][16]: its per-row scale, l1 and err (see the top)
};

// The fast rows of x as integers for the screen: limbs[(f * 2 + l) * I + i] (X = l0 + 256 l1),
// and per row 2^e' (X's unit) and the bound's two factors.
struct ScreenRows {
  std::vector<int8_t> limbs;
  std::vector<float> unit, per_l1, per_err;
};

// Float rounded up from a non-negative double.
inline float round_up(double v) {
  const float f = static_cast<float>(v);
  return static_cast<double>(f) >= v ? f
                                     : std::nextafter(f, std::numeric_limits<float>::infinity());
}

// Row x[I] (finite, 2^-100 <= max|x| < 2^100) as integers X = rint(x / u), u = 2^(e - 14)
// for 2^(e - 1) <= max|x| < 2^e, so |X| <= 2^14 and |x - X u| <= u / 2. The bound of the top,
// E[o] = l1[o] * per_l1 + err[o] * per_err, with
//   per_l1 = (u / 2 + 2^-16 max|x|) * slack, per_err = (u sum|X| + I 2^-20 max|x|) * slack:
// l1[o] u / 2 bounds w[o] . (x - X u), err[o] u sum|X| bounds (w[o] - s[o] q[o]) . X u, and
// 2^-16 l1[o] max|x| the float32 rounding of the exact logit (q8_matmul's sum, at most about
// 2^-17.6 of it) and of a[o]; I 2^-20 max|x| err[o] covers a[o]'s rounding where the screen's
// weights' l1 exceeds w's. The slack (1 + 2^-4) covers the float32 rounding of a +- E.
void screen_row(const float* x, int64_t I, float amax, int8_t* limbs, float* unit, float* per_l1,
                float* per_err) {
  const int f = specjax::exponent(amax) - kScreenKeptBits;
  const __m512 up = _mm512_set1_ps(specjax::pow2(-f));
  __m512i abs_sum = _mm512_setzero_si512();   // at most I 2^14: exact in int32 for I < 2^17
  for (int64_t i = 0; i < I; i += 16) {
    const __m512i X = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), up));
    const __m512i low = _mm512_srai_epi32(_mm512_slli_epi32(X, 24), 24);   // in [-128, 127]
    const __m512i high = _mm512_srai_epi32(_mm512_sub_epi32(X, low), 8);   // in [-64, 64]
    _mm_storeu_si128(reinterpret_cast<__m128i*>(limbs + i), _mm512_cvtepi32_epi8(low));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(limbs + I + i), _mm512_cvtepi32_epi8(high));
    abs_sum = _mm512_add_epi32(abs_sum, _mm512_abs_epi32(X));
  }
  const double u = specjax::pow2d(f), m = amax;
  *unit = static_cast<float>(u);
  *per_l1 = round_up((u / 2 + m / 65536.0) * kScreenSlack);
  *per_err = round_up((u * _mm512_reduce_add_epi32(abs_sum) + static_cast<double>(I) * m /
                       1048576.0) * kScreenSlack);
}

// Tile registers: 0 and 1 the group's integer rows (A tiles: rows 0-15 and 16-31), 2 and 3
// two output tiles' screen weights (64 inputs of 16 outputs), 4-7 their sums with each A
// tile. Two output tiles at a time: four independent sums a step, so that a product does
// not wait for the one before it into the same tile (as one tile's two would).
specjax::TileConfig screen_config(int64_t limb_rows) {
  const int a0 = static_cast<int>(std::min<int64_t>(16, limb_rows));
  const int a1 = static_cast<int>(limb_rows - a0);
  specjax::TileConfig c;
  c.set(0, a0, kScreenK);
  if (a1) c.set(1, a1, kScreenK);
  c.set(2, kScreenK / 4, 64);
  c.set(3, kScreenK / 4, 64);
  c.set(4, a0, 64);
  c.set(5, a0, 64);
  if (a1) {
    c.set(6, a1, 64);
    c.set(7, a1, 64);
  }
  return c;
}

// The sums of output tiles `tile0` and `tile1` over all I inputs, into c[2][32][16] (tile,
// integer row, output).
inline void screen_sums(const int8_t* tile0, const int8_t* tile1, const int8_t* limbs,
                        int64_t I, bool two, int32_t* c) {
  _tile_zero(4);
  _tile_zero(5);
  if (two) {
    _tile_zero(6);
    _tile_zero(7);
  }
  for (int64_t k = 0; k < I; k += kScreenK) {
    // The next pair's same inputs, into L2, a step at a time: on the 2-core Xeon (6 December
    // 2026, one thread, the 270M's head from memory) the whole pair's requested at once
    // took 1.9x as long at one row (the requests outran the queue), 10 KB ahead 1.1-1.4x.
    for (int64_t p = 0; p < kScreenK * kTile; p += 64) {
      __builtin_prefetch(tile0 + 2 * I * kTile + k * kTile + p, 0, 2);
      __builtin_prefetch(tile1 + 2 * I * kTile + k * kTile + p, 0, 2);
    }
    _tile_loadd(0, limbs + k, I);
    _tile_loadd(2, tile0 + k * kTile, 64);
    _tile_loadd(3, tile1 + k * kTile, 64);
    _tile_dpbssd(4, 0, 2);
    _tile_dpbssd(5, 0, 3);
    if (two) {
      _tile_loadd(1, limbs + 16 * I + k, I);
      _tile_dpbssd(6, 1, 2);
      _tile_dpbssd(7, 1, 3);
    }
  }
  _tile_stored(4, c, 64);
  _tile_stored(5, c + 32 * kTile, 64);
  if (two) {
    _tile_stored(6, c + 16 * kTile, 64);
    _tile_stored(7, c + 48 * kTile, 64);
  }
}

// Tile t's approximate logits a = s[o] u (C0 + 256 C1) and bounds for the group's rows.
inline void screen_bounds(const Screen& s, const ScreenRows& r, int64_t t, int64_t tiles_seen,
                          const int32_t* c, int64_t f0, int64_t rows, RowScan* scan) {
  const float* meta = s.meta + t * 3 * kTile;
  const __m512 scale = _mm512_loadu_ps(meta), l1 = _mm512_loadu_ps(meta + kTile),
               err = _mm512_loadu_ps(meta + 2 * kTile);
  for (int64_t g = 0; g < rows; ++g) {
    const int32_t* cg = c + g * kScreenLimbs * kTile;
    const __m512 d = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cg + kTile)),
                                     _mm512_set1_ps(256.0f),
                                     _mm512_cvtepi32_ps(_mm512_load_si512(cg)));
    const __m512 a = _mm512_mul_ps(d, _mm512_mul_ps(scale, _mm512_set1_ps(r.unit[f0 + g])));
    const __m512 e = _mm512_fmadd_ps(l1, _mm512_set1_ps(r.per_l1[f0 + g]),
                                     _mm512_mul_ps(err, _mm512_set1_ps(r.per_err[f0 + g])));
    keep_candidates(t, tiles_seen, _mm512_add_ps(a, e), _mm512_sub_ps(a, e), scan[g]);
  }
}

// Candidates of the F fast rows among tiles [t0, t1), groups of up to 16 rows a few tiles
// at a time (the later groups find them in L2).
void screen_tiles(const Screen& s, const ScreenRows& r, int64_t F, int64_t I, int64_t t0,
                  int64_t t1, float* floor, std::vector<Candidate>* found, size_t* limit) {
  thread_local std::vector<int32_t> buffer;
  buffer.resize(2 * 32 * kTile + 16);
  int32_t* c = reinterpret_cast<int32_t*>(
      (reinterpret_cast<uintptr_t>(buffer.data()) + 63) / 64 * 64);
  const int64_t groups = (F + kScreenGroup - 1) / kScreenGroup;
  std::vector<RowScan> scan(F);
  for (int64_t f = 0; f < F; ++f)
    scan[f] = {_mm512_set1_ps(-std::numeric_limits<float>::infinity()), floor + f, found + f,
               limit + f};
  int64_t configured = 0;   // the integer rows the tile configuration loaded is for
  for (int64_t s0 = t0; s0 < t1; s0 += kTilesPerPass) {
    const int64_t s1 = std::min(t1, s0 + kTilesPerPass);
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t f0 = F * group / groups, rows = F * (group + 1) / groups - f0;
      const int64_t limb_rows = rows * kScreenLimbs;
      if (limb_rows != configured) {
        const specjax::TileConfig config = screen_config(limb_rows);
        _tile_loadconfig(&config);
        configured = limb_rows;
      }
      const int8_t* limbs = r.limbs.data() + f0 * kScreenLimbs * I;
      for (int64_t t = s0; t < s1; t += 2) {
        const int8_t* tile0 = s.tiles + t * I * kTile;
        const int8_t* tile1 = t + 1 < s1 ? tile0 + I * kTile : tile0;   // the last one twice
        screen_sums(tile0, tile1, limbs, I, limb_rows > 16, c);
        screen_bounds(s, r, t, t - t0, c, f0, rows, scan.data() + f0);
        if (t + 1 < s1)
          screen_bounds(s, r, t + 1, t + 1 - t0, c + 32 * kTile, f0, rows, scan.data() + f0);
      }
    }
  }
  _tile_release();
  for (int64_t f = 0; f < F; ++f) floor[f] = std::max(floor[f], max_lane(scan[f].lower_max));
}

template <int kShift>
void screen_argmax_rows(ffi::ThreadPool& pool, const float* x, const Head& h, const Screen& s,
                        int64_t N, int32_t* index, float* value) {
  ScreenRows r;
  std::vector<int64_t> fast, slow;   // slow: a NaN, an infinity, or max|x| out of range
  std::vector<float> amax(N);
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * h.I;
    const bool finite = specjax::block_maxima(xn, h.I, h.I, &amax[n]);   // and under 2^100
    if (finite && amax[n] == 0.0f) {   // every logit is +-0: the first is the argmax
      index[n] = 0;
      value[n] = specjax::block_dot<kShift, false>(xn, h.exact, h.I, 0);
    } else {
      (finite && amax[n] >= 0x1p-100f ? fast : slow).push_back(n);
    }
  }
  const int64_t F = static_cast<int64_t>(fast.size());
  r.limbs.resize(F * kScreenLimbs * h.I);
  r.unit.resize(F), r.per_l1.resize(F), r.per_err.resize(F);
  for (int64_t f = 0; f < F; ++f)
    screen_row(x + fast[f] * h.I, h.I, amax[fast[f]], r.limbs.data() + f * kScreenLimbs * h.I,
               &r.unit[f], &r.per_l1[f], &r.per_err[f]);
  argmax_of_candidates<kShift>(
      pool, x, h, fast,
      [&](int64_t t0, int64_t t1, float* floor, std::vector<Candidate>* found, size_t* limit) {
        screen_tiles(s, r, F, h.I, t0, t1, floor, found, limit);
      },
      index, value);
  for (int64_t n : slow) std::tie(index[n], value[n]) = every_logit<kShift>(x + n * h.I, h);
}

#endif  // SPECJAX_Q8_ARGMAX_VNNI && SPECJAX_AMX

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
  return ffi::Error::Internal("q8_argmax: this build has neither AVX-512 VNNI nor AVX2 (see "
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

ffi::Error Q8ArgmaxScreen(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI,
                          ffi::Buffer<ffi::S8> screen, ffi::Buffer<ffi::F32> meta,
                          ffi::Buffer<ffi::S8> q_OxI, ffi::Buffer<ffi::F32> scale_OxB,
                          ffi::ResultBuffer<ffi::S32> index_N,
                          ffi::ResultBuffer<ffi::F32> value_N) {
  const auto xd = x_NxI.dimensions(), qd = q_OxI.dimensions(), sd = scale_OxB.dimensions(),
             td = screen.dimensions(), md = meta.dimensions();
  const bool shapes = xd.size() == 2 && qd.size() == 2 && sd.size() == 2 && td.size() == 2 &&
                      md.size() == 2 && xd[1] == qd[1] && sd[0] == qd[0] && sd[1] > 0 &&
                      qd[1] % sd[1] == 0 && qd[0] % kTile == 0 && qd[1] % 64 == 0 &&
                      td[0] == qd[0] / kTile && td[1] == qd[1] * kTile && md[0] == td[0] &&
                      md[1] == 3 * kTile;
  const int64_t B = shapes ? qd[1] / sd[1] : 0;
  if (!shapes || (B != 16 && B != 32)) {
    return ffi::Error::InvalidArgument(
        "q8_argmax screen: expected x[N, I], screen[O / 16, I * 16], meta[O / 16, 48], "
        "q[O, I], scale[O, I / B], O a multiple of 16, I of 64, B 16 or 32");
  }
#if defined(SPECJAX_Q8_ARGMAX_VNNI) && defined(SPECJAX_AMX)
  if (!specjax::amx_usable()) {
    return ffi::Error::Internal("q8_argmax screen: this CPU or OS does not let the process use "
                                "AMX (check specjax_q8_argmax_screen_supported first)");
  }
  const Head h{nullptr, nullptr, nullptr,
               specjax::Blocks{q_OxI.typed_data(), scale_OxB.typed_data(), nullptr, sd[1]},
               qd[0], qd[1], B};
  const Screen s{screen.typed_data(), meta.typed_data()};
  if (xd[0] == 0 || h.O == 0) return ffi::Error::Success();
  if (B == 16) {
    screen_argmax_rows<4>(pool, x_NxI.typed_data(), h, s, xd[0], index_N->typed_data(),
                          value_N->typed_data());
  } else {
    screen_argmax_rows<5>(pool, x_NxI.typed_data(), h, s, xd[0], index_N->typed_data(),
                          value_N->typed_data());
  }
  return ffi::Error::Success();
#else
  return ffi::Error::Internal("q8_argmax screen: this build has no AMX-INT8 (see "
                              "specjax_q8_argmax_screen_supported)");
#endif
}

ffi::Error ScreenSupported(ffi::ResultBuffer<ffi::S32> out) {
#if defined(SPECJAX_Q8_ARGMAX_VNNI) && defined(SPECJAX_AMX)
  *out->typed_data() = specjax::amx_usable() ? 1 : 0;
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_argmax_screen_f32, Q8ArgmaxScreen,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_argmax_screen_supported, ScreenSupported,
                              ffi::Ffi::Bind().Ret<ffi::Buffer<ffi::S32>>());
