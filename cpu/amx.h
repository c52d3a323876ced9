// What the AMX kernels share (cpu/expert_kernels_amx.cpp: AMX-INT8 experts; cpu/bf16_gemv_amx.cpp:
// AMX-BF16 GEMV): the tile configuration that _tile_loadconfig reads, and whether this process
// may use the tiles at all.
#pragma once
#include <cstdint>

namespace strata::cpu::detail {

// The 64-byte operand of LDTILECFG (palette 1: per tile, rows and bytes per row).
struct alignas(64) TileConfig {
  uint8_t palette = 0;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Whether the CPU has AMX-INT8 and the OS lets this process use tile data (Linux: granted by
// arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) on the first call).
bool amx_ready();

}  // namespace strata::cpu::detail
