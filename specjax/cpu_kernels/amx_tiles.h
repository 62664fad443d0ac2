// Intel AMX (Sapphire Rapids and later Xeons) for specjax's CPU kernels: whether
// the process may use it, and the tile configuration record.
//
// A process must ask Linux for the tile data state once (arch_prctl
// ARCH_REQ_XCOMP_PERM) before its first tile instruction; a thread must load
// a configuration (ldtilecfg) before using tiles and should release them
// after (tilerelease), so that a context switch need not save 8 KB of tiles.
// Tile register numbers are pasted into the instructions: they must be
// literal constants at each intrinsic.

#ifndef SPECJAX_CPU_KERNELS_AMX_TILES_H_
#define SPECJAX_CPU_KERNELS_AMX_TILES_H_

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && \
    defined(__AVX512VBMI__) && defined(__linux__)
#define SPECJAX_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace specjax {

inline bool cpu_has_amx_int8() {
  unsigned eax, ebx, ecx, edx;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
  return ((edx >> 24) & 1) && ((edx >> 25) & 1);   // AMX-TILE, AMX-INT8
}

// Whether this CPU has AMX-INT8 and the OS granted this process the tile state.
inline bool amx_usable() {
  static const bool usable = [] {
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    return cpu_has_amx_int8() &&
           syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

// ldtilecfg's 64-byte record, palette 1: each register's rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  void set(int tile, int num_rows, int bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(num_rows);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }
};

}  // namespace specjax

#endif  // AMX

#endif  // SPECJAX_CPU_KERNELS_AMX_TILES_H_
