// The attention of a few new tokens over a KV cache, in float32, as an XLA:CPU FFI call.
//
//   out[b, t, k, g] = sum_s softmax_s(mask[b, t, s] ? cap(q[b, t, k, g] . key[b, s, k]) : -inf)
//                     * value[b, s, k]
//
// Why: a decode step or a verify call of the 270M multiplies 4 to 36 query rows
// by every cache slot, and XLA:CPU runs each of those small products on one
// thread at a fraction of the memory's speed (18 layers at 1,024 slots: 7 ms
// a decode step, against 1 ms to read the keys and values once). It also
// reads every slot, where most may be past the row's length or outside a
// local layer's window. This kernel reads each live slot's key and value once,
// skips slots no query of the row may see, and splits the slots over XLA's
// own thread pool in fixed chunks (flash-decoding's split over the keys).
//
// Each query's output is summed in an order fixed by the slot chunks alone:
// its dot products in 16 float lanes (8 without AVX-512), its softmax and
// values chunk by chunk, the chunks combined in slot order. Neither the other
// queries, nor the number of threads, nor which thread ran a chunk changes a
// bit of it.
//
// Compiled on first use by specjax/cpu_kernels/build.py with -march=native.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#if defined(__AVX__)
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
typedef int32_t i32x8 __attribute__((vector_size(32)));

// Slots per work item: small enough that a short row's few live chunks still
// spread over the threads, large enough that the per-chunk partial results
// (one output row per query) cost little beside the chunk's reads.
constexpr int64_t kChunkSlots = 64;
// Register blocks: a group of queries against a block of key rows (their
// dot products), and against 16 value columns (their weighted sum). AVX-512VL
// has 32 vector registers for the accumulators, AVX2 16. Larger value blocks
// spilled to the stack (GCC 12): 4 queries x 32 columns ran 10-20% slower.
constexpr int kQueryGroup = 4;
constexpr int kValueQueries = 4;
constexpr int kValueVectors = 2;
#if defined(__AVX512VL__)
constexpr int kKeyBlock = 4;
#else
constexpr int kKeyBlock = 2;
#endif
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline void store8(float* p, f32x8 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// The dot products and the weighted sum of values run on the widest vectors the CPU has:
// 16 floats with AVX-512 (twice the multiply-adds an instruction of 8; a verify call's
// attention over 5 to 9 positions is bound by them), else 8.
#if defined(__AVX512F__)
constexpr int kWide = 16;
typedef float f32xw __attribute__((vector_size(64)));
inline f32xw loadw(const float* p) {
  f32xw v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void storew(float* p, f32xw v) { __builtin_memcpy(p, &v, sizeof(v)); }
inline f32xw maddw(f32xw acc, f32xw a, f32xw b) {
  return reinterpret_cast<f32xw>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                                 reinterpret_cast<__m512>(b),
                                                 reinterpret_cast<__m512>(acc)));
}
// Lanes 0-7 plus lanes 8-15, then `sum_lanes`: a fixed order.
inline float sumw(f32xw a) {
  f32x8 lo, hi;
  __builtin_memcpy(&lo, &a, sizeof(lo));
  __builtin_memcpy(&hi, reinterpret_cast<const char*>(&a) + sizeof(lo), sizeof(hi));
  return sum_lanes(lo + hi);
}
#else
constexpr int kWide = kLanes;
typedef f32x8 f32xw;
inline f32xw loadw(const float* p) { return load8(p); }
inline void storew(float* p, f32xw v) { store8(p, v); }
inline f32xw maddw(f32xw acc, f32xw a, f32xw b) { return madd(acc, a, b); }
inline float sumw(f32xw a) { return sum_lanes(a); }
#endif

// The key block's sums against the query group, all at once: sums[sum_lane(j)] is
// sumw(acc[j]) bit for bit, acc[j] being key row j / kQueryGroup against query
// j % kQueryGroup. With AVX the sums are added across the accumulators by the same
// tree on every lane (i + 8, i + 4, i + 2, i + 1 apart), transposing as they go: 45
// instructions for 16 accumulators of 16 lanes where 16 `sumw` take over a hundred,
// most of them on the shuffle port that the 512-bit multiply-adds share.
constexpr int kSums = kKeyBlock * kQueryGroup;
#if defined(__AVX512VL__)
static_assert(kWide == 16 && kSums == 16, "16 accumulators of 16 lanes");
constexpr int sum_lane(int j) { return 4 * (j % 4) + j / 4; }
inline void sum_each(const f32xw* a, float* sums) {
  __m512 t[8], x[4], z[2];
  for (int i = 0; i < 8; ++i) {   // i + 8: a[2i] in lanes 0-7, a[2i + 1] in 8-15
    const __m512 u = reinterpret_cast<__m512>(a[2 * i]);
    const __m512 v = reinterpret_cast<__m512>(a[2 * i + 1]);
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0x44), _mm512_shuffle_f32x4(u, v, 0xEE));
  }
  for (int i = 0; i < 4; ++i)     // i + 4: 128-bit lane k holds a[4i + k]
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)     // i + 2
    z[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  _mm512_storeu_ps(sums, _mm512_add_ps(  // i + 1
      _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
      _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1))));
}
#elif defined(__AVX__) && !defined(__AVX512F__)
static_assert(kWide == 8 && kSums == 8, "8 accumulators of 8 lanes");
constexpr int sum_lane(int j) { return 4 * (j % 2) + j / 2; }
inline void sum_each(const f32xw* a, float* sums) {
  __m256 t[4], z[2];
  for (int i = 0; i < 4; ++i) {   // i + 4: a[2i] in lanes 0-3, a[2i + 1] in 4-7
    const __m256 u = reinterpret_cast<__m256>(a[2 * i]);
    const __m256 v = reinterpret_cast<__m256>(a[2 * i + 1]);
    t[i] = _mm256_add_ps(_mm256_permute2f128_ps(u, v, 0x20), _mm256_permute2f128_ps(u, v, 0x31));
  }
  for (int i = 0; i < 2; ++i)     // i + 2
    z[i] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  _mm256_storeu_ps(sums, _mm256_add_ps(  // i + 1
      _mm256_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
      _mm256_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1))));
}
#else
constexpr int sum_lane(int j) { return j; }
inline void sum_each(const f32xw* a, float* sums) {
  for (int j = 0; j < kSums; ++j) sums[j] = sumw(a[j]);
}
#endif
inline f32xw splatw(float x) { return f32xw{} + x; }

inline f32x8 splat(float x) { return f32x8{x, x, x, x, x, x, x, x}; }

// e^x for 8 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
// polynomial in r, then 2^n by the exponent bits); within 2 ulp on [-87, 88].
inline f32x8 exp8(f32x8 x) {
  x = x < splat(-87.3f) ? splat(-87.3f) : x;
  x = x > splat(88.3f) ? splat(88.3f) : x;
  const f32x8 t = x * splat(1.44269504088896341f);
  const f32x8 half = t < splat(0.0f) ? splat(-0.5f) : splat(0.5f);
  const i32x8 n = __builtin_convertvector(t + half, i32x8);
  const f32x8 nf = __builtin_convertvector(n, f32x8);
  f32x8 r = x - nf * splat(0.693359375f);
  r = r - nf * splat(-2.12194440e-4f);
  f32x8 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * (r * r) + r + splat(1.0f);
  const i32x8 bits = (n + 127) << 23;
  f32x8 scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

struct Shapes {
  int64_t B, T, K, G, H, S;
  int64_t N() const { return T * G; }                  // queries per (row, K/V head)
  int64_t C() const { return (S + kChunkSlots - 1) / kChunkSlots; }
};

// Everything one call shares between its threads.
struct Call {
  Shapes d;
  const float* q;       // [B, T, K, G, H]
  const float* key;     // [B, S, K, H]
  const float* value;   // [B, S, K, H]
  const bool* mask;     // [B, T, S]
  float* out;           // [B, T, K, G, H]
  float softcap;        // 0: none
  // Per (row, K/V head, chunk, query): the chunk's max logit, its sum of
  // e^(logit - max), and its unnormalised output row.
  float* part_max;
  float* part_sum;
  float* part_out;
  int64_t num_items;
  specjax::PoolCounters counters;

  const float* query(int64_t b, int64_t n, int64_t k) const {
    const int64_t t = n / d.G, g = n % d.G;
    return q + (((b * d.T + t) * d.K + k) * d.G + g) * d.H;
  }
  float* out_row(int64_t b, int64_t n, int64_t k) const {
    const int64_t t = n / d.G, g = n % d.G;
    return out + (((b * d.T + t) * d.K + k) * d.G + g) * d.H;
  }
  int64_t part(int64_t b, int64_t k, int64_t c, int64_t n) const {
    return ((b * d.K + k) * d.C() + c) * d.N() + n;
  }

  void chunk(int64_t item, std::vector<int64_t>& live, std::vector<float>& p,
             std::vector<float>& vis) const;
  void item(int64_t i) {
    // Scratch per thread, kept between calls (as the partial results are).
    thread_local std::vector<int64_t> live;
    thread_local std::vector<float> p, vis;
    chunk(i, live, p, vis);
  }
};

// One (row, K/V head, slot chunk): the partial softmax and output of every query.
void Call::chunk(int64_t item, std::vector<int64_t>& live, std::vector<float>& p,
                 std::vector<float>& vis) const {
  const int64_t C = d.C(), N = d.N(), H = d.H, Hw = H / kWide * kWide;
  const int64_t c = item % C, k = (item / C) % d.K, b = item / (C * d.K);
  const int64_t s0 = c * kChunkSlots, s1 = std::min(d.S, s0 + kChunkSlots);
  const bool* mask_b = mask + b * d.T * d.S;

  live.clear();
  for (int64_t s = s0; s < s1; ++s) {
    for (int64_t t = 0; t < d.T; ++t) {
      if (mask_b[t * d.S + s]) {
        live.push_back(s);
        break;
      }
    }
  }
  const int64_t L = static_cast<int64_t>(live.size());
  for (int64_t n = 0; n < N; ++n) {
    part_max[part(b, k, c, n)] = kNegInf;
    part_sum[part(b, k, c, n)] = 0.0f;
  }
  if (L == 0) return;
  const int64_t stride = d.K * H;  // between slots of one K/V head
  const float* key_bk = key + (b * d.S * d.K + k) * H;
  const float* value_bk = value + (b * d.S * d.K + k) * H;

  // Logits, p[n * W8 + s - s0] for query n at live slot s: a block of key
  // rows against a group of queries, the key rows read once from memory.
  // Indexed by slot, not by live slot: a query's sums then fall in the same
  // lanes whichever slots the other queries make live.
  const int64_t W8 = (s1 - s0 + kLanes - 1) / kLanes * kLanes;  // rows padded for exp8
  p.assign(N * W8, 0.0f);
  for (int64_t j0 = 0; j0 < L; j0 += kKeyBlock) {
    const int64_t gj = std::min<int64_t>(kKeyBlock, L - j0);
    const float* kr[kKeyBlock];
    for (int64_t r = 0; r < kKeyBlock; ++r) kr[r] = key_bk + live[j0 + std::min(r, gj - 1)] * stride;
    for (int64_t r = 0; r < gj; ++r) {  // the value rows, on their way while the keys are used
      const char* vr = reinterpret_cast<const char*>(value_bk + live[j0 + r] * stride);
      for (int64_t byte = 0; byte < H * 4; byte += 64) __builtin_prefetch(vr + byte, 0, 3);
    }
    for (int64_t n0 = 0; n0 < N; n0 += kQueryGroup) {
      const int64_t gn = std::min<int64_t>(kQueryGroup, N - n0);
      const float* qr[kQueryGroup];
      for (int64_t u = 0; u < kQueryGroup; ++u) qr[u] = query(b, n0 + std::min(u, gn - 1), k);
      f32xw acc[kKeyBlock][kQueryGroup] = {};
      for (int64_t h = 0; h < Hw; h += kWide) {
        f32xw qv[kQueryGroup];
#pragma GCC unroll 4
        for (int u = 0; u < kQueryGroup; ++u) qv[u] = loadw(qr[u] + h);
#pragma GCC unroll 4
        for (int r = 0; r < kKeyBlock; ++r) {
          const f32xw kv = loadw(kr[r] + h);
#pragma GCC unroll 4
          for (int u = 0; u < kQueryGroup; ++u) acc[r][u] = maddw(acc[r][u], kv, qv[u]);
        }
      }
      float sums[kSums];
      sum_each(&acc[0][0], sums);
      for (int64_t r = 0; r < gj; ++r) {
        for (int64_t u = 0; u < gn; ++u) {
          float s = sums[sum_lane(r * kQueryGroup + u)];
          for (int64_t h = Hw; h < H; ++h) s += kr[r][h] * qr[u][h];
          if (softcap > 0.0f) s = std::tanh(s / softcap) * softcap;
          p[(n0 + u) * W8 + live[j0 + r] - s0] = s;
        }
      }
    }
  }

  // Softmax within the chunk, over each query's own visible slots: vis[t, s - s0]
  // is 1 where new token t may see slot s, else 0 (and 0 in the padding).
  vis.assign(d.T * W8, 0.0f);
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t s = s0; s < s1; ++s) vis[t * W8 + s - s0] = mask_b[t * d.S + s] ? 1.0f : 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    const float* vt = vis.data() + (n / d.G) * W8;
    float* pn = p.data() + n * W8;
    f32x8 mv = splat(kNegInf);
    for (int64_t j = 0; j < W8; j += kLanes) {
      const f32x8 x = load8(pn + j);
      mv = load8(vt + j) > splat(0.0f) && x > mv ? x : mv;
    }
    float m = kNegInf;
    for (int e = 0; e < kLanes; ++e) m = std::max(m, mv[e]);
    if (m == kNegInf) {
      std::fill(pn, pn + W8, 0.0f);
      continue;
    }
    f32x8 sv = splat(0.0f);
    for (int64_t j = 0; j < W8; j += kLanes) {
      const f32x8 e = load8(vt + j) > splat(0.0f) ? exp8(load8(pn + j) - splat(m)) : splat(0.0f);
      store8(pn + j, e);
      sv += e;
    }
    part_max[part(b, k, c, n)] = m;
    part_sum[part(b, k, c, n)] = sum_lanes(sv);
  }

  // Values: out[n] = sum_j p[n, j] value[live j], 16 columns for a group of
  // queries at a time, each value row read once per group from cache.
  for (int64_t n0 = 0; n0 < N; n0 += kValueQueries) {
    const int64_t gn = std::min<int64_t>(kValueQueries, N - n0);
    const float* pr[kValueQueries];
    float* orow[kValueQueries];
    for (int64_t u = 0; u < kValueQueries; ++u) {
      const int64_t n = n0 + std::min(u, gn - 1);
      pr[u] = p.data() + n * W8 - s0;
      orow[u] = part_out + part(b, k, c, n) * H;
    }
    int64_t h = 0;
    for (; h + kValueVectors * kWide <= H; h += kValueVectors * kWide) {
      f32xw acc[kValueQueries][kValueVectors] = {};
      for (int64_t j = 0; j < L; ++j) {
        const float* vr = value_bk + live[j] * stride + h;
        f32xw vv[kValueVectors];
#pragma GCC unroll 4
        for (int e = 0; e < kValueVectors; ++e) vv[e] = loadw(vr + e * kWide);
#pragma GCC unroll 8
        for (int u = 0; u < kValueQueries; ++u) {
          const f32xw pu = splatw(pr[u][live[j]]);
#pragma GCC unroll 4
          for (int e = 0; e < kValueVectors; ++e) acc[u][e] = maddw(acc[u][e], pu, vv[e]);
        }
      }
      for (int64_t u = 0; u < gn; ++u)
        for (int e = 0; e < kValueVectors; ++e) storew(orow[u] + h + e * kWide, acc[u][e]);
    }
    for (; h < H; ++h) {  // columns left over (head dims not a multiple of the block)
      for (int64_t u = 0; u < gn; ++u) {
        float s = 0.0f;
        for (int64_t j = 0; j < L; ++j) s += pr[u][live[j]] * value_bk[live[j] * stride + h];
        orow[u][h] = s;
      }
    }
  }
}

// The chunks' partial results, combined in slot order into each query's output.
void combine(const Call& call) {
  const Shapes& d = call.d;
  const int64_t C = d.C(), N = d.N(), H = d.H;
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t k = 0; k < d.K; ++k) {
      for (int64_t n = 0; n < N; ++n) {
        float* o = call.out_row(b, n, k);
        float m = kNegInf;
        for (int64_t c = 0; c < C; ++c) m = std::max(m, call.part_max[call.part(b, k, c, n)]);
        std::fill(o, o + H, 0.0f);
        if (m == kNegInf) continue;  // a query that may see no slot: zeros
        float denom = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = call.part(b, k, c, n);
          if (call.part_max[i] == kNegInf) continue;
          const float w = std::exp(call.part_max[i] - m);
          denom += w * call.part_sum[i];
          const float* po = call.part_out + i * H;
          for (int64_t h = 0; h < H; ++h) o[h] += w * po[h];
        }
        const float inv = 1.0f / denom;
        for (int64_t h = 0; h < H; ++h) o[h] *= inv;
      }
    }
  }
}

ffi::Error Attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q_BxTxKxGxH,
                     ffi::Buffer<ffi::F32> k_BxSxKxH, ffi::Buffer<ffi::F32> v_BxSxKxH,
                     ffi::Buffer<ffi::PRED> mask_BxTxS, float softcap,
                     ffi::ResultBuffer<ffi::F32> out_BxTxKxGxH) {
  const auto qd = q_BxTxKxGxH.dimensions();
  const auto kd = k_BxSxKxH.dimensions();
  const auto vd = v_BxSxKxH.dimensions();
  const auto md = mask_BxTxS.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || vd.size() != 4 || md.size() != 3 ||
      kd[0] != qd[0] || kd[2] != qd[2] || kd[3] != qd[4] ||
      vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3] ||
      md[0] != qd[0] || md[1] != qd[1] || md[2] != kd[1]) {
    return ffi::Error::InvalidArgument(
        "attention: expected q[B, T, K, G, H], key and value [B, S, K, H], mask[B, T, S]");
  }
  const Shapes d{qd[0], qd[1], qd[2], qd[3], qd[4], kd[1]};
  if (d.B * d.T * d.K * d.G * d.H == 0) return ffi::Error::Success();

  // The partial results, kept between calls by the calling thread (a layer's
  // call needs the same few MB every step; page-faulting them in each time cost more).
  thread_local std::vector<float> parts;
  const int64_t items = d.B * d.K * d.C();
  const int64_t rows = items * d.N();
  parts.resize(rows * (d.H + 2));
  auto call = std::make_shared<Call>();
  call->d = d;
  call->q = q_BxTxKxGxH.typed_data();
  call->key = k_BxSxKxH.typed_data();
  call->value = v_BxSxKxH.typed_data();
  call->mask = mask_BxTxS.typed_data();
  call->out = out_BxTxKxGxH->typed_data();
  call->softcap = softcap;
  call->part_max = parts.data();
  call->part_sum = parts.data() + rows;
  call->part_out = parts.data() + 2 * rows;
  call->num_items = items;

  specjax::run_on_pool(pool, call);
  combine(*call);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_attention_f32, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Attr<float>("softcap")
                                  .Ret<ffi::Buffer<ffi::F32>>());
