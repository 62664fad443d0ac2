// y[N, O] = x[N, I] @ w[O, I]^T in float32 for a matrix held as int8 blocks
// (w[o, i] = q[o, i] * scale[o, i / B] (- offset[o, i / B]), B 16 or 32, as
// q8_matmul.cc), by Intel AMX's integer tile products. Two XLA:CPU FFI calls,
// without and with offset, and `specjax_q8_amx_supported`.
//
// Why: at one row a product of the 270M's layers is bound by reading the int8
// weights, but at 5 to 24 rows (a verify call, a batch) q8_matmul.cc rebuilds
// every weight as a float and does one float32 multiply-add a row: 16 a
// 512-bit instruction. An AMX tile product (TDPBSSD) does 16 x 16 x 64 int8
// multiply-adds, exactly, in int32, from the int8 weights as they are. The
// weights stay exact; x is what must become integers.
//
// x as integers: for each row n and block b of B inputs, with e such that
// max|x| < 2^e, every x[n, i] of the block becomes X * 2^(e - 22) for the
// integer X = rint(x * 2^(22 - e)), |X| <= 2^22, written as kLimbs = 3 signed
// bytes, X = l0 + 2^8 l1 + 2^16 l2 (each in [-128, 127]). That rounds x to 22
// bits of its block's largest magnitude: a block's dot product is off by at
// most 2^-23 * max|x| * sum|w|, where float32's own sum is off by up to
// 2^-24 * sum|w x| at each of its I / 8 additions. On the 270M, over 9 raw-text
// positions (6 December 2026), the logits differed from XLA's float32 forward
// over the dequantized weights by at most 7.3e-5, and q8_matmul's by 7.2e-5.
// Four bytes (30 bits) made 9-row products 1.7x slower (three tile products a
// block instead of two) for no difference a logit showed.
//
// A tile product per block: rows of A are the limbs of every row of x over
// the block's B inputs (row n * kLimbs + l), B is the tile of 16 outputs x B
// inputs of w, and C[n * kLimbs + l][o] = sum_i l_l[n, i] * q[o, i], an exact
// int32 (|C| <= 32 * 128 * 128). Then per row and block, in float32 and in
// this fixed order: D = C0 * 2^f + C1 * 2^(f + 8) + C2 * 2^(f + 16)
// (f = e - 22), y += scale[o, b] * D, and for an offset form y -= offset[o, b]
// * S, S the block's sum of x from the same integers (exact, one rounding).
// Every y[n, o] is made of row n's own numbers in an order that does not
// depend on N, the other rows, the tile or the thread: row n of y is the same
// bits whatever N, as a decode step and a verify call must give. The sums
// differ from q8_matmul's (which adds float32 products in 8 lanes) by
// rounding: a deterministic kernel of its own, used for every product of 1 to
// MAX_ROWS rows of a model's layers where it is available, decode and
// verification alike.
//
// A row of x with a NaN or an infinity, or so large (2^100) that its scaled
// integers' weights overflow, takes a plain float32 sum over the weights,
// so it gives what float arithmetic gives (NaN, inf).
//
// The weights are read in a tile layout made at load (q8_amx.py's
// `tile_form`): q as int8 [O / 16][I / 4][16][4] (a tile's rows are 4
// consecutive inputs of 16 outputs, as TDPBSSD reads B), the scales (and
// offsets) as [O / 16][I / B][16] (16 outputs' scales for a block in one
// vector).
//
// Needs AMX-TILE, AMX-INT8 and AVX-512 VBMI (Sapphire Rapids and later) and the kernel's
// permission to use tile data (Linux's arch_prctl ARCH_REQ_XCOMP_PERM, asked
// once); `specjax_q8_amx_supported` says whether this build on this CPU has
// them. Elsewhere callers take q8_matmul.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "amx_tiles.h"
#include "float_bits.h"
#include "pool_work.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kCols = 16;        // outputs per tile: one 512-bit vector of int32 sums
constexpr int kLimbs = 3;        // signed bytes per integer of x
constexpr int kKeptBits = 22;    // |X| <= 2^22: three balanced bytes hold it (see the top)
constexpr int kTileRows = 16;    // rows of A (and C) per tile
constexpr int64_t kPrefetchBytes = 16384;   // tiles read ahead, as q8_matmul.cc

#if defined(SPECJAX_AMX)

// `rows`: the rows of A and C tiles, 16 but where one tile holds every integer row of x (1 to
// 5 rows of x): then no product or store of padding, and a decode step's products (3 rows)
// take 9% less time (single thread, 6 December 2026).
specjax::TileConfig tile_config(int64_t B, int rows) {
  specjax::TileConfig c;
  for (int t : {0, 4}) {   // registers 0-3 and 4-7: B, A, C, C
    c.set(t, static_cast<int>(B / 4), 64);     // 4 inputs of 16 outputs a row
    c.set(t + 1, rows, static_cast<int>(B));   // B inputs of a limb row
    c.set(t + 2, rows, 64);                    // 16 int32 sums
    c.set(t + 3, rows, 64);
  }
  return c;
}

#endif  // SPECJAX_AMX

using specjax::block_maxima;
using specjax::exponent;
using specjax::pow2;
using specjax::pow2d;

// x's rows as integers (see the top).
struct IntegerRows {
  int64_t N = 0, I = 0, B = 0, blocks = 0;
  int64_t a_tiles = 0, tile_rows = 0;   // A tiles of `tile_rows` integer rows each
  int64_t a_rows() const { return a_tiles * tile_rows; }
  std::unique_ptr<int8_t[]> limbs;      // [a_rows()][I]: row n * kLimbs + l; then rows of 0
  std::unique_ptr<float[]> weights;     // [N][blocks][kLimbs]: 2^(f + 8 l)
  std::unique_ptr<float[]> sums;        // [N][blocks]: the block's sum of x (offset forms)
  std::unique_ptr<uint8_t[]> on_tiles;  // [N]: 0 where the row takes the float path
};

#if defined(SPECJAX_AMX)
// Row n's block of B inputs (B a multiple of 16) as integers X = rint(x * 2^up_exponent),
// written as limbs at limbs[l * stride + i]; returns the sum of the X (|X| <= 2^22, so
// 32 of them sum exactly in int32). The same X as the scalar path below: x times a power
// of two is exact, and the conversion rounds to nearest even. Limbs: X + 0x808080 has
// the bytes l + 128 (the balanced digits are unique), so its bytes xor 0x80 are the limbs
// as signed bytes, gathered by one byte permutation.
inline int32_t vector_block(const float* xb, int64_t B, int up_exponent, int8_t* limbs,
                            int64_t stride) {
  static const __m512i kLimbBytes = [] {   // byte l of lane j to position 16 l + j
    alignas(64) int8_t index[64];
    for (int l = 0; l < 4; ++l)
      for (int j = 0; j < 16; ++j) index[16 * l + j] = static_cast<int8_t>(4 * j + l);
    return _mm512_load_si512(index);
  }();
  const __m512i bias = _mm512_set1_epi32(0x808080);
  const __m512 up = _mm512_set1_ps(pow2(up_exponent));
  __m512i sum = _mm512_setzero_si512();
  for (int64_t i = 0; i < B; i += 16) {
    const __m512i X = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + i), up));
    sum = _mm512_add_epi32(sum, X);
    const __m512i bytes = _mm512_permutexvar_epi8(
        kLimbBytes, _mm512_xor_si512(_mm512_add_epi32(X, bias), bias));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(limbs + i), _mm512_castsi512_si128(bytes));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(limbs + stride + i),
                     _mm512_extracti32x4_epi32(bytes, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(limbs + 2 * stride + i),
                     _mm512_extracti32x4_epi32(bytes, 2));
  }
  return _mm512_reduce_add_epi32(sum);
}
#endif

// The same, one element at a time, for any exponent.
inline int64_t scalar_block(const float* xb, int64_t B, int up_exponent, int8_t* limbs,
                            int64_t stride) {
  int64_t sum = 0;
  for (int64_t i = 0; i < B; ++i) {
    int64_t X = static_cast<int64_t>(
        std::nearbyint(std::ldexp(static_cast<double>(xb[i]), up_exponent)));
    sum += X;
    for (int l = 0; l < kLimbs; ++l) {
      const int64_t limb = ((X + 128) & 255) - 128;
      limbs[l * stride + i] = static_cast<int8_t>(limb);
      X = (X - limb) >> 8;
    }
  }
  return sum;
}

IntegerRows to_integers(const float* x, int64_t N, int64_t I, int64_t B, bool with_sums) {
  IntegerRows r;
  r.N = N, r.I = I, r.B = B, r.blocks = I / B;
  // As few tiles as hold the rows, and the rows spread evenly over them: tile products
  // and stores of fewer rows take less time (9 rows of x: two tiles of 14 integer rows).
  r.a_tiles = (N * kLimbs + kTileRows - 1) / kTileRows;
  r.tile_rows = (N * kLimbs + r.a_tiles - 1) / r.a_tiles;
  r.limbs.reset(new int8_t[r.a_rows() * I]);
  std::memset(r.limbs.get() + N * kLimbs * I, 0, (r.a_rows() - N * kLimbs) * I);
  r.weights.reset(new float[N * r.blocks * kLimbs]);
  r.sums.reset(new float[N * r.blocks]);
  r.on_tiles.reset(new uint8_t[N]);
  std::vector<float> amax(r.blocks);
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * I;
    int8_t* limbs_n = r.limbs.get() + n * kLimbs * I;
    r.on_tiles[n] = block_maxima(xn, I, B, amax.data());
    for (int64_t b = 0; b < r.blocks; ++b) {
      float* w = &r.weights[(n * r.blocks + b) * kLimbs];
      int8_t* limbs = limbs_n + b * B;
      if (!r.on_tiles[n] || amax[b] == 0.0f) {   // integers 0 (the row's tile sums unused)
        for (int l = 0; l < kLimbs; ++l) {
          std::memset(limbs + l * I, 0, B);
          w[l] = 0.0f;
        }
        r.sums[n * r.blocks + b] = 0.0f;
        continue;
      }
      const int e = exponent(amax[b]);   // amax < 2^e
      const int f = e - kKeptBits;
      const float* xb = xn + b * B;
#if defined(SPECJAX_AMX)
      const int64_t sum = e >= -90 ? vector_block(xb, B, -f, limbs, I)   // 2^-f a finite float
                                   : scalar_block(xb, B, -f, limbs, I);
#else
      const int64_t sum = scalar_block(xb, B, -f, limbs, I);
#endif
      for (int l = 0; l < kLimbs; ++l) w[l] = pow2(f + 8 * l);
      // sum * 2^f rounded once: exact in double (|sum| < 2^28, f >= -171).
      if (with_sums)
        r.sums[n * r.blocks + b] = static_cast<float>(static_cast<double>(sum) * pow2d(f));
    }
  }
  return r;
}

struct TiledMatrix {
  const int8_t* tiles;     // [O / 16][I / 4][16][4]
  const float* scale;      // [O / 16][I / B][16]
  const float* offset;     // like scale, or null
  int64_t O, I, B, blocks;
};

// y[n, o] for a row of x that takes the float path: w rebuilt in float32 and
// summed in order of i (NaN and inf propagate as float arithmetic has them).
void float_row(const float* x, const TiledMatrix& w, float* y, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    for (int j = 0; j < kCols; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < w.I; ++i) {
        const int64_t b = i / w.B, s = (g * w.blocks + b) * kCols + j;
        const float q = w.tiles[((g * (w.I / 4) + i / 4) * kCols + j) * 4 + i % 4];
        const float wi = w.offset ? q * w.scale[s] - w.offset[s] : q * w.scale[s];
        acc += wi * x[i];
      }
      y[g * kCols + j] = acc;
    }
  }
}

#if defined(SPECJAX_AMX)

// 64-byte aligned storage for tile stores and vectors.
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const AlignedAllocator&) const { return true; }
  bool operator!=(const AlignedAllocator&) const { return false; }
};

// Block b's sums for every A tile, into c[a_tiles][16][16]: weights in tile TB, limbs in TA,
// the sums alternating between TC0 and TC1 so that one tile's product runs while the
// other's is stored (tile registers are not renamed: a register's next product waits for
// its store). A macro: the intrinsics paste the register numbers into the instructions.
#define SPECJAX_BLOCK_SUMS(NAME, TB, TA, TC0, TC1)                                      \
  inline void NAME(const IntegerRows& x, const int8_t* tile, int64_t b, int32_t* c) {    \
    _tile_loadd(TB, tile, 64);                                                         \
    const int64_t a_tiles = x.a_tiles, R = x.tile_rows;                                \
    const int8_t* limbs = x.limbs.get() + b * x.B;                                    \
    int64_t a = 0;                                                                     \
    for (; a + 2 <= a_tiles; a += 2) {                                                 \
      _tile_zero(TC0);                                                                 \
      _tile_zero(TC1);                                                                 \
      _tile_loadd(TA, limbs + a * R * x.I, x.I);                                       \
      _tile_dpbssd(TC0, TA, TB);                                                       \
      _tile_loadd(TA, limbs + (a + 1) * R * x.I, x.I);                                 \
      _tile_dpbssd(TC1, TA, TB);                                                       \
      _tile_stored(TC0, c + a * R * kCols, 64);                                        \
      _tile_stored(TC1, c + (a + 1) * R * kCols, 64);                                  \
    }                                                                                  \
    if (a < a_tiles) {                                                                 \
      _tile_zero(TC0);                                                                 \
      _tile_loadd(TA, limbs + a * R * x.I, x.I);                                       \
      _tile_dpbssd(TC0, TA, TB);                                                       \
      _tile_stored(TC0, c + a * R * kCols, 64);                                        \
    }                                                                                  \
  }
SPECJAX_BLOCK_SUMS(block_sums_even, 0, 1, 2, 3)
SPECJAX_BLOCK_SUMS(block_sums_odd, 4, 5, 6, 7)
#undef SPECJAX_BLOCK_SUMS

// acc[n] += block b's part of y[n, 16 outputs], from its sums c (see the top).
template <bool kOffset>
inline void add_block(const IntegerRows& x, const TiledMatrix& w, const int32_t* c, int64_t g,
                      int64_t b, __m512* acc) {
  const int64_t s = (g * w.blocks + b) * kCols;
  const __m512 scale = _mm512_loadu_ps(w.scale + s);
  const __m512 offset = kOffset ? _mm512_loadu_ps(w.offset + s) : scale;
  for (int64_t n = 0; n < x.N; ++n) {
    const float* weights = &x.weights[(n * x.blocks + b) * kLimbs];
    const int32_t* cn = c + n * kLimbs * kCols;
    __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cn)),
                             _mm512_set1_ps(weights[0]));
#pragma GCC unroll 4
    for (int l = 1; l < kLimbs; ++l)
      d = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cn + l * kCols)),
                          _mm512_set1_ps(weights[l]), d);
    acc[n] = _mm512_fmadd_ps(scale, d, acc[n]);
    if constexpr (kOffset)
      acc[n] = _mm512_fnmadd_ps(offset, _mm512_set1_ps(x.sums[n * x.blocks + b]), acc[n]);
  }
}

// Output tiles [g0, g1) of y for every row on tiles. Two blocks in flight: block b's tile
// products are issued before block b - 1's sums are added up, in other registers and
// buffers, so the two overlap.
template <bool kOffset>
void tile_rows(const IntegerRows& x, const TiledMatrix& w, float* y, int64_t g0, int64_t g1) {
  const specjax::TileConfig config =
      tile_config(w.B, static_cast<int>(x.tile_rows));
  _tile_loadconfig(&config);
  const int64_t tile_bytes = w.B * kCols;   // one block of 16 outputs
  const int64_t c_size = x.a_rows() * kCols;
  // Buffers kept by each thread from call to call (a call lasts microseconds).
  thread_local std::vector<int32_t, AlignedAllocator<int32_t>> c_buffer;
  thread_local std::vector<__m512, AlignedAllocator<__m512>> acc;
  if (static_cast<int64_t>(c_buffer.size()) < 2 * c_size) c_buffer.resize(2 * c_size);
  if (static_cast<int64_t>(acc.size()) < x.N) acc.resize(x.N);
  int32_t* c[2] = {c_buffer.data(), c_buffer.data() + c_size};
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t n = 0; n < x.N; ++n) acc[n] = _mm512_setzero_ps();
    const int8_t* tiles_g = w.tiles + g * w.I * kCols;
    for (int64_t b = 0; b <= w.blocks; ++b) {
      if (b < w.blocks) {
        const int8_t* tile = tiles_g + b * tile_bytes;
        for (int64_t p = 0; p < tile_bytes; p += 64)
          __builtin_prefetch(tile + kPrefetchBytes + p, 0, 2);
        if (b % 2 == 0) {
          block_sums_even(x, tile, b, c[0]);
        } else {
          block_sums_odd(x, tile, b, c[1]);
        }
      }
      if (b > 0) add_block<kOffset>(x, w, c[(b - 1) % 2], g, b - 1, acc.data());
    }
    for (int64_t n = 0; n < x.N; ++n)
      if (x.on_tiles[n]) _mm512_storeu_ps(y + n * w.O + g * kCols, acc[n]);
  }
  _tile_release();
}

#endif  // SPECJAX_AMX


ffi::Error Run(ffi::ThreadPool pool, const ffi::Buffer<ffi::F32>& x_NxI,
               const ffi::Buffer<ffi::S8>& tiles, const ffi::Buffer<ffi::F32>& scale,
               const ffi::Buffer<ffi::F32>* offset, ffi::ResultBuffer<ffi::F32>& y_NxO) {
#if defined(SPECJAX_AMX)
  const auto xd = x_NxI.dimensions(), td = tiles.dimensions(), sd = scale.dimensions();
  const bool shapes_ok =
      xd.size() == 2 && td.size() == 2 && sd.size() == 2 && td[0] == sd[0] &&
      td[1] == xd[1] * kCols && sd[1] % kCols == 0 && sd[1] > 0 &&
      xd[1] % (sd[1] / kCols) == 0 &&
      (xd[1] / (sd[1] / kCols) == 16 || xd[1] / (sd[1] / kCols) == 32) &&
      (offset == nullptr || std::equal(offset->dimensions().begin(), offset->dimensions().end(),
                                       sd.begin(), sd.end()));
  if (!shapes_ok) {
    return ffi::Error::InvalidArgument(
        "q8_amx: expected x[N, I], tiles[O / 16, I * 16], scale[O / 16, I / B * 16] "
        "(and offset like scale), B 16 or 32");
  }
  if (!specjax::amx_usable()) {
    return ffi::Error::Internal("q8_amx: this CPU or OS does not let the process use AMX "
                                "(check specjax_q8_amx_supported first)");
  }
  const int64_t N = xd[0], I = xd[1], G = td[0], blocks = sd[1] / kCols;
  const TiledMatrix w{tiles.typed_data(), scale.typed_data(),
                      offset ? offset->typed_data() : nullptr, G * kCols, I, I / blocks, blocks};
  if (N == 0 || G == 0) return ffi::Error::Success();
  const float* x = x_NxI.typed_data();
  float* y = y_NxO->typed_data();
  const auto rows = std::make_shared<IntegerRows>(to_integers(x, N, I, w.B, w.offset != nullptr));
  // About two chunks a thread: each chunk loads the tile configuration and its buffers once.
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per_chunk = std::max<int64_t>(4, (G + 2 * threads - 1) / (2 * threads));
  specjax::run_row_chunks(pool, G, per_chunk, [=](int64_t g0, int64_t g1) {
    if (w.offset) {
      tile_rows<true>(*rows, w, y, g0, g1);
    } else {
      tile_rows<false>(*rows, w, y, g0, g1);
    }
    for (int64_t n = 0; n < N; ++n)
      if (!rows->on_tiles[n]) float_row(x + n * I, w, y + n * w.O, g0, g1);
  });
  return ffi::Error::Success();
#else
  (void)pool, (void)x_NxI, (void)tiles, (void)scale, (void)offset, (void)y_NxO;
  return ffi::Error::Internal("q8_amx: this build has no AMX-INT8 (see "
                              "specjax_q8_amx_supported)");
#endif
}

ffi::Error Q8AmxMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI,
                       ffi::Buffer<ffi::S8> tiles, ffi::Buffer<ffi::F32> scale,
                       ffi::ResultBuffer<ffi::F32> y_NxO) {
  return Run(pool, x_NxI, tiles, scale, nullptr, y_NxO);
}

ffi::Error Q8AmxOffsetMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxI,
                             ffi::Buffer<ffi::S8> tiles, ffi::Buffer<ffi::F32> scale,
                             ffi::Buffer<ffi::F32> offset, ffi::ResultBuffer<ffi::F32> y_NxO) {
  return Run(pool, x_NxI, tiles, scale, &offset, y_NxO);
}

ffi::Error Supported(ffi::ResultBuffer<ffi::S32> out) {
#if defined(SPECJAX_AMX)
  *out->typed_data() = specjax::amx_usable() ? 1 : 0;
#else
  *out->typed_data() = 0;
#endif
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_amx_matmul_f32, Q8AmxMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_amx_offset_matmul_f32, Q8AmxOffsetMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_q8_amx_supported, Supported,
                              ffi::Ffi::Bind().Ret<ffi::Buffer<ffi::S32>>());
